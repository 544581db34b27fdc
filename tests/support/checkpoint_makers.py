"""Real files of every kind the export and inspect tests read, with the weights they must hold.

Each maker trains briefly, writes its file the way a user's run does and returns
the path with the trainer's own ``state_dict()`` at that moment. Files are made once
per test session (the distributed one spawns two ranks).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step

DATASET_SIZE = 12
BATCH_SIZE = 4
STEPS = 5  # 20 samples delivered: cycle 1, offset 8
LIGHTNING_PAUSE_STEP = 3
DISTRIBUTED_PAUSE_STEP = 3

_DISTRIBUTED_DEADLINE_S = 600.0

_made: dict[str, Any] = {}


def _net() -> nn.Module:
    # BatchNorm: buffers (running stats, num_batches_tracked) must be exported too.
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


class MixinTrainer(TrainingResumeMixin):
    def __init__(self, *, num_replicas: int = 1, resume_points: Any = None) -> None:
        torch.manual_seed(0)
        random.seed(0)  # the pause's Python RNG position must not depend on earlier tests
        self.model = _net()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(DATASET_SIZE, 4), torch.randn(DATASET_SIZE, 3))
        self.loader = ResumableDataLoader(
            data,
            batch_size=BATCH_SIZE,
            sampler=InfiniteRandomSampler(data, resumable=True, num_replicas=num_replicas, rank=0),
            resumable=True,
        )
        self.batches = iter(self.loader)
        self.seen = 0
        config = {"lr": 0.01, "batch_size": BATCH_SIZE}
        self._initialize_training_resume(
            config, version="inspect-test/1", resume_points=resume_points
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"seen": self.seen, "warmed_up": True}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]

    @training_step
    def step(self) -> None:
        inputs, targets = next(self.batches)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.seen += len(inputs)


def clone_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def mixin_pause(
    tmp_path_factory: pytest.TempPathFactory, *, num_replicas: int = 1
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A single-process pause file after ``STEPS`` steps, and the model's state then.

    With ``num_replicas=2`` the process reads rank 0's half of a 2-rank sharded stream.
    """
    name = f"mixin{num_replicas}"
    if name not in _made:
        path = tmp_path_factory.mktemp(name) / "pause.ckpt"
        trainer = MixinTrainer(num_replicas=num_replicas)
        for _ in range(STEPS):
            trainer.step()
        trainer.pause(path)
        trainer.loader.close()
        _made[name] = (path, clone_state(trainer.model))
    return _made[name]


def resume_point_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Resume points after steps 2 and 4, then a pause file at ``STEPS`` in the same directory."""
    if "points" not in _made:
        from trainer_resume.resume_points import ResumePoints

        directory = tmp_path_factory.mktemp("points")
        points = ResumePoints(directory, every_steps=2, when_busy="wait")
        trainer = MixinTrainer(resume_points=points)
        for _ in range(STEPS):
            trainer.step()
        points.wait()
        trainer.pause(directory / "pause.ckpt")
        trainer.loader.close()
        _made["points"] = directory
    return _made["points"]


class _Features(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(DATASET_SIZE * 2, 4, generator=generator)
        self.y = torch.randn(DATASET_SIZE * 2, 3, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def lightning_module_class() -> type:
    """The LightningModule of the Lightning files (built lazily: Lightning imports slowly)."""
    if "module_class" in _made:
        return _made["module_class"]
    import pytorch_lightning as pl

    class SmallModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    _made["module_class"] = SmallModule
    return SmallModule


def lightning_pause(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A ``ResumeCallback`` pause file written at ``LIGHTNING_PAUSE_STEP``; the module state."""
    if "lightning" not in _made:
        import pytorch_lightning as pl

        from trainer_resume.adapters.lightning import DurableCheckpointIO, ResumeCallback

        class PauseAt(pl.Callback):
            def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
                if trainer.global_step == LIGHTNING_PAUSE_STEP - 1:
                    resume.request_pause()  # written at the end of the next batch

        path = tmp_path_factory.mktemp("lightning") / "pause.ckpt"
        resume = ResumeCallback(path, signals=(), config={"lr": 0.01})
        torch.manual_seed(0)
        module = lightning_module_class()()
        dataset = _Features()
        loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH_SIZE,
            sampler=InfiniteRandomSampler(dataset, resumable=True),
            resumable=True,
        )
        trainer = pl.Trainer(
            max_steps=10,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[resume, PauseAt()],
        )
        trainer.fit(module, loader)
        assert resume.paused_at_step == LIGHTNING_PAUSE_STEP
        # The same trainer's checkpoints written by Lightning's own IO and by DurableCheckpointIO.
        trainer.save_checkpoint(path.with_name("lightning.ckpt"))
        trainer.strategy.checkpoint_io = DurableCheckpointIO()
        trainer.save_checkpoint(path.with_name("durable.ckpt"))
        _made["lightning"] = (path, clone_state(module))
    return _made["lightning"]


def lightning_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Lightning checkpoints of the paused trainer: ``(plain, durable)`` (DurableCheckpointIO)."""
    path, _ = lightning_pause(tmp_path_factory)
    return path.with_name("lightning.ckpt"), path.with_name("durable.ckpt")


def distributed_pause(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A pause file of a 2-rank DDP run (gloo); rank 0's model state at the pause."""
    if "distributed" not in _made:
        from support.ddp_workers import describe_exits, launch, load_results

        out = tmp_path_factory.mktemp("distributed")
        path = out / "pause.ckpt"
        job = {"tag": "paused", "steps": 10, "requests": {DISTRIBUTED_PAUSE_STEP: [str(path), 1]}}
        # A deadline only a hung run reaches: ranks start slowly on a loaded machine.
        codes = launch(2, job, out, timeout=_DISTRIBUTED_DEADLINE_S)
        assert codes == [0, 0], describe_exits(codes, "paused", out)
        results = load_results(2, "paused", out)
        assert results[0]["paused_at"] == [DISTRIBUTED_PAUSE_STEP]
        _made["distributed"] = (path, results[0]["model"])
    return _made["distributed"]
