"""The epoch loop of docs/data-loading.md with fork workers and resume points, killed mid-step.

``python -m support.elastic_child OUT [KILL_RANK KILL_STEP]`` (tests/ on ``PYTHONPATH``),
under ``torchrun`` (DDP over gloo, one process per rank) or alone (one process, no
process group). Each process resumes from the newest resume point in ``OUT/points``
(``resume_latest()`` at start), then trains ``EPOCHS`` epochs of a ``ShardedBatchSampler``
over torch's ``BatchSampler(RandomSampler)`` read by two ``fork`` workers, with a
per-epoch scheduler step as the epoch-end work, a point every ``POINT_EVERY`` steps and
SIGTERM armed to pause into the points directory.

In the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0 or unset) the rank ``KILL_RANK``
SIGKILLs itself inside step ``KILL_STEP``, after its backward pass and before the
optimizer step, while the epoch's workers (forked after the first point took the
directory's lock) are alive. Every process writes, per attempt:

* ``OUT/start_a<attempt>_r<rank>.txt``: the step it resumed at (0 for a fresh start);
* ``OUT/losses_a<attempt>_r<rank>.pt``: ``{step: loss}``, replaced after every step;
* ``OUT/pids_a<attempt>_r<rank>.txt``: its own pid, then the pids of the epoch's workers;
* ``OUT/result_a<attempt>_r<rank>.pt`` at the end: the model, optimizer and scheduler
  states, the loader state, the steps and the next draws of the three generators.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, RandomSampler

from support.ddp_workers import COLLECTIVE_TIMEOUT, FEATURES, IdDataset
from support.gloo_fork import FORK_HANGS_UNDER_GLOO
from trainer_resume import ResumePoints
from trainer_resume.loaders import ResumableDataLoader, ShardedBatchSampler
from trainer_resume.mixin import TrainingResumeMixin, training_step
from trainer_resume.testing import first_difference

EPOCHS = 3
BATCH = 2  # per rank
POINT_EVERY = 4
CONFIG = {"model": "elastic-epoch-loop", "batch": BATCH, "points": POINT_EVERY}


class EpochLoopTrainer(TrainingResumeMixin):
    """Dropout, AdamW, a per-epoch StepLR and a sharded epoch loader with two fork workers."""

    def __init__(self, points: ResumePoints, rank: int) -> None:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        self.module = nn.Sequential(
            nn.Linear(FEATURES, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 1)
        )
        distributed = dist.is_available() and dist.is_initialized()
        self.model = DistributedDataParallel(self.module) if distributed else self.module
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=0.05)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)
        dataset = IdDataset()
        epochs = BatchSampler(
            RandomSampler(dataset, generator=torch.Generator().manual_seed(11)),
            batch_size=BATCH,
            drop_last=False,
        )
        self.loader = ResumableDataLoader(
            dataset,
            batch_sampler=ShardedBatchSampler(epochs),
            num_workers=2,
            multiprocessing_context="fork",  # the default start method on Linux, named
            persistent_workers=FORK_HANGS_UNDER_GLOO,  # see support.gloo_fork
            generator=torch.Generator().manual_seed(12),
            resumable=True,
        )
        # Each rank's dropout masks differ: a rank resumed with another rank's RNG would show.
        torch.manual_seed(100 + rank)
        random.seed(100 + rank)
        np.random.seed(100 + rank)
        self.points = points
        self.kill_at: int | None = None  # this rank SIGKILLs itself inside that step
        self.points_durable_at: int | None = None  # every rank waits for the points there
        self.losses: dict[int, float] = {}
        self._initialize_training_resume(CONFIG, version="1", resume_points=points)

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> float:
        x, y, _ = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        if self.completed_steps + 1 == self.points_durable_at:
            # Points are written in the background: the newest one is known only once it
            # is durable, on the writing rank, before any rank dies.
            self.points.wait()
            if dist.is_initialized():
                dist.barrier()
        if self.completed_steps + 1 == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: gradients computed, not applied
        self.optimizer.step()
        return loss.item()


def _save(value: Any, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(value, partial)
    os.replace(partial, path)  # a kill never leaves half a file


def _worker_pids() -> list[int]:
    return sorted(child.pid for child in multiprocessing.active_children() if child.pid)


def assert_same_final_state(expected: Path, actual: Path) -> None:
    """The final states of two runs (``result_*.pt``: weights, optimizer, scheduler,
    loader, the generators' next draws, steps) are equal, tensor by tensor."""
    expected_state, actual_state = torch.load(expected), torch.load(actual)
    for state in (expected_state, actual_state):
        del state["restarts"]  # which attempt finished differs, nothing else may
    difference = first_difference(expected_state, actual_state)
    assert difference is None, difference.describe()


def main(out: Path, kill: tuple[int, int] | None) -> int:
    torch.set_num_threads(1)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    rank = dist.get_rank() if distributed else 0
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    tag = f"a{attempt}_r{rank}"
    # "wait": every point lands at its step, so where a resume starts is known.
    points = ResumePoints(out / "points", every_steps=POINT_EVERY, when_busy="wait")
    trainer = EpochLoopTrainer(points, rank)
    # Armed as in a real job: the SIGTERM with which torchrun stops the other ranks after
    # a kill is a pause request that cannot land (a pause needs every rank).
    trainer.pause_on_signal(out / "points" / "pause.ckpt")
    trainer.resume_latest()
    (out / f"start_{tag}.txt").write_text(str(trainer.completed_steps))
    if kill is not None and attempt == 0:
        trainer.points_durable_at = kill[1]
        if kill[0] == rank:
            trainer.kill_at = kill[1]
    for _ in range(trainer.loader.epoch, EPOCHS):
        batches = iter(trainer.loader)  # this epoch's workers are forked here
        (out / f"pids_{tag}.txt").write_text(" ".join(map(str, [os.getpid(), *_worker_pids()])))
        for batch in batches:
            loss = trainer.step(batch)
            trainer.losses[trainer.completed_steps] = loss
            _save(trainer.losses, out / f"losses_{tag}.pt")
        trainer.scheduler.step()  # the epoch-end work
    points.wait()  # os._exit below: nothing else joins the writer
    _save(
        {
            "model": trainer.module.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "loader": trainer.loader.state_dict(),
            "completed_steps": trainer.completed_steps,
            "draws": [random.random(), float(np.random.rand()), torch.rand(3)],
            "restarts": attempt,
        },
        out / f"result_{tag}.pt",
    )
    trainer.loader.close()
    if distributed:
        dist.barrier()  # no rank tears its connections down while a peer may still read
        del trainer
        gc.collect()  # free DDP's gloo work objects while the interpreter is whole
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    chosen = (int(arguments[1]), int(arguments[2])) if len(arguments) == 3 else None
    code = main(Path(arguments[0]), chosen)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown under gloo's threads (see ddp_workers)
