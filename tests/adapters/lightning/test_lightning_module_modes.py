"""A module's modes (submodules in eval mode, frozen parameters), which its ``state_dict()``
leaves out, resume as the uninterrupted fit left them: set by the training itself, by an
epoch hook the resumed fit skips mid-epoch, or changed since a hook the resumed fit runs
again (in one process, fresh objects)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BaseFinetuning
from support import lightning_child as child
from support import lightning_trace as trace
from torch import nn

from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.testing import first_difference

BATCHES = 4  # per epoch; 3 epochs, a validation after each
CHANGE_STEP = 5  # the step at which the training changes the modes


class Moded(child.Regressor):
    """A BatchNorm and a Dropout whose modes change during the fit, as ``how`` says:

    - ``step``: the training puts both in eval mode and freezes the first layer at
      ``CHANGE_STEP``, and leaves them so;
    - ``epoch``: ``on_train_epoch_start`` puts them in eval mode in odd epochs;
    - ``train_start``: ``on_train_start`` puts the BatchNorm in eval mode (a frozen
      BatchNorm), the training puts it back in train mode at ``CHANGE_STEP``;
    - ``finetuning``: :class:`Unfreezing` (a callback) changes them;
    - ``validation``: each validation's end freezes or unfreezes the last layer (as a
      metric-driven schedule does), also the validation a pause leaves pending.
    """

    def __init__(self, how: str, record: list[Any]) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(child.FEATURES, 16),
            nn.BatchNorm1d(16),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(16, 1),
        )
        self.how = how
        self.record = record

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == CHANGE_STEP:
            if self.how == "step":
                self.net[1].eval()
                self.net[3].eval()
                self.net[0].weight.requires_grad_(False)
            elif self.how == "train_start":
                self.net[1].train()
        loss = super().training_step(batch, batch_idx)
        modes = tuple(module.training for module in self.net)
        self.record.append(("train", self.global_step, loss.detach().clone(), modes))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self) -> None:
        if self.how == "validation" and not self.trainer.sanity_checking:
            weight = self.net[4].weight
            weight.requires_grad_(not weight.requires_grad)

    def on_train_start(self) -> None:
        if self.how == "train_start":
            self.net[1].eval()

    def on_train_epoch_start(self) -> None:
        if self.how == "epoch":
            odd = self.current_epoch % 2 == 1
            self.net[1].train(not odd)
            self.net[3].train(not odd)


class Unfreezing(BaseFinetuning):
    """Lightning's fine-tuning recipe: the first layer and the BatchNorm frozen before
    training (the BatchNorm with ``train_bn=False``: eval mode, no running statistics),
    both trainable again from epoch 1."""

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.freeze(pl_module.net[:2], train_bn=False)

    def finetune_function(
        self, pl_module: pl.LightningModule, epoch: int, optimizer: torch.optim.Optimizer
    ) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.net[:2], optimizer, train_bn=True)


def _fit(
    directory: Path,
    how: str,
    record: list[Any],
    *,
    pause_at_batch: int | None = None,
    ckpt_path: Any = None,
) -> tuple[Moded, pl.Trainer, ResumeCallback]:
    model = Moded(how, record)
    callback = ResumeCallback(directory / "pause.ckpt", config=child.CONFIG)
    callbacks: list[pl.Callback] = [callback]
    if how == "finetuning":
        callbacks.insert(0, Unfreezing())
    if pause_at_batch is not None:
        callbacks.insert(0, trace.RequestPauseAt(pause_at_batch, callback))
    trainer = _trainer(callbacks)
    _run(trainer, model, ckpt_path)
    return model, trainer, callback


def _trainer(callbacks: list[pl.Callback]) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_epochs=3,
        limit_train_batches=BATCHES,
        callbacks=callbacks,
    )


def _run(trainer: pl.Trainer, model: Moded, ckpt_path: Any) -> None:
    trainer.fit(
        model,
        train_dataloaders=child.build_loader(workers=0),
        val_dataloaders=trace.val_loader(),
        ckpt_path=ckpt_path,
    )


def _outcome(model: Moded, trainer: pl.Trainer) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "training": [module.training for module in model.modules()],
        "requires_grad": [parameter.requires_grad for parameter in model.parameters()],
        "track_running_stats": model.net[1].track_running_stats,
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[list[Any], dict[str, Any]]] = {}

    def run(how: str) -> tuple[list[Any], dict[str, Any]]:
        if how not in cache:
            record: list[Any] = []
            trace.seed_everything()
            model, trainer, _ = _fit(tmp_path_factory.mktemp(how), how, record)
            cache[how] = record, _outcome(model, trainer)
        return cache[how]

    return run


# Batch 6: mid-epoch, after the change; batch 8: an epoch's last batch (validation due).
@pytest.mark.parametrize("pause_at", [6, 8])
@pytest.mark.parametrize("how", ["step", "epoch", "train_start", "finetuning", "validation"])
def test_a_resumed_fit_trains_with_the_modes_the_paused_one_had(
    how: str, pause_at: int, tmp_path: Path, uninterrupted: Any
) -> None:
    expected_record, expected = uninterrupted(how)
    record: list[Any] = []
    trace.seed_everything()
    _, _, callback = _fit(tmp_path, how, record, pause_at_batch=pause_at)
    assert callback.paused
    paused_record = list(record)
    assert len(paused_record) == pause_at
    record.clear()
    model, trainer, resumed = _fit(tmp_path, how, record, ckpt_path=tmp_path / "pause.ckpt")
    assert not resumed.paused
    difference = first_difference(expected_record, paused_record + record)
    assert difference is None, difference
    difference = first_difference(expected, _outcome(model, trainer))
    assert difference is None, difference


def test_saved_modes_naming_a_submodule_the_module_lacks_are_refused_before_the_restore(
    tmp_path: Path,
) -> None:
    record: list[Any] = []
    trace.seed_everything()
    _fit(tmp_path, "step", record, pause_at_batch=6)
    model = Moded("step", [])
    # The same state_dict() keys, without the Dropout the pause saw in eval mode.
    model.net = nn.Sequential(OrderedDict((str(i), model.net[i]) for i in (0, 1, 2, 4)))
    trainer = _trainer([ResumeCallback(tmp_path / "pause.ckpt", config=child.CONFIG)])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ResumeStateMismatchError, match="submodule 'net.3' was in eval mode"):
        _run(trainer, model, tmp_path / "pause.ckpt")
    assert first_difference(before, model.state_dict()) is None


def test_a_pause_file_of_an_earlier_release_resumes_with_a_warning_that_it_holds_no_modes(
    tmp_path: Path,
) -> None:
    _fit(tmp_path, "none", [], pause_at_batch=3)
    content = load_checkpoint(tmp_path / "pause.ckpt")
    for key in ("module_modes", "accumulate_grad_batches"):
        del content["trainer_resume"][key]
    save_checkpoint(content, tmp_path / "pause.ckpt")  # as an earlier release wrote it
    with pytest.warns(UserWarning, match="written by an earlier release"):
        _, _, resumed = _fit(tmp_path, "none", [], ckpt_path=tmp_path / "pause.ckpt")
    assert not resumed.paused
