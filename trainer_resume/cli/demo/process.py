"""Run one demo phase in a subprocess and follow its step reports.

The child (``python -m trainer_resume.cli.demo.worker``) prints one protocol line per
event on stdout (``step N``, ``paused N``, ``done N``); everything else it writes
goes to its stderr, kept in a log file that is shown when the phase fails.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DemoPhaseError", "PhaseResult", "run_phase"]

# A phase that reports nothing for this long is stuck (a step takes well under a second).
STALL_TIMEOUT_S = 300.0


class DemoPhaseError(Exception):
    """A training subprocess failed, stalled or did not do what the phase expects."""


@dataclass
class PhaseResult:
    """What a child reported and how long it ran."""

    steps: list[int] = field(default_factory=list)
    paused_at: int | None = None
    done_at: int | None = None
    signal_after: int | None = None  # the last step reported before SIGTERM was sent
    seconds: float = 0.0


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _log_tail(log: Path, count: int = 25) -> str:
    try:
        text = log.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-count:])


def run_phase(
    arguments: list[str],
    *,
    log: Path,
    on_step: Callable[[int], None],
    sigterm_after: int | None = None,
) -> PhaseResult:
    """Run the worker with ``arguments`` and wait for it.

    Args:
        arguments: the worker's command-line arguments.
        log: file that receives the child's stderr.
        on_step: called with each completed step number (progress).
        sigterm_after: send a real SIGTERM once this step is reported.

    Raises:
        DemoPhaseError: non-zero exit, a stall, or a malformed report.
    """
    command = [sys.executable, "-m", "trainer_resume.cli.demo.worker", *arguments]
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    result = PhaseResult()
    start = time.perf_counter()
    with open(log, "w") as errors:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=environment
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(child.stdout, lines), daemon=True).start()
        try:
            while True:
                try:
                    line = lines.get(timeout=STALL_TIMEOUT_S)
                except queue.Empty:
                    raise DemoPhaseError(f"no progress for {STALL_TIMEOUT_S:.0f} s") from None
                if line is None:
                    break
                kind, _, value = line.strip().partition(" ")
                if kind == "step":
                    step = int(value)
                    result.steps.append(step)
                    on_step(step)
                    if (
                        sigterm_after is not None
                        and result.signal_after is None
                        and step >= sigterm_after
                    ):
                        child.send_signal(signal.SIGTERM)
                        result.signal_after = step
                elif kind == "paused":
                    result.paused_at = int(value)
                elif kind == "done":
                    result.done_at = int(value)
            status = child.wait(timeout=STALL_TIMEOUT_S)
        except BaseException:
            child.kill()
            child.wait()
            raise
    result.seconds = time.perf_counter() - start
    if status != 0:
        how = f"signal {-status}" if status < 0 else f"status {status}"
        raise DemoPhaseError(
            f"the training subprocess exited with {how}; its log ({log}):\n{_log_tail(log)}"
        )
    return result
