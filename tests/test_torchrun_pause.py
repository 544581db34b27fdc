"""Under ``torchrun``, a SIGTERM to the job's process group pauses every rank cleanly, and
``torchrun`` itself exits 1: its elastic agent turns the SIGTERM it receives into a
``SignalException``, stops the workers (they pause and exit 0) and re-raises it. A
requeue script therefore tells "paused" from "failed" by the files, as
docs/distributed.md says: a verified pause file written after the job started."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support import torchrun

from trainer_resume import run_finished
from trainer_resume.durable import load_checkpoint


@pytest.mark.slow
def test_torchrun_exits_1_after_a_clean_pause_of_every_rank(tmp_path: Path) -> None:
    started = time.time()
    # Its own process group, as a batch job: the signal goes to torchrun and the ranks.
    code, output = torchrun.run_signalled(
        torchrun.command("support.torchrun_child", str(tmp_path)),
        torchrun.environment(),
        signal_when_ready=True,
    )
    assert torchrun.READY in output, output.decode(errors="replace")[-3000:]
    text = output.decode(errors="replace")
    assert code == 1, text[-3000:]
    assert "SignalException" in text  # the agent's own re-raised signal, not a rank's failure
    steps = {(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)}
    assert steps == {"paused at 4"}, text[-3000:]
    pause = tmp_path / "pause.ckpt"
    assert load_checkpoint(pause)["completed_steps"] == 4  # verified
    assert os.path.getmtime(pause) >= started and run_finished(pause) is None
