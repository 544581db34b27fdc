"""A pause holds everything the paused batch's ``on_train_batch_end`` hooks did: those of
the callbacks listed after ``ResumeCallback``, ``ModelCheckpoint``'s save (Lightning runs
checkpoint callbacks last) and the ``LightningModule``'s own, and the step-interval
``ReduceLROnPlateau`` step that follows them.

The pause was written in ``ResumeCallback.on_train_batch_end``, before them: the resumed
fit never ran them for that batch, and an EMA updated in the module's hook, a callback's
count, ``ModelCheckpoint``'s record of its save and a plateau scheduler's step were lost,
silently. Each fit here has fresh objects; the resumed fit must end as the uninterrupted
one did.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from support import lightning_child as child
from support.lightning_trace import RequestPauseAt
from torch.utils.data import DataLoader, TensorDataset

from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.difference import first_difference
from trainer_resume.loaders import ResumableDataLoader

BATCHES = 8  # per epoch; two epochs, a validation at each epoch's end


class Averaged(pl.LightningModule):
    """A regression with an EMA of its weights, updated in its own ``on_train_batch_end``,
    and a plateau scheduler stepped every 3 steps on the training loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.register_buffer("ema", torch.zeros(8, 4))
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        self.losses.append(loss.detach().clone())
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ema.mul_(0.9).add_(0.1 * self.net[0].weight.detach())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        schedule = {
            "scheduler": plateau,
            "interval": "step",
            "frequency": 3,
            "monitor": "train_loss",
        }
        return {"optimizer": optimizer, "lr_scheduler": schedule}


class Counting(pl.Callback):
    """Counts training batches in its state; listed after ``ResumeCallback``."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = state["batches"]


class StopAt(pl.Callback):
    """Stops the fit after training batch ``batch`` (listed after ``ResumeCallback``)."""

    def __init__(self, batch: int) -> None:
        self.batch, self.seen = batch, 0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.seen += 1
        if self.seen == self.batch:
            trainer.should_stop = True


def _fit(
    folder: Path, pause_at: int | None = None, stop_at: int | None = None, **options: Any
) -> dict[str, Any]:
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(BATCHES * 4, 4), torch.randn(BATCHES * 4, 1))
    train = ResumableDataLoader(data, batch_size=4, shuffle=True, resumable=True)
    resume = ResumeCallback(folder / "pause.ckpt", config={"batches": BATCHES})
    checkpoints = ModelCheckpoint(
        dirpath=folder / "ckpts",
        monitor="train_loss",
        save_top_k=2,
        every_n_train_steps=3,
        save_last=True,
        filename="{step}",
    )
    counting = Counting()
    callbacks = [
        *([RequestPauseAt(pause_at, resume)] if pause_at else []),
        resume,
        counting,
        *([StopAt(stop_at)] if stop_at else []),
        checkpoints,
    ]
    module = Averaged()
    steps = options.pop("max_steps", -1)
    trainer = child.build_trainer(
        steps=steps,
        epoch_batches=0,
        max_epochs=2,
        callbacks=callbacks,
        checkpointing=True,
        **options,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, DataLoader(data, batch_size=8), ckpt_path=resume.ckpt_path)
    return {
        "paused": resume.paused,
        "finished": resume.finished,
        "losses": module.losses,
        "state": module.state_dict(),
        "optimizer": trainer.optimizers[0].state_dict(),
        "plateau": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        "counted": counting.batches,
        "checkpoints": {
            key: value
            for key, value in checkpoints.state_dict().items()
            # Lightning's load_state_dict restores neither (the folder is the run's own).
            if key not in ("dirpath", "current_score")
        },
        "files": sorted(os.listdir(folder / "ckpts")) if (folder / "ckpts").exists() else [],
    }


def _relative(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """ModelCheckpoint's record with its paths relative to the run's folder."""
    text = str(folder)
    paths = {k: v.replace(text, "") if isinstance(v, str) else v for k, v in record.items()}
    paths["best_k_models"] = {k.replace(text, ""): v for k, v in record["best_k_models"].items()}
    return paths


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("reference")
    return folder, _fit(folder)


# Batch 2: before ModelCheckpoint's first save (its last.ckpt was saved when the paused
# fit ended, and the resumed one, not knowing it, saved last-v1.ckpt).
# Batch 6: mid-epoch, a plateau step and a ModelCheckpoint save due, no validation.
# Batch 8: the epoch's last, a validation due (left pending by the pause).
# Batch 9: the next epoch's first, a plateau step due.
@pytest.mark.parametrize("batch", [2, 6, 8, 9])
def test_what_the_paused_batchs_later_hooks_did_is_in_the_pause(
    tmp_path: Path, reference: tuple[Path, dict[str, Any]], batch: int
) -> None:
    folder, expected = reference
    paused = _fit(tmp_path, pause_at=batch)
    assert paused["paused"] and len(paused["losses"]) == batch
    resumed = _fit(tmp_path)
    assert not resumed["paused"]
    difference = first_difference(expected["losses"], paused["losses"] + resumed["losses"])
    assert difference is None, f"losses: {difference.describe()}"
    for name in ("state", "optimizer", "plateau", "counted"):
        difference = first_difference(expected[name], resumed[name])
        assert difference is None, f"{name}: {difference.describe()}"
    assert _relative(resumed["checkpoints"], tmp_path) == _relative(expected["checkpoints"], folder)
    assert resumed["files"] == expected["files"]


@pytest.mark.parametrize(
    ("ending", "options"),
    [("max_steps", {"max_steps": 6, "val_check_interval": 3}), ("should_stop", {"stop_at": 6})],
)
def test_a_pause_asked_for_at_the_batch_that_ends_the_fit_lets_it_finish(
    tmp_path: Path, ending: str, options: dict[str, Any]
) -> None:
    # There the fit ends after the validation due; a fit resumed from a pause there
    # ended at once without it (max_steps), or went on training (should_stop).
    expected = _fit(tmp_path / "reference", **options)
    run = _fit(tmp_path / "run", pause_at=6, **options)
    assert not run["paused"] and run["finished"]
    for name in ("losses", "state", "optimizer", "plateau", "counted", "files"):
        difference = first_difference(expected[name], run[name])
        assert difference is None, f"{name}: {difference.describe()}"


# min_steps=10 over 2 epochs of 8 batches; StopAt sets should_stop after batch 3, which
# Lightning ignores until step 10. Paused at batch 2 (before it) and 6 (after it).
@pytest.mark.parametrize("batch", [2, 6])
def test_a_pause_before_min_steps_stops_the_fit_and_carries_a_stop_another_callback_asked_for(
    tmp_path: Path, batch: int
) -> None:
    options = {"stop_at": 3, "min_steps": 10}
    expected = _fit(tmp_path / "reference", **options)
    assert len(expected["losses"]) == 10  # stopped at min_steps, not at max_epochs
    paused = _fit(tmp_path, pause_at=batch, **options)
    assert paused["paused"] and len(paused["losses"]) == batch
    resumed = _fit(tmp_path, **options)
    assert resumed["finished"]
    difference = first_difference(expected["losses"], paused["losses"] + resumed["losses"])
    assert difference is None, f"losses: {difference.describe()}"
    for name in ("state", "optimizer", "plateau", "counted", "files"):
        difference = first_difference(expected[name], resumed[name])
        assert difference is None, f"{name}: {difference.describe()}"


class HandAccumulating(pl.LightningModule):
    """Manual optimization accumulating over 2 batches by hand, as Lightning's docs show."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.manual_backward(loss / 2)
        self.losses.append(loss.detach().clone())
        if (batch_idx + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _fit_by_hand(folder: Path, pause_at: int | None = None) -> dict[str, Any]:
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(BATCHES * 4, 4), torch.randn(BATCHES * 4, 1))
    train = ResumableDataLoader(data, batch_size=4, shuffle=True, resumable=True)
    resume = ResumeCallback(folder / "pause.ckpt", config={"batches": BATCHES})
    module = HandAccumulating()
    trainer = child.build_trainer(
        steps=-1,
        epoch_batches=0,
        max_epochs=2,
        callbacks=[*([RequestPauseAt(pause_at, resume)] if pause_at else []), resume],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train, ckpt_path=resume.ckpt_path)
    optimizer = trainer.optimizers[0]
    return {
        "losses": module.losses,
        "state": module.state_dict(),
        "optimizer": optimizer.state_dict(),
    }


# Batch 3: inside a window (its gradients held); batch 4: at a window's end.
@pytest.mark.parametrize("batch", [3, 4])
def test_a_window_accumulated_by_hand_under_manual_optimization_resumes_with_its_gradients(
    tmp_path: Path, batch: int
) -> None:
    # No pause can wait for a window the loop keeps itself: its gradients were lost.
    expected = _fit_by_hand(tmp_path / "reference")
    paused = _fit_by_hand(tmp_path / "run", pause_at=batch)
    assert len(paused["losses"]) == batch
    resumed = _fit_by_hand(tmp_path / "run")
    difference = first_difference(expected["losses"], paused["losses"] + resumed["losses"])
    assert difference is None, f"losses: {difference.describe()}"
    for name in ("state", "optimizer"):
        difference = first_difference(expected[name], resumed[name])
        assert difference is None, f"{name}: {difference.describe()}"
