"""Lightning ``strategy="ddp"`` runs on 2 CPU processes for the distributed adapter test.

Run as a module, with tests/ on ``PYTHONPATH``: ``python -m support.lightning_ddp_child
MODE OUT [--steps N] [--pause-step K]``; Lightning's subprocess launcher starts rank 1
by running the same command again. Every rank writes ``OUT/result_<mode>_rank<r>.pt``.

Modes: ``reference`` (uninterrupted, no ResumeCallback), ``pause`` (ResumeCallback;
rank 0 prints "STEP K" and waits for a SIGTERM from the parent), ``resume``.

With ``--epochs N`` the fit runs N epochs instead of ``--steps`` over a shuffled
``ResumableDataLoader`` in which Lightning puts its ``DistributedSampler``
(``use_distributed_sampler``, Lightning's default), validating at each epoch's end; in
``pause`` mode rank 0 asks for the pause after its ``--pause-step``-th batch itself
(no signal: the batch may be an epoch's last).
"""

from __future__ import annotations

import argparse
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from support.lightning_child import (
    SEED,
    AugmentedDataset,
    LoopsRegressor,
    Regressor,
    StepGate,
    build_val_loader,
    result,
)
from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

CONFIG = {
    "model": {"hidden": 32, "dropout": 0.25},
    "optim": {"lr": 0.01, "step_size": 3, "gamma": 0.8},
}


class ShardedRegressor(Regressor):
    """Builds its loader in ``train_dataloader``: the process group exists by then, so the
    sampler takes ``num_replicas`` / ``rank`` from it."""

    def train_dataloader(self) -> ResumableDataLoader:
        dataset = AugmentedDataset(48)
        # The same seeds on every rank: one global stream, one augmentation seed.
        sampler = InfiniteRandomSampler(
            dataset, generator=torch.Generator().manual_seed(21), resumable=True
        )
        return ResumableDataLoader(
            dataset,
            batch_size=4,
            sampler=sampler,
            num_workers=2,
            generator=torch.Generator().manual_seed(22),
            resumable=True,
        )


class EpochRegressor(LoopsRegressor):
    """A loader as users write it (``shuffle=True``): under DDP Lightning replaces its
    sampler by a ``DistributedSampler`` and sets its epoch at each epoch's start."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.epoch_metrics: dict[str, torch.Tensor] = {}

    def train_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(AugmentedDataset(16), batch_size=2, shuffle=True, resumable=True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        # Epoch-level values: this rank's, and the mean over the ranks.
        self.log("train_rank_max", loss, on_step=False, on_epoch=True, reduce_fx="max")
        self.log("train_mean", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def on_train_epoch_start(self) -> None:
        # The values the previous epoch ended with.
        for name, value in self.trainer.callback_metrics.items():
            self.epoch_metrics[f"e{self.current_epoch}/{name}"] = value.clone()

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return build_val_loader()


class RequestPauseAfter(pl.Callback):
    """Asks for a pause after the ``batch``-th training batch (before ResumeCallback's hook)."""

    def __init__(self, resume: ResumeCallback, batch: int) -> None:
        self.resume, self.batch, self.seen = resume, batch, 0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.seen += 1
        if self.seen == self.batch:
            self.resume.request_pause()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("reference", "pause", "resume"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pause-step", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    pause_file = args.out / "pause.ckpt"
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    epochs = args.epochs is not None
    model = EpochRegressor(CONFIG) if epochs else ShardedRegressor(CONFIG)
    callbacks: list[pl.Callback] = []
    resume = ResumeCallback(pause_file, config=CONFIG)
    if epochs and args.mode == "pause":
        callbacks.append(RequestPauseAfter(resume, args.pause_step))
    if args.mode != "reference":
        callbacks.append(resume)
    trainer = pl.Trainer(
        max_steps=-1 if epochs else args.steps,
        max_epochs=args.epochs if epochs else -1,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        use_distributed_sampler=epochs,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    if args.mode == "pause" and trainer.global_rank == 0 and not epochs:
        # Only rank 0 gets the signal (and prints the steps the parent waits for); rank 1
        # learns of the pause through the callback's all-rank reduction.
        trainer.callbacks.insert(
            0, StepGate(args.pause_step, lambda trainer: resume.pause_requested)
        )
    trainer.fit(model, ckpt_path=resume.ckpt_path if args.mode == "resume" else None)
    if epochs:
        for name, value in trainer.callback_metrics.items():
            model.epoch_metrics[f"end/{name}"] = value.clone()
    torch.save(
        result(model, trainer, paused_at_step=resume.paused_at_step),
        args.out / f"result_{args.mode}_rank{trainer.global_rank}.pt",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
