"""PyTorch Lightning training that survives preemption bit-identically.

    python examples/lightning_quickstart.py configs/lightning_example.yaml

Stop it with ``kill -TERM <pid>`` (or ``--preempt-at-step 60`` to have it signal
itself), then run the same command again: it resumes from the pause file and ends
with exactly the weights of an uninterrupted run. ``key=value`` arguments override
the config (e.g. ``run_dir=/tmp/run trainer.max_steps=50``).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import Dataset

from trainer_resume.adapters.lightning import DurableCheckpointIO, ResumeCallback
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader


class NoisyRegression(Dataset):
    """A fixed regression problem; every read adds fresh random noise (augmentation)."""

    def __init__(self, samples: int, features: int, noise: float) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(samples, features, generator=generator)
        self.y = self.x @ torch.randn(features, 1, generator=generator)
        self.noise = noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Global RNG on purpose: the loader replays it exactly after a resume.
        return self.x[index] + self.noise * torch.randn_like(self.x[index]), self.y[index]


class Regressor(pl.LightningModule):
    def __init__(self, cfg: DictConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.net = nn.Sequential(
            nn.Linear(cfg.data.features, cfg.model.hidden),
            nn.ReLU(),
            nn.Dropout(cfg.model.dropout),
            nn.Linear(cfg.model.hidden, 1),
        )

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.cfg.optim.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, self.cfg.optim.step_size, self.cfg.optim.gamma
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class PreemptAt(pl.Callback):
    """Sends this process SIGTERM after the given step, as a cluster would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", help="OmegaConf YAML, e.g. configs/lightning_example.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument(
        "--preempt-at-step", type=int, default=None, help="send SIGTERM to itself after this step"
    )
    args = parser.parse_args()
    cfg = OmegaConf.merge(OmegaConf.load(args.config), OmegaConf.from_dotlist(args.overrides))
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(cfg.seed)
    model = Regressor(cfg)
    data = NoisyRegression(cfg.data.samples, cfg.data.features, cfg.data.noise)
    loader = ResumableDataLoader(
        data,
        batch_size=cfg.data.batch_size,
        sampler=InfiniteRandomSampler(data, resumable=True),  # endless, resumable stream
        num_workers=cfg.data.num_workers,
        resumable=True,
    )

    # (1) The callback: pauses on SIGTERM/SIGUSR1 and signs the config; run_dir only says
    # where files go, so it is left out (it may move between a pause and the resume).
    resume = ResumeCallback(run_dir / "pause.ckpt", config=cfg, config_ignore=["run_dir"])
    if resume.finished:  # run again after it completed (a requeued job): nothing to do
        print(f"the run in {run_dir} is finished; weights in {run_dir / 'final_weights.pt'}")
        return
    callbacks: list[pl.Callback] = [
        resume,
        ModelCheckpoint(
            dirpath=run_dir / "checkpoints",
            every_n_train_steps=cfg.trainer.checkpoint_every_n_steps,
        ),
    ]
    if args.preempt_at_step is not None:
        callbacks.insert(0, PreemptAt(args.preempt_at_step))
    trainer = pl.Trainer(
        max_steps=cfg.trainer.max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        callbacks=callbacks,
        plugins=[DurableCheckpointIO()],  # optional: makes the ModelCheckpoint files durable too
    )
    # (2) ckpt_path: the pause file when there is one, else None (a fresh start).
    trainer.fit(model, loader, ckpt_path=resume.ckpt_path)

    if resume.paused:
        print(f"paused at step {resume.paused_at_step}; run the same command to resume")
        return
    torch.save(model.state_dict(), run_dir / "final_weights.pt")
    print(f"finished {trainer.global_step} steps; weights in {run_dir / 'final_weights.pt'}")


if __name__ == "__main__":
    main()
