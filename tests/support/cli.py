"""Run the installed ``trainer-resume`` console script in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("trainer-resume")
TESTS = Path(__file__).resolve().parent.parent


def run_cli(*arguments: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real console script next to this interpreter, so the entry point is tested too.

    The timeout only bounds a hang: on a loaded machine starting the interpreter and
    importing torch alone has taken more than 60 s.
    """
    environment = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="100")
    return subprocess.run(
        [str(SCRIPT), *arguments],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
