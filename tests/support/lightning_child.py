"""Lightning training runs for the adapter tests, in-process or as a child process.

Run as a module, with tests/ on ``PYTHONPATH``: ``python -m support.lightning_child MODE
OUT [--steps N] [--pause-step K] [--epoch-batches E] [--workers W]`` and, for the loop
features, ``[--pause-batch B] [--validate] [--val-check-interval F] [--accumulate A]
[--max-epochs M] [--epoch-loader] [--two-loaders] [--dictconfig]``. Every mode writes
``OUT/result_<mode>.pt`` with the per-step losses, the final weights and the optimizer
state (and, with the loop features, every batch's loss and every validation batch's
loss).

Modes:
    reference     uninterrupted fit of N steps, no ResumeCallback.
    pause         fit with ResumeCallback; after step K is printed ("STEP K") the
                  run waits for the pause request (a real SIGTERM from the parent);
                  with --pause-batch B it waits after the B-th training batch
                  ("BATCH B") instead.
    resume        fit(ckpt_path=<pause file>) in a fresh process, to step N.
    plain-pause   plain Lightning: ModelCheckpoint every step, no ResumeCallback;
                  waits at step K for Lightning's own SIGTERM handling to stop it.
    plain-resume  plain Lightning: fit(ckpt_path=<last ModelCheckpoint file>) to N.
    kill-pickling / kill-fsync
                  ModelCheckpoint with DurableCheckpointIO; the second save blocks
                  (while pickling, or at the temp file's fsync) after printing
                  "SAVING" so that the parent can SIGKILL it mid-write.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainer_resume.adapters.lightning import DurableCheckpointIO, ResumeCallback
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    build_batch_sampler,
)

SEED = 1234
FEATURES = 8
CONFIG = {
    "model": {"hidden": 32, "dropout": 0.25},
    "optim": {"lr": 0.01, "step_size": 3, "gamma": 0.8},
}
WAIT_S = 300.0  # how long a gate waits for the signal: generous, the machine may be loaded


class AugmentedDataset(Dataset):
    """Fixed samples with random augmentation drawn from the global generators."""

    def __init__(self, size: int = 48) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, FEATURES, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[index] + 0.1 * torch.randn(FEATURES)
        if random.random() < 0.5:
            x = -x
        x = x * float(np.random.uniform(0.9, 1.1))
        return x, self.y[index]


class Regressor(pl.LightningModule):
    """Dropout, Adam and a per-step LR schedule; records every step's loss."""

    def __init__(self, config: dict[str, Any] = CONFIG) -> None:
        super().__init__()
        self.config = config
        hidden, dropout = config["model"]["hidden"], config["model"]["dropout"]
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )
        self.losses: dict[int, torch.Tensor] = {}
        self.training_steps = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.training_steps += 1
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step + 1] = loss.detach().clone()
        return loss

    def configure_optimizers(self) -> Any:
        optim = self.config["optim"]
        optimizer = torch.optim.Adam(self.parameters(), lr=optim["lr"])
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=optim["step_size"], gamma=optim["gamma"]
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class LoopsRegressor(Regressor):
    """Regressor for the loop features: dict batches of several loaders, validation,
    OmegaConf hyper-parameters; records every training and validation batch's loss."""

    def __init__(self, config: Any = CONFIG, *, dictconfig: bool = False) -> None:
        super().__init__(config)
        if dictconfig:
            self.save_hyperparameters(OmegaConf.create(config))
        self.batch_losses: dict[str, torch.Tensor] = {}
        self.val_losses: dict[str, torch.Tensor] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.training_steps += 1
        parts = list(batch.values()) if isinstance(batch, dict) else [batch]
        loss = sum(nn.functional.mse_loss(self.net(x), y) for x, y in parts)
        self.batch_losses[f"e{self.current_epoch}b{batch_idx}"] = loss.detach().clone()
        self.losses[self.global_step + 1] = loss.detach().clone()
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        # The random draw makes the validation's place in the RNG sequence visible.
        loss = nn.functional.mse_loss(self.net(x), y) + 0.01 * torch.rand(())
        if not self.trainer.sanity_checking:
            self.val_losses[f"s{self.global_step}b{batch_idx}"] = loss.clone()
        self.log("val_loss", loss)


def build_epoch_loader(
    *, workers: int, size: int = 24, batch_size: int = 4, bundled_sampler: bool = False
) -> ResumableDataLoader:
    """Shuffled epochs that end (``len`` = batches per epoch), resumable at any batch: the
    DataLoader drop-in (``shuffle=True``) or the bundled per-epoch batch sampler."""
    dataset = AugmentedDataset(size)
    if not bundled_sampler:
        return ResumableDataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers, resumable=True
        )
    batches = build_batch_sampler(
        "naive", dataset, batch_size, repeat=False, shuffle=True, drop_last=False, resumable=True
    )
    return ResumableDataLoader(dataset, batch_sampler=batches, num_workers=workers, resumable=True)


def build_val_loader() -> DataLoader:
    data = AugmentedDataset(8)
    return DataLoader(TensorDataset(data.x, data.y), batch_size=4)


def build_loader(*, workers: int, size: int = 48, batch_size: int = 4) -> ResumableDataLoader:
    dataset = AugmentedDataset(size)
    return ResumableDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=InfiniteRandomSampler(dataset, resumable=True),
        num_workers=workers,
        resumable=True,
    )


def build_trainer(
    *,
    steps: int,
    epoch_batches: int,
    callbacks: list[pl.Callback],
    checkpointing: bool = False,
    max_epochs: int = -1,
    **kwargs: Any,
) -> pl.Trainer:
    return pl.Trainer(
        max_steps=steps,
        max_epochs=max_epochs,
        limit_train_batches=epoch_batches or None,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )


class StepGate(pl.Callback):
    """Prints each finished step; at step ``pause_step`` waits until ``ready()`` is true.

    With ``pause_batch``, prints and waits by training batch instead (batches differ
    from steps under gradient accumulation).
    """

    def __init__(self, pause_step: int, ready: Any, pause_batch: int | None = None) -> None:
        self.pause_step = pause_step
        self.ready = ready
        self.pause_batch = pause_batch
        self.batches = 0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.batches += 1
        if self.pause_batch is not None:
            print(f"BATCH {self.batches}", flush=True)
            if self.batches != self.pause_batch:
                return
        else:
            print(f"STEP {trainer.global_step}", flush=True)
            if trainer.global_step != self.pause_step:
                return
        deadline = time.monotonic() + WAIT_S
        while not self.ready(trainer):
            if time.monotonic() > deadline:
                print("no signal arrived", file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.01)


class _BlockWhilePickled:
    """Blocks ``torch.save`` mid-write: pickling it announces itself and sleeps."""

    def __reduce__(self) -> Any:
        print("SAVING", flush=True)
        time.sleep(WAIT_S)
        raise RuntimeError("the parent should have killed this process")


class _KillTarget(pl.Callback):
    """Records the weights at step 1, then makes the second save block."""

    def __init__(self, out: Path, point: str) -> None:
        self.out = out
        self.point = point

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step == 1:
            torch.save(
                {k: v.clone() for k, v in pl_module.state_dict().items()},
                self.out / "weights_step1.pt",
            )
        if trainer.global_step == 2 and self.point == "fsync":

            def blocking_fsync(fd: int) -> None:
                print("SAVING", flush=True)
                time.sleep(WAIT_S)

            os.fsync = blocking_fsync

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        if trainer.global_step == 2 and self.point == "pickling":
            # Allowed, so DurableCheckpointIO's weights-only check lets it through to pickling.
            torch.serialization.add_safe_globals([_BlockWhilePickled])
            checkpoint["block"] = _BlockWhilePickled()


RECORDS = ("batch_losses", "val_losses", "epoch_metrics")


def result(model: Regressor, trainer: pl.Trainer, **extra: Any) -> dict[str, Any]:
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    return {
        "losses": dict(model.losses),
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "global_step": trainer.global_step,
        "training_steps": model.training_steps,
        **{name: dict(getattr(model, name)) for name in RECORDS if hasattr(model, name)},
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pause-step", type=int, default=5)
    parser.add_argument("--epoch-batches", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pause-batch", type=int, default=None)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--val-check-interval", type=float, default=1.0)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--max-epochs", type=int, default=-1)
    parser.add_argument("--epoch-loader", choices=["drop-in", "batch-sampler"], default=None)
    parser.add_argument("--two-loaders", action="store_true")
    parser.add_argument("--dictconfig", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    pause_file = out / "pause.ckpt"

    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    features = (
        args.validate,
        args.accumulate > 1,
        args.epoch_loader,
        args.two_loaders,
        args.dictconfig,
    )
    loops = any(features)
    model = LoopsRegressor(dictconfig=args.dictconfig) if loops else Regressor()

    def build(**options: Any) -> Any:
        if args.epoch_loader is None:
            return build_loader(**options)
        return build_epoch_loader(bundled_sampler=args.epoch_loader == "batch-sampler", **options)

    loader: Any = build(workers=args.workers)
    if args.two_loaders:
        loader = {"a": loader, "b": build(workers=args.workers, size=32, batch_size=2)}
    common: dict[str, Any] = {"steps": args.steps, "epoch_batches": args.epoch_batches}
    if loops:
        common.update(
            max_epochs=args.max_epochs,
            accumulate_grad_batches=args.accumulate,
            val_check_interval=args.val_check_interval,
            limit_val_batches=None if args.validate else 0,
        )
    validation = {"val_dataloaders": build_val_loader()} if args.validate else {}

    if args.mode == "reference":
        trainer = build_trainer(callbacks=[], **common)
        trainer.fit(model, loader, **validation)
        torch.save(result(model, trainer), out / "result_reference.pt")
    elif args.mode in ("pause", "resume"):
        resume = ResumeCallback(pause_file, config=CONFIG)
        callbacks: list[pl.Callback] = [resume]
        if args.mode == "pause":
            gate = StepGate(args.pause_step, lambda _: resume.pause_requested, args.pause_batch)
            callbacks.insert(0, gate)
        trainer = build_trainer(callbacks=callbacks, **common)
        ckpt_path = resume.ckpt_path if args.mode == "resume" else None
        trainer.fit(model, loader, ckpt_path=ckpt_path, **validation)
        print(f"PAUSED {resume.paused_at_step}", flush=True)
        torch.save(
            result(model, trainer, paused_at_step=resume.paused_at_step),
            out / f"result_{args.mode}.pt",
        )
    elif args.mode in ("plain-pause", "plain-resume"):
        checkpoints = ModelCheckpoint(
            dirpath=out / "plain",
            filename="last",
            every_n_train_steps=1,
            save_top_k=1,
            enable_version_counter=False,
        )
        callbacks = [checkpoints]
        if args.mode == "plain-pause":
            callbacks.insert(0, StepGate(args.pause_step, lambda trainer: trainer.received_sigterm))
        trainer = build_trainer(callbacks=callbacks, checkpointing=True, **common)
        ckpt = out / "plain" / "last.ckpt" if args.mode == "plain-resume" else None
        try:
            trainer.fit(model, loader, ckpt_path=ckpt)
        finally:  # Lightning ends a SIGTERM'd fit with SIGTERMException (a SystemExit)
            torch.save(result(model, trainer), out / f"result_{args.mode}.pt")
    elif args.mode in ("kill-pickling", "kill-fsync"):
        checkpoints = ModelCheckpoint(
            dirpath=out / "ckpts",
            filename="model",
            every_n_train_steps=1,
            save_top_k=1,
            enable_version_counter=False,
        )
        trainer = build_trainer(
            callbacks=[_KillTarget(out, args.mode.split("-", 1)[1]), checkpoints],
            checkpointing=True,
            plugins=[DurableCheckpointIO()],
            **common,
        )
        trainer.fit(model, loader)
        return 4  # the parent kills this process during the second save
    else:
        parser.error(f"unknown mode {args.mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
