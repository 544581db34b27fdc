"""Under ``torchrun``, a SIGTERM to the job's process group pauses every rank cleanly, and
``torchrun`` itself exits 1: its elastic agent turns the SIGTERM it receives into a
``SignalException``, stops the workers (they pause and exit 0) and re-raises it. A
requeue script therefore tells "paused" from "failed" by the files, as
docs/distributed.md says: a verified pause file written after the job started."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.lightning_procs import TESTS, TIMEOUT_S

from trainer_resume import run_finished
from trainer_resume.durable import load_checkpoint


@pytest.mark.slow
def test_torchrun_exits_1_after_a_clean_pause_of_every_rank(tmp_path: Path) -> None:
    started = time.time()
    environment = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "support.torchrun_child",
        str(tmp_path),
    ]
    # Its own process group, as a batch job: the signal goes to torchrun and the ranks.
    process = subprocess.Popen(
        command,
        cwd=TESTS,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = b""
    try:
        assert process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + TIMEOUT_S
        while b"READY" not in output:
            remaining = deadline - time.monotonic()
            assert remaining > 0, output.decode(errors="replace")[-3000:]
            if selector.select(timeout=min(remaining, 1.0)):
                chunk = os.read(process.stdout.fileno(), 65536)
                assert chunk, output.decode(errors="replace")[-3000:]
                output += chunk
        os.killpg(process.pid, signal.SIGTERM)
        rest, _ = process.communicate(timeout=TIMEOUT_S)
        output += rest
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    text = output.decode(errors="replace")
    assert process.returncode == 1, text[-3000:]
    assert "SignalException" in text  # the agent's own re-raised signal, not a rank's failure
    steps = {(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)}
    assert steps == {"paused at 4"}, text[-3000:]
    pause = tmp_path / "pause.ckpt"
    assert load_checkpoint(pause)["completed_steps"] == 4  # verified
    assert os.path.getmtime(pause) >= started and run_finished(pause) is None
