"""Ranks of an FSDP2 model with a BatchNorm, each rank on its own batches, under ``torchrun``.

``python -m support.fsdp_buffers_child DIR``: on each rank, an uninterrupted run, a run
paused after ``PAUSE`` steps and a fresh trainer resuming that pause to ``STEPS``; each
rank saves ``DIR/rank-<r>.pt``: the uninterrupted and resumed losses and model states
(full tensors), and its running statistics at the pause and after the resume.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from trainer_resume import TrainingResumeMixin, training_step

PAUSE, STEPS = 2, 4


class BatchNormTrainer(TrainingResumeMixin):
    """FSDP2 shards the Linear's parameters; the BatchNorm's statistics stay one per rank."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        fully_shard(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self._initialize_training_resume({"child": "fsdp_buffers"}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {}

    @training_step
    def step(self) -> torch.Tensor:
        # Each rank its own batch: its running statistics are its own.
        seed = 100 * self.completed_steps + dist.get_rank()
        inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
        loss = self.model(inputs).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def _full(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        key: (value.full_tensor() if isinstance(value, DTensor) else value).clone()
        for key, value in state.items()
    }


def main(directory: Path) -> int:
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reference = BatchNormTrainer()
    expected = [reference.step() for _ in range(STEPS)]
    paused = BatchNormTrainer()
    for _ in range(PAUSE):
        paused.step()
    at_pause = paused.model[1].running_mean.clone()
    paused.pause(directory / "pause")
    resumed = BatchNormTrainer()
    resumed.resume(directory / "pause")
    after_resume = resumed.model[1].running_mean.clone()
    losses = [resumed.step() for _ in range(STEPS - PAUSE)]
    torch.save(
        {
            "expected": expected[PAUSE:],
            "losses": losses,
            "reference": _full(reference.model.state_dict()),
            "resumed": _full(resumed.model.state_dict()),
            "at_pause": at_pause,
            "after_resume": after_resume,
        },
        directory / f"rank-{rank}.pt",
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown under gloo's threads (see ddp_workers)
