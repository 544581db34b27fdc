"""A training process killed with SIGKILL during pause() loses nothing."""

from __future__ import annotations

import multiprocessing
import random
import signal
import time

import pytest
import torch
from support.trainers import TinyTrainer, pause_repeatedly, wide_config

from trainer_resume.durable import load_checkpoint


def wait_for(path, child, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert child.is_alive(), f"child exited early with code {child.exitcode}"
        assert time.monotonic() < deadline, "child never wrote its first pause file"
        time.sleep(0.01)


@pytest.mark.slow
def test_sigkill_during_pause_leaves_the_previous_file_resumable_and_exact(tmp_path):
    path = tmp_path / "pause.ckpt"
    delays = random.Random(4)
    context = multiprocessing.get_context("spawn")
    for trial in range(2):
        ready = tmp_path / f"ready-{trial}"
        # The child loops step -> pause -> resume; most of its time is spent inside pause().
        child = context.Process(target=pause_repeatedly, args=(str(path), str(ready)))
        child.start()
        try:
            wait_for(ready, child)
            time.sleep(delays.uniform(0.05, 0.8))
        finally:
            child.kill()
            child.join(30)
        assert child.exitcode == -signal.SIGKILL

        checkpoint = load_checkpoint(path)
        paused_at = checkpoint["completed_steps"]
        assert paused_at >= 1
        resumed = TinyTrainer(wide_config())
        resumed.resume(path)
        losses = [resumed.train_step() for _ in range(2)]

        reference = TinyTrainer(wide_config())
        expected = [reference.train_step() for _ in range(paused_at + 2)][paused_at:]
        assert all(torch.equal(a, b) for a, b in zip(expected, losses)), (trial, paused_at)
        for name, value in reference.model.state_dict().items():
            assert torch.equal(value, resumed.model.state_dict()[name]), (trial, name)
