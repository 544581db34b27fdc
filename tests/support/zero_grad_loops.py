"""Training loops that treat spent gradients differently, for the tests of what a pause carries.

``@training_step`` is one micro-batch; the optimizers step every ``accumulate``
micro-batches. Loop styles: ``"first"`` calls ``zero_grad()`` (gradients set to
``None``) at a window's start, before the backward (the tutorials' and nanoGPT's
order); ``"in_place"`` calls ``zero_grad(set_to_none=False)`` there; ``"replace"`` puts a
new zero tensor in each gradient's place there (``p.grad = torch.zeros_like(p.grad)``:
an in-place zero by another name); ``"held"`` is ``"first"`` with each step's spent
gradients kept in a list until the next step (say, for logging); ``"reads"`` is
``"first"`` whose loss is weighted by the last step's gradient norm, read before its
``zero_grad()`` (so a spent gradient's value reaches the next step); ``"never"`` never
zeroes, so every backward adds to the gradients already applied. The trainers declare
``spent_gradients="drop"`` (their loops never read a spent gradient, but for
``"reads"``), the rule these tests are about; ``spent_gradients=None`` takes the
library's default. Two optimizers own
different parameters (AdamW and SGD with momentum), bf16 autocast with a
``GradScaler("cpu")``, dropout, a shuffled loader; a branch of the model runs on even
micro-steps only, so some steps reach a parameter no backward touches. Options: a
micro-step whose loss is infinite (the scaler skips both optimizer steps), a parameter
no optimizer owns, a third optimizer over the first layer that never steps, no branch.
Under a process group the model is DDP (``no_sync`` inside a window) over a
``DistributedSampler``, without the branch: DDP's record of the parameters a window's
micro-batches used is not part of a pause, so a parameter used inside a window but not
by its last micro-batch would not be reduced after a resume.

Module level on purpose: the ranks find its functions by name, and ``python -m
support.zero_grad_loops resume PAUSE OUT OPTIONS_JSON`` resumes a pause file in a fresh
process.
"""

from __future__ import annotations

import contextlib
import json
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
from trainer_resume.durable import load_checkpoint
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step
from trainer_resume.testing import first_difference

TOTAL = 8  # micro-steps
SIZE, BATCH, FEATURES = 32, 2, 6


class Net(nn.Module):
    def __init__(self, unowned: bool, branch: bool) -> None:
        super().__init__()
        self.first = nn.Linear(FEATURES, 16)
        self.drop = nn.Dropout(0.2)
        self.second = nn.Linear(16, FEATURES)
        self.branch = nn.Linear(FEATURES, FEATURES) if branch else None
        self.scale = nn.Parameter(torch.ones(FEATURES)) if unowned else None

    def forward(self, x: torch.Tensor, micro: int) -> torch.Tensor:
        out = self.second(self.drop(nn.functional.gelu(self.first(x))))
        if self.branch is not None and micro % 2 == 0:
            out = out + self.branch(x)
        return out * self.scale if self.scale is not None else out


class LoopTrainer(TrainingResumeMixin):
    """One micro-batch per ``@training_step`` in the given loop style (module docstring)."""

    def __init__(
        self,
        style: str,
        *,
        accumulate: int = 1,
        skip_at: int | None = None,
        unowned: bool = False,
        branch: bool = True,
        idle: bool = False,
        points: ResumePoints | None = None,
        spent_gradients: str | None = "drop",
    ) -> None:
        self.style, self.accumulate, self.skip_at = style, accumulate, skip_at
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        self.module = Net(unowned, branch)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.model = DistributedDataParallel(self.module) if self.distributed else self.module
        m = self.module
        self.adamw = torch.optim.AdamW(
            [*m.first.parameters(), *(m.branch.parameters() if branch else [])],
            lr=0.02,
            weight_decay=0.1,
        )
        self.sgd = torch.optim.SGD(m.second.parameters(), lr=0.05, momentum=0.9)
        # Owns the first layer too, and never steps (say, one stepped every 1000 steps).
        self.idle = torch.optim.SGD(m.first.parameters(), lr=0.05) if idle else None
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
        torch.manual_seed(100 + (dist.get_rank() if self.distributed else 0))
        self.micro = 0
        self.held: list[torch.Tensor | None] = []  # "held": the last step's spent gradients
        self.losses: dict[int, torch.Tensor] = {}
        config = {
            "style": style,
            "accumulate": accumulate,
            "skip_at": skip_at,
            "unowned": unowned,
            "branch": branch,
            "idle": idle,
        }
        # "held" is the loop's log of the last step's gradients, not training state.
        declared = {} if spent_gradients is None else {"spent_gradients": spent_gradients}
        self._initialize_training_resume(
            config,
            version="1",
            resume_points=points,
            excluded_attributes=("held",),
            **declared,  # type: ignore[arg-type]
        )

    def _resume_objects(self) -> dict[str, Any]:
        objects = {"model": self.module, "adamw": self.adamw, "sgd": self.sgd}
        return {**objects, "scaler": self.scaler, **({"idle": self.idle} if self.idle else {})}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"micro": self.micro}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.micro = state["micro"]

    @training_step
    def step(self, batch: Any) -> None:
        x, y = batch
        weight = 1.0
        if self.style == "reads":  # the last step's gradient, read before zero_grad()
            last = self.module.second.weight.grad
            weight = 1.0 if last is None else 1.0 + float(last.float().norm())
        if self.micro % self.accumulate == 0 and self.style in (
            "first",
            "in_place",
            "held",
            "reads",
        ):
            for optimizer in (self.adamw, self.sgd):
                optimizer.zero_grad(set_to_none=self.style != "in_place")
        if self.micro % self.accumulate == 0 and self.style == "replace":
            for parameter in self.module.parameters():
                if parameter.grad is not None:
                    parameter.grad = torch.zeros_like(parameter.grad)
        last = (self.micro + 1) % self.accumulate == 0
        sync = contextlib.nullcontext() if last or not self.distributed else self.model.no_sync()
        with sync:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(self.model(x, self.micro), y) / self.accumulate
                loss = loss * weight
            if self.micro + 1 == self.skip_at:
                loss = loss * float("inf")  # the scaler finds inf gradients and skips the steps
            self.scaler.scale(loss).backward()
        if last:
            self.scaler.step(self.adamw)
            self.scaler.step(self.sgd)
            self.scaler.update()
            if self.style == "held":
                self.held = [p.grad for p in self.module.parameters()]
        self.micro += 1
        self.losses[self.completed_steps + 1] = loss.detach().float()


def train(trainer: LoopTrainer, *, total: int = TOTAL, request: Any = None) -> None:
    """The documented epoch loop to ``total`` micro-steps; ``request``: ``(step, path)``, a
    pause asked for before that step."""
    while trainer.completed_steps < total and not trainer.paused:
        if trainer.sampler is not None:
            trainer.sampler.set_epoch(trainer.loader.epoch)
        for batch in trainer.loader:
            if request is not None and trainer.completed_steps + 1 == request[0]:
                trainer.request_pause(request[1])
            trainer.step(batch)
            if trainer.paused or trainer.completed_steps >= total:
                break


def outcome(trainer: LoopTrainer, first_step: int = 1) -> dict[str, Any]:
    """What must equal the uninterrupted run: every state, the gradients and the losses."""
    return {
        "model": {k: v.clone() for k, v in trainer.module.state_dict().items()},
        "gradients": {k: p.grad for k, p in trainer.module.named_parameters()},
        "adamw": trainer.adamw.state_dict(),
        "sgd": trainer.sgd.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "losses": {k: v for k, v in trainer.losses.items() if k >= first_step},
        "rng_after": torch.rand(3),
    }


def uninterrupted(style: str, **options: Any) -> dict[str, Any]:
    trainer = LoopTrainer(style, **options)
    train(trainer)
    return outcome(trainer)


def paused(style: str, step: int, path: Path, **options: Any) -> int:
    """Train until a pause requested before ``step`` lands; the completed steps."""
    trainer = LoopTrainer(style, **options)
    train(trainer, request=(step, str(path)))
    return trainer.completed_steps


def resumed(style: str, path: Any, **options: Any) -> tuple[dict[str, Any], int]:
    """A fresh trainer resumed from ``path`` (after the generators moved), trained to the end."""
    trainer = LoopTrainer(style, **options)
    torch.rand(5)  # a resume that forgot the RNG must not pass by luck
    trainer.resume(path)
    start = trainer.completed_steps
    train(trainer)
    return outcome(trainer, start + 1), start


def with_points(style: str, directory: Path, every: int, **options: Any) -> list[Path]:
    """Train to the end taking a resume point every ``every`` micro-steps."""
    points = ResumePoints(directory, every_steps=every, keep=TOTAL, when_busy="wait")
    trainer = LoopTrainer(style, points=points, **options)
    train(trainer)
    points.wait()
    if dist.is_initialized():
        dist.barrier()  # rank 0 writes the points; the others list them once they are durable
    return sorted(directory.glob("point-*.ckpt"))


def saved_gradients(path: Path) -> list[Any]:
    """The gradients a pause or point file holds, one entry per rank that wrote it
    (``None``: none)."""
    checkpoint = load_checkpoint(path)
    if "distributed" in checkpoint:
        return [rank.get("gradients") for rank in checkpoint["distributed"]["ranks"]]
    return [checkpoint.get("gradients")]


def difference_after(expected: dict[str, Any], actual: dict[str, Any], step: int) -> str | None:
    """The first difference of a run resumed at ``step`` from the uninterrupted run's outcome."""
    expected = dict(expected, losses={k: v for k, v in expected["losses"].items() if k > step})
    difference = first_difference(expected, actual)
    return None if difference is None else str(difference)


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """One rank (see ``ddp_workers.launch``): the zero_grad-first loop paused at each
    ``[accumulate, step]`` of ``job["pauses"]`` and resumed; writes, per pause, whether
    each rank's part of the file held gradients (rank 0 reads it) and the first
    difference from the uninterrupted run."""
    from support import ddp_workers

    tag = job["tag"]
    ddp_workers._capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        warnings.simplefilter("ignore")
        ddp_workers.join_group(rank, world, init_file)
        directory = Path(out, f"rank-files-{tag}")  # one directory every rank sees
        directory.mkdir(exist_ok=True)
        report: dict[str, Any] = {}
        for accumulate, step in job["pauses"]:
            options = {"accumulate": accumulate, "branch": False}
            expected = uninterrupted("first", **options)
            path = directory / f"pause-{accumulate}-{step}.ckpt"
            at = paused("first", step, path, **options)
            held = [g is not None for g in saved_gradients(path)] if rank == 0 else None
            actual, start = resumed("first", path, **options)
            if (at, start) != (step, step):
                difference = f"paused at {at}, resumed at {start}, expected {step}"
            else:
                difference = difference_after(expected, actual, step)
            report[f"{accumulate}-{step}"] = (held, difference)
        torch.save(report, Path(out, f"result_{tag}_rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        import traceback

        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
    ddp_workers._exit_now()


def main(argv: list[str]) -> int:
    """``resume PAUSE OUT OPTIONS_JSON``: resume in this fresh process and save the outcome."""
    mode, pause, out, options = argv
    if mode != "resume":
        raise SystemExit(f"unknown mode {mode!r}")
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    options = json.loads(options)
    actual, start = resumed(options.pop("style"), Path(pause), **options)
    torch.save({"outcome": actual, "start": start}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
