"""examples/dali_quickstart.py runs on the CPU and resumes bit-identically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "nvidia.dali.plugin.pytorch",
    reason="NVIDIA DALI cannot be imported here (pip install 'trainer-resume[dali]')",
)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dali_quickstart.py"


@pytest.mark.slow
def test_the_dali_quickstart_resumes_after_sigterm_bit_identically(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "paused after step 11: True" in lines, result.stdout
    assert lines[-1] == "bit-identical: yes", result.stdout
