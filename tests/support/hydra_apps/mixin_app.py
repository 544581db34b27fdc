"""A Hydra app whose own trainer uses the mixin; the whole DictConfig is signed.

    PROJECT_ROOT=... DATA_DIR=... python mixin_app.py [overrides]
    PROJECT_ROOT=... DATA_DIR=... python mixin_app.py -m seed=1,2

A SIGTERM pauses the run into ``pause_path``; the same command again resumes it,
although Hydra gives every launch a new output directory. Prints ``OUTPUT_DIR``,
``STEP <n> <loss>`` per step and ``PAUSED <n>`` or ``FINISHED``; a finished run writes
``<root_dir>/results/mixin-seed<seed>.pt``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from torch import nn

from support.hydra_apps.common import (
    ACTIVATIONS,
    FEATURES,
    build_loader,
    report_step,
    save_result,
    seed_everything,
    wait_at_step,
)
from trainer_resume import TrainingResumeMixin, run_finished, training_step


class Trainer(TrainingResumeMixin):
    def __init__(self, cfg: DictConfig) -> None:
        seed_everything(cfg.seed)
        self.model = nn.Sequential(
            nn.Linear(FEATURES, cfg.model.hidden),
            ACTIVATIONS[cfg.model.activation](),
            nn.Dropout(cfg.model.dropout),
            nn.Linear(cfg.model.hidden, 1),
        )
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum
        )
        self.loader = build_loader(cfg)
        self.batches = iter(self.loader)
        self._initialize_training_resume(
            cfg, version="hydra-app/1", config_ignore=list(cfg.config_ignore)
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _rebuild_resume_iterators(self) -> None:
        self.batches = iter(self.loader)

    @training_step
    def step(self) -> torch.Tensor:
        inputs, targets = next(self.batches)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def train(cfg: DictConfig, results: Path) -> None:
    """Train, or continue the paused run; pause on SIGTERM; record a finished run."""
    pause_path = Path(cfg.pause_path)
    if run_finished(pause_path):  # a requeued job whose run completed: nothing to do
        print("FINISHED", flush=True)
        return
    trainer = Trainer(cfg)
    if pause_path.exists():
        trainer.resume(pause_path)
    wait = wait_at_step()
    losses: dict[int, torch.Tensor] = {}
    handlers = trainer.pause_on_signal(pause_path)
    try:
        while trainer.completed_steps < cfg.trainer.max_steps:
            loss = trainer.step()
            losses[trainer.completed_steps] = loss
            report_step(trainer.completed_steps, loss, wait, lambda: trainer.pause_requested)
            if trainer.pause_if_requested():
                print(f"PAUSED {trainer.completed_steps}", flush=True)
                return
    finally:
        handlers.restore()
        trainer.loader.close()
    trainer.finish(pause_path)
    save_result(results / f"mixin-seed{cfg.seed}.pt", trainer.model, trainer.optimizer, losses)
    print("FINISHED", flush=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    # The run-specific values are used as the template uses them: the trainer's folder.
    os.makedirs(cfg.trainer.default_root_dir, exist_ok=True)
    print(f"OUTPUT_DIR {cfg.trainer.default_root_dir}", flush=True)
    train(cfg, Path(cfg.paths.root_dir) / "results")


if __name__ == "__main__":
    main()
