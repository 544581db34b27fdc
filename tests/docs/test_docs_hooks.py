"""The hook table of docs/trainer.md lists every underscored name a trainer inherits from the mixin."""

from __future__ import annotations

import re
from pathlib import Path

from trainer_resume.mixin import TrainingResumeMixin

TRAINER_PAGE = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"


def _hook_table_names() -> set[str]:
    lines = TRAINER_PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("| hook | returns / does |")
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first_column = line.split("|")[1]
        names.update(re.findall(r"`(_\w+)", first_column))
    return names


def _inherited_underscored_names() -> set[str]:
    return {
        name
        for klass in TrainingResumeMixin.__mro__
        if klass is not object
        for name in vars(klass)
        if name.startswith("_") and not name.startswith("__")
    }


def test_every_underscored_name_of_the_mixin_is_a_documented_hook():
    undocumented = _inherited_underscored_names() - _hook_table_names()
    assert not undocumented, (
        f"add these to the hook table of docs/trainer.md or move them out of the class: {undocumented}"
    )


def test_the_hook_table_names_only_what_the_mixin_has():
    assert _hook_table_names() <= _inherited_underscored_names()
