"""The public names of the sharded package and the Lightning, Fabric and transformers adapters
are names the docs use."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOCS = "\n".join(
    page.read_text(encoding="utf-8")
    for page in sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
)


@pytest.mark.parametrize(
    "module",
    [
        "trainer_resume.sharded",
        "trainer_resume.adapters.lightning",
        "trainer_resume.adapters.fabric",
        "trainer_resume.adapters.transformers",
    ],
)
def test_every_public_name_of_the_module_is_named_in_the_docs(module):
    names = importlib.import_module(module).__all__
    unnamed = [name for name in names if not re.search(rf"`[^`]*\b{name}\b[^`]*`", DOCS)]
    assert not unnamed, f"{module}.__all__ names what docs/ never does: {unnamed}"
