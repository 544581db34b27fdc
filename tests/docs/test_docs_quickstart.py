"""The README's quickstart is an excerpt of examples/quickstart.py, and the example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def readme_quickstart_lines() -> list[str]:
    """The code lines of the README's quickstart block, without blanks and ``...`` elisions."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Quickstart\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section, "README.md has no Quickstart section"
    blocks = re.findall(r"```python\n(.*?)```", section.group(1), flags=re.S)
    assert len(blocks) == 1, "the README's Quickstart section should hold one python block"
    return [line.strip() for line in blocks[0].splitlines() if line.strip() not in ("", "...")]


def test_readme_quickstart_lines_appear_in_the_example_in_the_same_order():
    example = [line.strip() for line in QUICKSTART.read_text(encoding="utf-8").splitlines()]
    position = 0
    for line in readme_quickstart_lines():
        assert line in example[position:], (
            f"README quickstart line {line!r} is not in examples/quickstart.py "
            f"(after line {position} of the example)"
        )
        position = example.index(line, position) + 1


def test_readme_quickstart_links_the_example():
    assert "](examples/quickstart.py)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_quickstart_resumes_after_sigterm_bit_identically(tmp_path):
    result = subprocess.run(
        [sys.executable, str(QUICKSTART)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # SIGTERM right after step 25: the pause is written at a step boundary, never inside a step.
    assert any(re.fullmatch(r"paused after step 2[56]: True", line) for line in lines), (
        result.stdout
    )
    assert lines[-1] == "bit-identical: yes"
