"""A pretraining-style loop with gradient accumulation, for the accumulation-window tests.

``@training_step`` is one micro-batch of a window of ``ACCUMULATE``: bf16 autocast, a
``GradScaler("cpu")``, AdamW, a cosine LR stepped per optimizer step, dropout, and a
shuffled ``ResumableDataLoader`` (under a process group: ``DistributedSampler`` with
``shuffle=True`` and a DDP model that skips the all-reduce with ``no_sync`` inside a
window). Two ``zero_grad`` styles: ``"after"`` sets the gradients to ``None`` after the
optimizer step, ``"start"`` zeroes them at a window's start (they are never ``None``).

Module level on purpose: the ranks find its functions by name, and ``python -m
support.accumulation resume PAUSE OUT STYLE`` resumes a pause file in a fresh process.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from trainer_resume import ResumePoints
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step
from trainer_resume.testing import first_difference

ACCUMULATE = 4
TOTAL = 12  # micro-steps (three windows)
PAUSES = (5, 6, 7)  # positions 1, 2 and 3 of the second window
POINT_EVERY = 3  # resume points at micro-steps 3, 6, 9: positions 3, 2 and 1
SIZE, BATCH, FEATURES = 32, 2, 6


class WindowTrainer(TrainingResumeMixin):
    """One micro-batch per ``@training_step``; the optimizer steps every ``ACCUMULATE``."""

    def __init__(self, style: str, *, points: ResumePoints | None = None) -> None:
        self.style = style
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        self.module = nn.Sequential(
            nn.Linear(FEATURES, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, FEATURES)
        )
        self.distributed = dist.is_available() and dist.is_initialized()
        self.model = DistributedDataParallel(self.module) if self.distributed else self.module
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=0.02, weight_decay=0.1)
        windows = TOTAL // ACCUMULATE
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: 0.5 * (1 + math.cos(math.pi * min(step, windows) / windows)),
        )
        # A small growth interval: the scale changes within the run, so a scaler restored
        # to the wrong moment shows.
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        data = torch.Generator().manual_seed(1)
        dataset = TensorDataset(
            torch.randn(SIZE, FEATURES, generator=data), torch.randn(SIZE, FEATURES, generator=data)
        )
        self.sampler = (
            DistributedSampler(dataset, shuffle=True, seed=5) if self.distributed else None
        )
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=self.sampler is None,
            sampler=self.sampler,
            generator=torch.Generator().manual_seed(3) if self.sampler is None else None,
            resumable=True,
        )
        rank = dist.get_rank() if self.distributed else 0
        torch.manual_seed(100 + rank)  # each rank's dropout differs
        self.micro = 0
        self.losses: dict[int, torch.Tensor] = {}
        self._initialize_training_resume(
            {"style": style, "accumulate": ACCUMULATE}, version="1", resume_points=points
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {
            "model": self.module,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"micro": self.micro}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.micro = state["micro"]

    @training_step
    def step(self, batch: Any) -> None:
        x, y = batch
        if self.style == "start" and self.micro % ACCUMULATE == 0:
            self.optimizer.zero_grad(set_to_none=False)
        last = (self.micro + 1) % ACCUMULATE == 0
        sync = contextlib.nullcontext() if last or not self.distributed else self.model.no_sync()
        with sync:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(self.model(x), y) / ACCUMULATE
            self.scaler.scale(loss).backward()
        if last:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            if self.style == "after":
                self.optimizer.zero_grad(set_to_none=True)
        self.micro += 1
        self.losses[self.completed_steps + 1] = loss.detach().float()


def train(trainer: WindowTrainer, *, total: int = TOTAL, request: Any = None) -> None:
    """The documented epoch loop, to ``total`` micro-steps; ``request``: ``(step, path)``,
    a pause asked for before that step (on this rank)."""
    while trainer.completed_steps < total and not trainer.paused:
        if trainer.sampler is not None:
            trainer.sampler.set_epoch(trainer.loader.epoch)
        for batch in trainer.loader:
            if request is not None and trainer.completed_steps + 1 == request[0]:
                trainer.request_pause(request[1])
            trainer.step(batch)
            if trainer.paused or trainer.completed_steps >= total:
                break


def outcome(trainer: WindowTrainer, first_step: int = 1) -> dict[str, Any]:
    """What must equal the uninterrupted run: every state, the gradients and the losses."""
    return {
        "model": {k: v.clone() for k, v in trainer.module.state_dict().items()},
        "gradients": [p.grad for p in trainer.module.parameters()],
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "losses": {k: v for k, v in trainer.losses.items() if k >= first_step},
        "rng_after": torch.rand(3),
    }


def uninterrupted(style: str) -> dict[str, Any]:
    trainer = WindowTrainer(style)
    train(trainer)
    return outcome(trainer)


def resumed(style: str, path: Any) -> tuple[dict[str, Any], int]:
    """A fresh trainer resumed from ``path`` (after the generators moved) and trained to the end."""
    trainer = WindowTrainer(style)
    torch.rand(5)  # a resume that forgot the RNG must not pass by luck
    trainer.resume(path)
    start = trainer.completed_steps
    train(trainer)
    return outcome(trainer, start + 1), start


def paused(style: str, step: int, path: Path, *, requesting_rank: int = 0) -> int:
    trainer = WindowTrainer(style)
    rank = dist.get_rank() if trainer.distributed else 0
    train(trainer, request=(step, str(path)) if rank == requesting_rank else None)
    return trainer.completed_steps


def with_points(style: str, directory: Path) -> list[Path]:
    """Train to step 10 taking a resume point every ``POINT_EVERY`` micro-steps."""
    points = ResumePoints(directory, every_steps=POINT_EVERY, keep=10, when_busy="wait")
    trainer = WindowTrainer(style, points=points)
    train(trainer, total=10)
    points.wait()
    if dist.is_initialized():
        dist.barrier()  # rank 0 writes the points; the others list them once they are durable
    return sorted(directory.glob("point-*.ckpt"))


def run_matrix(out: Path, rank: int = 0) -> dict[str, Any]:
    """Every case of the matrix: name -> the first difference from the uninterrupted run."""
    report: dict[str, Any] = {}
    for style in ("after", "start"):
        expected = uninterrupted(style)
        for step in PAUSES:
            path = out / f"pause-{style}-{step}.ckpt"
            at = paused(style, step, path, requesting_rank=1 if dist.is_initialized() else 0)
            actual, start = resumed(style, path)
            report[f"{style} pause at {step}"] = _compare(expected, actual, at, start, step)
        for point in with_points(style, out / f"points-{style}"):
            actual, start = resumed(style, point)
            report[f"{style} point {point.name}"] = _compare(expected, actual, start, start, start)
    return report


def _compare(
    expected: dict[str, Any], actual: dict[str, Any], at: int, start: int, step: int
) -> Any:
    if at != step or start != step:
        return f"paused at {at}, resumed at {start}, expected {step}"
    expected = dict(expected, losses={k: v for k, v in expected["losses"].items() if k > step})
    difference = first_difference(expected, actual)
    return None if difference is None else str(difference)


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """One rank of the 2-rank matrix (see ``ddp_workers.launch``): writes its report."""
    from support import ddp_workers

    tag = job["tag"]
    ddp_workers._capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        warnings.simplefilter("ignore")
        ddp_workers.join_group(rank, world, init_file)
        directory = Path(out, f"rank-files-{tag}")  # one directory every rank sees
        directory.mkdir(exist_ok=True)
        report = run_matrix(directory, rank)
        torch.save(report, Path(out, f"result_{tag}_rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        import traceback

        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
    ddp_workers._exit_now()


def main(argv: list[str]) -> int:
    """``resume PAUSE OUT STYLE``: resume in this fresh process and save the outcome."""
    mode, pause, out, style = argv
    if mode != "resume":
        raise SystemExit(f"unknown mode {mode!r}")
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    actual, start = resumed(style, Path(pause))
    torch.save({"outcome": actual, "start": start}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
