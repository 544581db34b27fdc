"""Processes that print their own name (``trainer_resume.processes.names.this_process``).

The script loads ``processes/names.py`` alone (it imports nothing of the package), so a
process that prints its name starts in milliseconds, without importing torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import trainer_resume

_PROCESSES = Path(trainer_resume.__file__).parent / "processes" / "names.py"
NAME_SCRIPT = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("names", {str(_PROCESSES)!r})
names = importlib.util.module_from_spec(spec)
spec.loader.exec_module(names)
print(json.dumps(names.this_process()), flush=True)
"""
# A lock holder that is no writer: it flocks the file argv[1], prints its name and
# waits for its stdin to close.
FLOCK_SCRIPT = (
    NAME_SCRIPT.replace(
        "print(",
        "import fcntl, os\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint(",
    )
    + "sys.stdin.read()\n"
)


def named_child(*arguments: str, script: str = NAME_SCRIPT) -> tuple[subprocess.Popen[str], Any]:
    """Start ``script``; the process and the name it printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return child, json.loads(child.stdout.readline())


def name_of_an_ended_process() -> Any:
    """The name of a process that has run and been reaped: it names no process now."""
    child, name = named_child()
    child.communicate(timeout=60)
    return name
