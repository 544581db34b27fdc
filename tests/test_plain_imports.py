"""Tests and benchmarks import plainly: pytest's pythonpath and ``python -m benchmarks...``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A relative import in tests/ (not a package) always fails; sys.path edits hide how
# modules are found. Test helpers come from pytest's pythonpath (pyproject.toml).
FORBIDDEN = re.compile(
    r"^\s*(from \. import |from \.\w|sys\.path\.(insert|append)\()", re.MULTILINE
)


def test_tests_and_benchmarks_have_no_relative_import_fallbacks_or_sys_path_edits():
    offenders = [
        f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
        for folder in ("tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for match in FORBIDDEN.finditer(text)
    ]
    assert not offenders, f"import plainly instead: {offenders}"


def test_benchmarks_import_their_siblings_through_the_benchmarks_package():
    # ``python -m benchmarks.x`` puts the root, not benchmarks/, on sys.path: a bare
    # ``from pause import ...`` fails there (also inside a function, found only when run).
    siblings = {path.stem for path in (ROOT / "benchmarks").glob("*.py")} - {"__init__"}
    bare = re.compile(
        rf"^\s*(from ({'|'.join(sorted(siblings))}) import |import ({'|'.join(sorted(siblings))})\b)",
        re.MULTILINE,
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
        for path in sorted((ROOT / "benchmarks").rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for match in bare.finditer(text)
    ]
    assert not offenders, f"import as benchmarks.<module>: {offenders}"
