"""Child processes of the S3 tests (started from a fork server): each sets the S3 server's
environment it is given, works in the folder it is given, and trains a TinyTrainer."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from support.point_trainers import points_trainer
from support.trainers import TinyTrainer

DEADLINE_S = 300.0  # a hang detector: the parent signals or kills long before


class BlobTrainer(TinyTrainer):
    """A TinyTrainer whose extra state carries ``blob``, a tensor of any size."""

    def __init__(self) -> None:
        self.blob = torch.empty(0, dtype=torch.uint8)
        super().__init__()

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"position": self.position, "blob": self.blob}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.position, self.blob = state["position"], state["blob"]


def _enter(environment: dict[str, str], workdir: str) -> None:
    os.environ.update(environment)
    os.chdir(workdir)
    torch.set_num_threads(1)


def _announce(path: str, text: str) -> None:
    with open(path + ".partial", "w") as out:
        out.write(text)
    os.replace(path + ".partial", path)


def pause_on_sigterm(environment: dict[str, str], workdir: str, url: str) -> None:
    """Train with ``pause_on_signal(url)``; say ``ready`` after 3 steps; stop once paused."""
    _enter(environment, workdir)
    trainer = TinyTrainer()
    trainer.pause_on_signal(url)
    for _ in range(3):
        trainer.train_step()
    _announce("ready", str(trainer.completed_steps))
    deadline = time.monotonic() + DEADLINE_S
    while not trainer.paused:
        trainer.train_step()
        if time.monotonic() > deadline:
            os._exit(3)
    _announce("paused", str(trainer.completed_steps))


def big_pause(environment: dict[str, str], workdir: str, url: str, blob_bytes: int) -> None:
    """Pause at step 2 (small), then at step 3 with a ``blob_bytes`` random blob (killed
    by the parent while that one uploads)."""
    _enter(environment, workdir)
    trainer = BlobTrainer()
    trainer.train_step(), trainer.train_step()
    trainer.pause(url)
    trainer.resume(url)
    trainer.train_step()
    # Random bytes, so nothing on the way could shrink them; one 4 MiB block repeated, since
    # drawing 800 MB one by one takes seconds.
    generator = torch.Generator().manual_seed(5)
    block = torch.randint(0, 256, (4 << 20,), dtype=torch.uint8, generator=generator)
    assert blob_bytes % block.numel() == 0, "the blob is a whole number of blocks"
    trainer.blob = block.repeat(blob_bytes // block.numel())
    _announce("uploading", "3")
    trainer.pause(url)
    os._exit(4)  # the parent should have killed this process mid-upload


def points_until_killed(environment: dict[str, str], workdir: str, url: str) -> None:
    """Take points every 2 steps at ``url``; say ``ready`` once step 6's is durable; go on."""
    _enter(environment, workdir)
    trainer = points_trainer(url, every_steps=2, keep=2, when_busy="wait")
    for _ in range(6):
        trainer.train_step()
    trainer.points.latest.wait(60)
    _announce("ready", str(trainer.completed_steps))
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        trainer.train_step()
    os._exit(3)
