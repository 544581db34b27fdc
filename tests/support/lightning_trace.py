"""In-process Lightning runs that record everything an uninterrupted fit would show.

Each run records, in order, every training step's loss, every validation batch
(with a random draw from the global generator, so a shifted RNG shows), every
validation end with the metrics the callbacks saw, and every epoch start and end.
A paused run and its resume (fresh module, loaders, trainer and callbacks, after
the global generators were advanced so that a missing restore cannot hide) must
add up to the uninterrupted run's record.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader

from support import lightning_child as child
from trainer_resume.adapters.lightning import ResumeCallback


class Traced(child.Regressor):
    """Regressor with a validation step that logs ``val_loss`` and draws from the global RNG.

    Besides the per-step StepLR, a ReduceLROnPlateau steps at every epoch end on
    ``monitor``, with the metrics of the validation just before.
    """

    def __init__(
        self, record: list[tuple[Any, ...]], config: Any = child.CONFIG, monitor: str = "val_loss"
    ) -> None:
        super().__init__(config)
        self.record = record
        self.monitor = monitor

    def configure_optimizers(self) -> Any:
        configured = super().configure_optimizers()
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            configured["optimizer"], patience=0, factor=0.5
        )
        return [configured["optimizer"]], [
            configured["lr_scheduler"],
            {"scheduler": plateau, "interval": "epoch", "monitor": self.monitor},
        ]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.record.append(
            ("train", self.global_step, self.current_epoch, batch_idx, loss.detach().clone())
        )
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y) + 0.01 * torch.rand(())
        if not self.trainer.sanity_checking:
            self.record.append(
                ("val", self.global_step, self.current_epoch, batch_idx, loss.clone())
            )
        self.log("val_loss", loss, on_epoch=True)

    def on_train_epoch_start(self) -> None:
        self.record.append(("epoch_start", self.global_step, self.current_epoch, torch.rand(())))

    def on_train_epoch_end(self) -> None:
        self.record.append(("epoch_end", self.global_step, self.current_epoch, torch.rand(())))

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            metrics = {k: v.clone() for k, v in self.trainer.callback_metrics.items()}
            self.record.append(("val_end", self.global_step, self.current_epoch, metrics))


class RequestPauseAt(pl.Callback):
    """Asks ``resume`` for a pause after the ``batch``-th training batch of the fit
    (1-based), or with ``validation``, during its ``batch``-th validation batch."""

    def __init__(self, batch: int, resume: ResumeCallback, *, validation: bool = False) -> None:
        self.batch = batch
        self.resume = resume
        self.validation = validation
        self.seen = 0

    def _count(self, validation: bool) -> None:
        if validation == self.validation:
            self.seen += 1
            if self.seen == self.batch:
                self.resume.request_pause()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._count(validation=False)

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            self._count(validation=True)


def val_loader() -> DataLoader:
    return DataLoader(child.AugmentedDataset(12), batch_size=4)


def seed_everything() -> None:
    torch.manual_seed(child.SEED)
    random.seed(child.SEED)
    np.random.seed(child.SEED)


def fit(
    directory: Path,
    record: list[tuple[Any, ...]],
    *,
    train: Any = None,
    pause_at_batch: int | None = None,
    pause_in_validation: int | None = None,
    ckpt_path: Any = None,
    resume: bool = True,
    config: Any = child.CONFIG,
    extra: Any = (),
    **options: Any,
) -> tuple[Traced, pl.Trainer, ResumeCallback | None, list[pl.Callback]]:
    """One fit; ``train`` builds the training loader(s) (default: one endless resumable loader);
    ``extra`` builds more callbacks (called with no arguments, for each fit)."""
    monitor = "train_loss" if options.get("limit_val_batches") == 0 else "val_loss"
    model = Traced(record, config, monitor)
    loader = train() if train is not None else child.build_loader(workers=0)
    monitors: list[pl.Callback] = [
        ModelCheckpoint(
            dirpath=directory / "ckpts", monitor=monitor, save_top_k=2, filename="{step}"
        ),
        EarlyStopping(monitor=monitor, patience=100),
    ]
    callbacks: list[pl.Callback] = [*(build() for build in extra), *monitors]
    callback = None
    if resume:
        callback = ResumeCallback(directory / "pause.ckpt", config=config)
        if pause_at_batch is not None:
            callbacks.append(RequestPauseAt(pause_at_batch, callback))
        if pause_in_validation is not None:
            callbacks.append(RequestPauseAt(pause_in_validation, callback, validation=True))
        callbacks.append(callback)
    settings: dict[str, Any] = {"max_steps": -1, "max_epochs": 3, "limit_train_batches": 4}
    settings.update(options)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **settings,
    )
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=val_loader(), ckpt_path=ckpt_path)
    return model, trainer, callback, monitors
