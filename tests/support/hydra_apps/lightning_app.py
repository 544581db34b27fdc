"""A Hydra app with a LightningModule and ``ResumeCallback(config=cfg)``.

    PROJECT_ROOT=... DATA_DIR=... python lightning_app.py [overrides]
    PROJECT_ROOT=... DATA_DIR=... python lightning_app.py -m seed=1,2

The Trainer's ``default_root_dir`` and the CSV logger's folder are Hydra's output
directory (``${paths.output_dir}``), new on every launch. A SIGTERM pauses the fit into
``pause_path``; the same command again resumes it. Prints ``OUTPUT_DIR``, ``STEP <n>
<loss>`` per step and ``PAUSED <n>`` or ``FINISHED``; a finished run writes
``<root_dir>/results/lightning-seed<seed>.pt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig
from pytorch_lightning.loggers import CSVLogger
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
from trainer_resume.adapters.lightning import ResumeCallback


class Regressor(pl.LightningModule):
    def __init__(
        self, hidden: int, activation: str, dropout: float, lr: float, momentum: float
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(hidden, 1),
        )
        self.losses: dict[int, torch.Tensor] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step + 1] = loss.detach().clone()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(
            self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum
        )


class Report(pl.Callback):
    """Prints each step's loss; at the test's step, waits until the pause was requested."""

    def __init__(self, resume: ResumeCallback) -> None:
        self.resume = resume
        self.wait = wait_at_step()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        step = trainer.global_step
        report_step(step, pl_module.losses[step], self.wait, lambda: self.resume.pause_requested)


def fit(cfg: DictConfig, *, default_root_dir: str, logger: Any, results: Path) -> None:
    """Fit, or continue the paused fit; pause on SIGTERM; record a finished run."""
    resume = ResumeCallback(cfg.pause_path, config=cfg, config_ignore=list(cfg.config_ignore))
    if resume.finished:  # a requeued job whose run completed: nothing to do
        print("FINISHED", flush=True)
        return
    seed_everything(cfg.seed)
    model = Regressor(
        cfg.model.hidden,
        cfg.model.activation,
        cfg.model.dropout,
        cfg.optimizer.lr,
        cfg.optimizer.momentum,
    )
    loader = build_loader(cfg)
    trainer = pl.Trainer(
        max_steps=cfg.trainer.max_steps,
        default_root_dir=default_root_dir,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Report(resume), resume],
    )
    trainer.fit(model, loader, ckpt_path=resume.ckpt_path)
    loader.close()
    if resume.paused:
        print(f"PAUSED {resume.paused_at_step}", flush=True)
        return
    save_result(
        results / f"lightning-seed{cfg.seed}.pt", model, trainer.optimizers[0], model.losses
    )
    print("FINISHED", flush=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    print(f"OUTPUT_DIR {cfg.trainer.default_root_dir}", flush=True)
    fit(
        cfg,
        default_root_dir=cfg.trainer.default_root_dir,
        logger=CSVLogger(save_dir=cfg.logger.save_dir, name=cfg.logger.name),
        results=Path(cfg.paths.root_dir) / "results",
    )


if __name__ == "__main__":
    main()
