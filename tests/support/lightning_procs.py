"""Start ``support.lightning_child`` runs and signal them at a printed line, with deadlines."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.process_tree import kill_tree

# The children run as ``python -m support.<module>`` and import their siblings as
# ``support.<module>``: the tests folder goes first on their PYTHONPATH.
TESTS = Path(__file__).resolve().parent.parent
# A hang detector, not a speed check: a child run takes seconds on an idle machine, but
# minutes on a loaded 2-core one (load average 20 seen), where 120 s failed runs that
# were only slow.
TIMEOUT_S = 600.0


def child_command(
    mode: str, out: Path, *args: str, child: str = "support.lightning_child"
) -> list[str]:
    return [sys.executable, "-m", child, mode, str(out), *args]


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return dict(
        os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=path, **(extra or {})
    )


def run(
    command: list[str],
    log: Path,
    *,
    timeout: float = TIMEOUT_S,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run to completion; stdout is returned, stderr goes to ``log``.

    ``env`` adds variables to the child's environment; ``cwd`` is its working directory.

    Raises:
        AssertionError: it outlived ``timeout`` (it and every process it started are
            killed first).
    """
    with open(log, "w") as errors:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=_environment(env),
            cwd=cwd,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(process)
            process.communicate(timeout=60)
            raise AssertionError(
                f"{command[2]} run did not end in {timeout} s; stderr:\n{_tail(log)}"
            ) from None
        finally:
            kill_tree(process)
    return subprocess.CompletedProcess(command, process.returncode, output)


def run_and_signal(
    command: list[str],
    log: Path,
    *,
    line: str,
    signum: int,
    timeout: float = TIMEOUT_S,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    times: int = 1,
) -> tuple[int, list[str]]:
    """Run ``command``, send ``signum`` when it prints ``line``, wait for it to exit.

    With ``times`` > 1, the signal goes at each of the first ``times`` prints of ``line``
    (one per job of a sweep that runs its jobs one after another); ``env`` and ``cwd``
    as :func:`run`.

    Returns:
        The exit status (negative: killed by that signal) and the stdout lines.

    Raises:
        AssertionError: the line never came or the process outlived the deadline
            (it is killed first).
    """
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    sent = 0
    with open(log, "w") as errors:
        # Binary stdout read with os.read on the descriptor, never through a buffered
        # reader: readline() may pull several lines into its buffer at once, and select()
        # would then wait on an empty pipe while the awaited line sits unread in that
        # buffer until the child gives up and exits.
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, env=_environment(env), cwd=cwd
        )
        try:
            assert process.stdout is not None
            descriptor = process.stdout.fileno()
            selector = selectors.DefaultSelector()
            selector.register(descriptor, selectors.EVENT_READ)
            partial = b""
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{command[2]} run passed its deadline; stdout so far: {lines[-5:]}"
                    )
                if not selector.select(timeout=min(remaining, 1.0)):
                    continue
                chunk = os.read(descriptor, 65536)
                if not chunk:
                    break
                *complete, partial = (partial + chunk).split(b"\n")
                for raw in complete:
                    lines.append(raw.decode(errors="replace"))
                    if sent < times and lines[-1] == line:
                        process.send_signal(signum)
                        sent += 1
            if partial:
                lines.append(partial.decode(errors="replace"))
            status = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            kill_tree(process)  # a child that started others (a DDP rank 1) with them
    if sent < times:
        raise AssertionError(
            f"{line!r} appeared {sent} of {times} times; {describe_exit(status, lines, log)}"
        )
    return status, lines


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def describe_exit(status: int, lines: list[str], log: Path) -> str:
    """The exit status, the last stdout lines and the stderr tail of a finished run."""
    return f"exit {status}; stdout tail: {lines[-5:]}\nstderr:\n{_tail(log)}"


def describe_failure(process: subprocess.CompletedProcess[str], log: Path) -> str:
    return f"exit {process.returncode}; stdout tail: {process.stdout.splitlines()[-5:]}\nstderr:\n{_tail(log)}"


SIGTERM = signal.SIGTERM
SIGKILL = signal.SIGKILL
