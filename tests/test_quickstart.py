"""The README's quickstart is examples/quickstart.py, and it runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.py"


def test_readme_quickstart_is_the_example_file_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert QUICKSTART.read_text() in blocks


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
