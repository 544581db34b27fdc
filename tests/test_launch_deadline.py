"""A launched job that outlives its deadline fails the test with its output, and every
process it started is killed, also those in sessions of their own (as torch elastic
starts each rank): a hang neither loses what the job printed nor leaves processes behind.
Both launchers of the tests: ``torchrun.run`` and ``lightning_procs.run``."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import lightning_procs, process_tree, torchrun

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

JOB = textwrap.dedent(
    """
    import subprocess, sys, time
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    open(sys.argv[1], "w").write(str(rank.pid))
    print("rank started", flush=True)
    print("rank started", file=sys.stderr, flush=True)
    time.sleep(600)
    """
)


def _assert_ended(pid_file: Path) -> None:
    rank = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while not process_tree.ended(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_tree.ended(rank)


def test_a_torchrun_job_past_its_deadline_fails_with_its_output_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "rank.pid"
    with pytest.raises(AssertionError, match="did not end in 3 s:\nrank started"):
        torchrun.run([sys.executable, "-c", JOB, str(pid_file)], dict(os.environ), timeout=3)
    _assert_ended(pid_file)


def test_a_child_run_past_its_deadline_fails_with_its_stderr_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "rank.pid"
    command = [sys.executable, "-c", JOB, str(pid_file)]
    with pytest.raises(AssertionError, match="did not end in 3 s; stderr:\nrank started"):
        lightning_procs.run(command, tmp_path / "log.txt", timeout=3)
    _assert_ended(pid_file)
