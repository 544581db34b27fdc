"""A DDP accumulation loop whose windows use a parameter early and not at their end.

``@training_step`` is one micro-batch of a window of ``ACCUMULATE``; the non-final
micro-steps run under ``no_sync()``. The model has two branches, ``a`` and ``b``, into
one head ``c``: rank ``r`` takes branch ``b`` at window position ``r`` only, so ``b``
has a gradient on every rank when a window's synced backward runs, and that backward
itself never reaches it. With ``find_unused_parameters=True`` the reducer averages
``b``'s gradients only because it recorded ``b`` as used under ``no_sync``.

``warm_up``: a single synced micro-step before the first window (a static-graph DDP
cannot start under ``no_sync``). Module level on purpose: the ranks find its functions by name.
"""

from __future__ import annotations

import contextlib
import gc
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.mixin import TrainingResumeMixin, training_step

ACCUMULATE = 4
TOTAL = 12  # micro-steps: three windows
PAUSE = 6  # after positions 0 and 1 of the second window
FEATURES, HIDDEN = 3, 4


class BranchNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(FEATURES, HIDDEN)
        self.b = nn.Linear(FEATURES, HIDDEN)
        self.c = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor, branch: int) -> torch.Tensor:
        return self.c(torch.tanh(self.a(x) if branch == 0 else self.b(x)))


class WindowDDPTrainer(TrainingResumeMixin):
    """One micro-batch per ``@training_step``; the optimizer steps at each window's end."""

    def __init__(self, *, static_graph: bool = False, warm_up: bool = False) -> None:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        self.module = BranchNet()
        self.model = DistributedDataParallel(
            self.module, find_unused_parameters=not static_graph, static_graph=static_graph
        )
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
        self.warm_up = warm_up
        self.micro = 0
        self.losses: dict[int, torch.Tensor] = {}
        self._initialize_training_resume(
            {"accumulate": ACCUMULATE, "static_graph": static_graph, "warm_up": warm_up},
            version="1",
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.module, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {}  # the batches are a function of the rank and the micro-step

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"micro": self.micro}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.micro = state["micro"]

    def position(self, micro: int) -> int:
        """The window position of a micro-step (the warm-up step is a window of one)."""
        if self.warm_up:
            return ACCUMULATE - 1 if micro == 0 else (micro - 1) % ACCUMULATE
        return micro % ACCUMULATE

    @training_step
    def step(self) -> None:
        rank = dist.get_rank()
        data = torch.Generator().manual_seed(1000 * rank + self.micro)
        x = torch.randn(4, FEATURES, generator=data)
        position = self.position(self.micro)
        last = position == ACCUMULATE - 1
        with contextlib.nullcontext() if last else self.model.no_sync():
            loss = self.model(x, 1 if position == rank else 0).pow(2).mean()
            loss.backward()
        if last:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.micro += 1
        self.losses[self.completed_steps + 1] = loss.detach()


def train(trainer: WindowDDPTrainer, total: int, request: Path | None = None) -> None:
    """Micro-steps up to ``total``; ``request``: a pause asked for before step ``total``."""
    while trainer.completed_steps < total and not trainer.paused:
        if request is not None and trainer.completed_steps + 1 == total:
            trainer.request_pause(request)
        trainer.step()


def outcome(trainer: WindowDDPTrainer, after: int = 0) -> dict[str, Any]:
    """What must equal the uninterrupted run: weights, gradients, optimizer, later losses."""
    return {
        "model": {k: v.clone() for k, v in trainer.module.state_dict().items()},
        "gradients": [p.grad for p in trainer.module.parameters()],
        "optimizer": trainer.optimizer.state_dict(),
        "losses": {k: v for k, v in trainer.losses.items() if k > after},
    }


def without_record(pause: Path, out: Path) -> None:
    """The pause without the reducers' record: what a resume had before the record moved."""
    checkpoint = load_checkpoint(pause)
    for rank in checkpoint["distributed"]["ranks"]:
        rank.pop("ddp_window", None)
    checkpoint.pop("ddp_window", None)
    save_checkpoint(checkpoint, out)


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """One rank (see ``ddp_workers.launch``): the uninterrupted run, then a fresh trainer
    paused at ``PAUSE``; then, in a new process group, fresh trainers resumed from the
    pause and from it without the record, each trained to the end."""
    from support import ddp_workers

    tag = job["tag"]
    ddp_workers._capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        warnings.simplefilter("ignore")
        ddp_workers.join_group(rank, world, init_file)
        pause, stripped = Path(out, "pause.ckpt"), Path(out, "without-record.ckpt")
        trainer = WindowDDPTrainer()
        train(trainer, TOTAL)
        result: dict[str, Any] = {"uninterrupted": outcome(trainer, PAUSE)}
        paused = WindowDDPTrainer()
        train(paused, PAUSE, pause if rank == 0 else None)
        result["paused_at"] = paused.completed_steps
        if rank == 0:
            without_record(pause, stripped)
        del trainer, paused
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        ddp_workers.join_group(rank, world, init_file + "-resume")
        for name, path in (("resumed", pause), ("without_record", stripped)):
            trainer = WindowDDPTrainer()
            torch.rand(3)  # a resume that forgot the RNG must not pass by luck
            trainer.resume(path)
            train(trainer, TOTAL)
            result[name] = outcome(trainer, PAUSE)
            del trainer
        torch.save(result, Path(out, f"result_{tag}_rank{rank}.pt"))
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()
    except BaseException:
        import traceback

        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
    ddp_workers._exit_now()
