"""The deterministic trainers of the compatibility fixtures, for every package layout.

``make_fixtures.py`` runs these against an older checkout of the library to write its
files; ``test_compat_files.py`` resumes those files with the current
code and runs the same trainers uninterrupted. So this module imports only names that
every layout has made public (``trainer_resume``, ``trainer_resume.loaders``) and
nothing else of the tests.

Each trainer draws from every global generator in its steps (dropout, a noisy input),
so a resume that restored the wrong RNG state, loader position or optimizer state
would continue differently.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume import ResumePoints, TrainingResumeMixin, random_state, training_step
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

CONFIG = {"model": {"hidden": 6, "dropout": 0.25}, "optim": {"lr": 0.05}, "data": {"size": 12}}
VERSION = "compat/1"
BATCH = 2
STEPS = 6  # every run ends here
PAUSE_STEP = 3  # the single-file pause
POINT_EVERY = 2  # resume points after steps 2 and 4 (only the newest is kept)
POINT_STEPS = 4  # the newest point
SHARDED_PAUSE_STEP = 2
SHARDED_STEPS = 4
WORLD = 2
RANK_DEADLINE_S = 300.0  # bounds a hang: spawned ranks start slowly on a loaded machine


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    size = CONFIG["data"]["size"]
    return TensorDataset(
        torch.randn(size, 4, generator=generator), torch.randn(size, 1, generator=generator)
    )


def _module() -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, CONFIG["model"]["hidden"]),
        nn.ReLU(),
        nn.Dropout(CONFIG["model"]["dropout"]),
        nn.Linear(CONFIG["model"]["hidden"], 1),
    )


class CompatTrainer(TrainingResumeMixin):
    """A small trainer: Dropout, AdamW, a per-step LR schedule, a resumable loader and
    an input noise drawn from Python's and NumPy's generators.

    ``distribute`` (the sharded ranks) shards the model's Linears with ``fully_shard``.
    """

    def __init__(
        self,
        *,
        resume_points: ResumePoints | None = None,
        distribute: Callable[[nn.Module], None] | None = None,
        config: Any = CONFIG,
    ) -> None:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        self.model = _module()
        if distribute is not None:
            distribute(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=CONFIG["optim"]["lr"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 0.9**step)
        dataset = _dataset()
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            sampler=InfiniteRandomSampler(
                dataset, generator=torch.Generator().manual_seed(11), resumable=True
            ),
            resumable=True,
        )
        self.batches = iter(self.loader)
        self.seen = 0  # extra state: an int and a tensor
        self.loss_average = torch.zeros(())
        self.losses: list[torch.Tensor] = []  # of the steps run by this object
        rank = dist.get_rank() if dist.is_initialized() else 0
        torch.manual_seed(100 + rank)  # each rank's own dropout masks
        random.seed(100 + rank)
        np.random.seed(100 + rank)
        self._initialize_training_resume(config, version=VERSION, resume_points=resume_points)

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"seen": self.seen, "loss_average": self.loss_average}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.seen, self.loss_average = state["seen"], state["loss_average"].clone()

    def _rebuild_resume_iterators(self) -> None:
        self.batches = iter(self.loader)

    @training_step
    def step(self) -> None:
        inputs, targets = next(self.batches)
        noise = random.gauss(0.0, 0.1) + float(np.random.uniform(-0.1, 0.1))
        loss = nn.functional.mse_loss(self.model(inputs + noise), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.seen += len(inputs)
        self.loss_average = 0.9 * self.loss_average + 0.1 * loss.detach()
        self.losses.append(loss.detach().clone())

    def run_to(self, steps: int) -> None:
        while self.completed_steps < steps:
            self.step()

    def outcome(self) -> dict[str, Any]:
        """What an exact continuation must reproduce: every state (DTensors as this
        rank's shard), the losses of the steps this object ran, and the generators now."""
        return _local(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "loader": self.loader.state_dict(),
                "extra": self._resume_extra_state(),
                "losses": self.losses,
                "completed_steps": self.completed_steps,
                "rng": random_state(),
            }
        )


def _local(value: Any) -> Any:
    """Plain tensors: a DTensor becomes this rank's shard."""
    if hasattr(value, "to_local"):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _local(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_local(item) for item in value]
    return value


# ----------------------------------------------------------------------- the files


def write_single_pause(path: Path, config: Any = CONFIG) -> None:
    """A pause file after ``PAUSE_STEP`` steps, signing ``config``."""
    trainer = CompatTrainer(config=config)
    trainer.run_to(PAUSE_STEP)
    trainer.pause(path)
    trainer.loader.close()


def write_resume_points(directory: Path) -> None:
    """A resume-point directory whose newest (and only kept) point is after ``POINT_STEPS``."""
    points = ResumePoints(directory, every_steps=POINT_EVERY, keep=1, when_busy="wait")
    trainer = CompatTrainer(resume_points=points)
    trainer.run_to(POINT_STEPS)
    points.wait()
    trainer.loader.close()


def fit_lightning(
    directory: Path, *, pause_at: int | None = None, resume: bool = False, config: Any = CONFIG
) -> Any:
    """A Lightning fit of the same model to ``STEPS`` (or until a pause after step
    ``pause_at``) with its pause file ``directory / "pause.ckpt"``, resumed from that file
    if ``resume``, ``config`` signed; returns its outcome, like ``CompatTrainer.outcome``."""
    import pytorch_lightning as pl

    from trainer_resume.adapters.lightning import ResumeCallback

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _module()
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            noise = random.gauss(0.0, 0.1) + float(np.random.uniform(-0.1, 0.1))
            loss = nn.functional.mse_loss(self.net(inputs + noise), targets)
            self.losses.append(loss.detach().clone())
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=CONFIG["optim"]["lr"])
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    class PauseAfter(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == pause_at:
                callback.request_pause()  # written by the callback after this one

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    module = Regressor()
    dataset = _dataset()
    loader = ResumableDataLoader(
        dataset,
        batch_size=BATCH,
        sampler=InfiniteRandomSampler(
            dataset, generator=torch.Generator().manual_seed(11), resumable=True
        ),
        resumable=True,
    )
    callback = ResumeCallback(directory / "pause.ckpt", signals=(), config=config)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PauseAfter(), callback] if pause_at is not None else [callback],
    )
    trainer.fit(module, loader, ckpt_path=callback.path if resume else None)
    loader.close()
    return _local(
        {
            "model": module.state_dict(),
            "optimizer": trainer.optimizers[0].state_dict(),
            "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
            "loader": loader.state_dict(),
            "losses": module.losses,
            "global_step": trainer.global_step,
            "rng": random_state(),
        }
    )


# ----------------------------------------------------------------------- sharded ranks


def _shard(model: nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def sharded_rank(rank: int, init_file: str, job: str, directory: str, out: str) -> None:
    """One of ``WORLD`` gloo ranks of an FSDP2 (``fully_shard``) trainer.

    ``job`` "pause": pause to ``directory`` after ``SHARDED_PAUSE_STEP`` steps. ``job``
    "continue": run to ``SHARDED_STEPS`` uninterrupted, then resume ``directory`` in a
    fresh trainer and run to the same step; both outcomes go to ``out``.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        if job == "pause":
            trainer = CompatTrainer(distribute=_shard)
            trainer.run_to(SHARDED_PAUSE_STEP)
            trainer.pause(directory)
            trainer.loader.close()
        else:
            reference = CompatTrainer(distribute=_shard)
            reference.run_to(SHARDED_STEPS)
            reference.loader.close()
            resumed = CompatTrainer(distribute=_shard)
            resumed.resume(directory)
            resumed.run_to(SHARDED_STEPS)
            resumed.loader.close()
            torch.save(
                {"reference": reference.outcome(), "resumed": resumed.outcome()},
                Path(out, f"rank{rank}.pt"),
            )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_sharded_ranks(job: str, directory: Path, scratch: Path) -> None:
    """Run ``sharded_rank`` on ``WORLD`` spawned ranks; a rank that fails or outlives
    ``RANK_DEADLINE_S`` ends them all with an error."""
    context = mp.start_processes(
        sharded_rank,
        args=(str(scratch / f"init-{job}"), job, str(directory), str(scratch)),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + RANK_DEADLINE_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"the {job} ranks did not finish within {RANK_DEADLINE_S} s")
