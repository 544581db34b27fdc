"""Launch a ``support`` child under ``torchrun`` on one machine, as users launch a job:
in a session of its own (a signal to the job reaches torchrun and its ranks), with a
deadline after which every process it started is killed, the ranks too (torch elastic
starts each in a session of its own).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from typing import IO

from support.lightning_procs import TESTS, TIMEOUT_S
from support.process_tree import kill_tree

READY = b"READY"


def environment(**extra: str) -> dict[str, str]:
    """The children's environment: the tests folder on PYTHONPATH (they import
    ``support.<module>``), unbuffered output, one thread per rank, and ``extra``."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)


def command(
    child: str, *arguments: str, ranks: int = 2, max_restarts: int | None = None
) -> list[str]:
    """``python -m torch.distributed.run --standalone ... -m CHILD ARGUMENTS``."""
    restarts = [] if max_restarts is None else ["--max-restarts", str(max_restarts)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        *restarts,
        "-m",
        child,
        *arguments,
    ]


def start(launch: list[str], env: dict[str, str], output: int | IO[bytes]) -> subprocess.Popen:
    """Start ``launch`` in a session of its own, its stdout and stderr to ``output``."""
    return subprocess.Popen(
        launch,
        cwd=TESTS,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_if_running(process: subprocess.Popen) -> None:
    """SIGKILL the job if it is still running: its session and every process below it,
    whatever session they are in."""
    kill_tree(process, session=True)


def run(
    launch: list[str], env: dict[str, str], *, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``launch`` to its end (every process holding its output included); its exit
    status and output (stdout and stderr together) as ``stdout``.

    Raises:
        AssertionError: it did not end within ``timeout`` seconds; every process it
            started is killed first and the message holds the end of its output.
    """
    process = start(launch, env, subprocess.PIPE)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_if_running(process)
        output, _ = process.communicate(timeout=60)
        text = output.decode(errors="replace")[-6000:]
        raise AssertionError(
            f"{' '.join(launch[1:])} did not end in {timeout} s:\n{text}"
        ) from None
    finally:
        kill_if_running(process)
    return subprocess.CompletedProcess(launch, process.returncode, output.decode(errors="replace"))


def run_signalled(
    launch: list[str], env: dict[str, str], *, signal_when_ready: bool
) -> tuple[int, bytes]:
    """Run ``launch`` to its end; its exit status and output.

    ``signal_when_ready``: once a rank prints ``READY``, SIGTERM the job's process group
    (torchrun and its ranks, as a batch scheduler does). A job that ends without printing
    it is waited for as it is: the caller tells from the output whether it came.
    """
    process = start(launch, env, subprocess.PIPE)
    output = b""
    try:
        assert process.stdout is not None
        if signal_when_ready:
            selector = selectors.DefaultSelector()
            selector.register(process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + TIMEOUT_S
            while READY not in output:
                remaining = deadline - time.monotonic()
                assert remaining > 0, output.decode(errors="replace")[-3000:]
                if selector.select(timeout=min(remaining, 1.0)):
                    chunk = os.read(process.stdout.fileno(), 65536)
                    if not chunk:  # it ended without READY
                        break
                    output += chunk
            if READY in output:
                os.killpg(process.pid, signal.SIGTERM)
        try:
            rest, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_if_running(process)
            rest, _ = process.communicate(timeout=60)
            text = (output + rest).decode(errors="replace")[-6000:]
            raise AssertionError(f"the job did not end in {TIMEOUT_S} s:\n{text}") from None
        output += rest
    finally:
        kill_if_running(process)
    return process.returncode, output
