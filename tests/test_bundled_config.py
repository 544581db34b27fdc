"""One demo config: the top-level configs/demo.yaml is the file the package ships."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from trainer_resume.example import default_config_text

ROOT = Path(__file__).resolve().parent.parent


def test_top_level_demo_config_is_the_packaged_one():
    packaged = (resources.files("trainer_resume") / "configs" / "demo.yaml").read_bytes()
    assert (ROOT / "configs" / "demo.yaml").read_bytes() == packaged
    assert default_config_text().encode("utf-8") == packaged
