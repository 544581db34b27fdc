"""Start ``_lightning_child.py`` runs and signal them at a printed line, with deadlines."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = Path(__file__).with_name("_lightning_child.py")
TIMEOUT_S = 120.0


def child_command(mode: str, out: Path, *args: str) -> list[str]:
    return [sys.executable, str(CHILD), mode, str(out), *args]


def _environment() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def run(command: list[str], log: Path, *, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run to completion; stdout is returned, stderr goes to ``log``."""
    with open(log, "w") as errors:
        return subprocess.run(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, timeout=timeout, env=_environment()
        )


def run_and_signal(
    command: list[str], log: Path, *, line: str, signum: int, timeout: float = TIMEOUT_S
) -> tuple[int, list[str]]:
    """Run ``command``, send ``signum`` when it prints ``line``, wait for it to exit.

    Returns:
        The exit status (negative: killed by that signal) and the stdout lines.

    Raises:
        AssertionError: the line never came or the process outlived the deadline
            (it is killed first).
    """
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    sent = False
    with open(log, "w") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=_environment())
        try:
            assert process.stdout is not None
            selector = selectors.DefaultSelector()
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{command[2]} run passed its deadline; stdout so far: {lines[-5:]}")
                if not selector.select(timeout=min(remaining, 1.0)):
                    continue
                text = process.stdout.readline()
                if not text:
                    break
                lines.append(text.rstrip("\n"))
                if not sent and lines[-1] == line:
                    process.send_signal(signum)
                    sent = True
            status = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    if not sent:
        raise AssertionError(f"{line!r} never appeared; exit {status}; stderr in {log}:\n{_tail(log)}")
    return status, lines


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def describe_failure(process: subprocess.CompletedProcess[str], log: Path) -> str:
    return f"exit {process.returncode}; stdout tail: {process.stdout.splitlines()[-5:]}\nstderr:\n{_tail(log)}"


SIGTERM = signal.SIGTERM
SIGKILL = signal.SIGKILL
