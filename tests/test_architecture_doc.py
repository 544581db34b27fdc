"""ARCHITECTURE.md draws the package as it is: every module has its paragraph."""

from __future__ import annotations

from pathlib import Path

import trainer_resume

PACKAGE = Path(trainer_resume.__file__).resolve().parent
ARCHITECTURE = Path(__file__).resolve().parent.parent / "ARCHITECTURE.md"


def test_every_module_of_the_package_is_described_in_architecture_md():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    modules = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))]
    missing = [module for module in modules if f"`{module}`" not in text]
    assert not missing, f"describe these modules in ARCHITECTURE.md: {missing}"
