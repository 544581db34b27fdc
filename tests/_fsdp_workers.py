"""Ranks of a small FSDP2 (``fully_shard``) training run on CPU with gloo, for the sharded tests.

Module level on purpose: spawned ranks import it by name. The data, loader and
seeds are those of the DDP runs (``_ddp_workers``); only the model is sharded.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from _ddp_workers import BATCH, CONFIG, FEATURES, IdDataset
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step


class FSDPTrainer(TrainingResumeMixin):
    """Linear layers sharded by ``fully_shard`` over every rank, Dropout, AdamW, a per-step LR schedule."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        hidden, dropout = CONFIG["model"]["hidden"], CONFIG["model"]["dropout"]
        self.model = nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in self.model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=CONFIG["optim"]["lr"])
        decay = CONFIG["optim"]["decay"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: decay**step)
        dataset = IdDataset()
        sampler = InfiniteRandomSampler(dataset, generator=torch.Generator().manual_seed(11), resumable=True)
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            sampler=sampler,
            generator=torch.Generator().manual_seed(12),
            resumable=True,
        )
        self.iterator = iter(self.loader)
        rank = dist.get_rank()
        # Each rank's generators differ, so a rank resumed with another's RNG state would show.
        torch.manual_seed(100 + rank)
        random.seed(100 + rank)
        np.random.seed(100 + rank)
        self.batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.extra = {"marker": 1}
        self._initialize_training_resume(CONFIG, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return dict(self.extra)

    def _load_resume_extra_state(self, state: Any) -> None:
        self.extra = dict(state)

    def _rebuild_resume_iterators(self) -> None:
        self.iterator = iter(self.loader)

    @training_step
    def step(self) -> None:
        x, y, ids = next(self.iterator)
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.batches.append((x, y, ids))
