"""A checkpoint that does not fit is refused before Lightning restores anything from it:
the LightningModule is byte-for-byte what it was, whichever checkpoint IO the trainer uses."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from support import lightning_child as child
from torch import nn

from trainer_resume.adapters.lightning import DurableCheckpointIO, ResumeCallback
from trainer_resume.errors import ConfigSignatureMismatchError, ResumeStateMismatchError

IOS = {"lightning_io": None, "durable_io": DurableCheckpointIO}


class _RequestPauseAt(pl.Callback):
    def __init__(self, step: int, resume: ResumeCallback) -> None:
        self.step, self.resume = step, resume

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.resume.request_pause()


def _fit(
    directory: Path,
    model: pl.LightningModule,
    *,
    io: Any = None,
    config: Any = child.CONFIG,
    ckpt_path: Any = None,
    pause_at: int | None = None,
) -> None:
    resume = ResumeCallback(directory / "pause.ckpt", config=config)
    callbacks: list[pl.Callback] = [resume]
    if pause_at is not None:
        callbacks.insert(0, _RequestPauseAt(pause_at, resume))
    plugins = [io()] if io is not None else None
    trainer = child.build_trainer(steps=6, epoch_batches=0, callbacks=callbacks, plugins=plugins)
    trainer.fit(model, child.build_loader(workers=0), ckpt_path=ckpt_path)


@pytest.fixture(scope="module", params=sorted(IOS))
def paused(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A pause file at step 3, written with the trainer's own IO or DurableCheckpointIO."""
    directory = tmp_path_factory.mktemp("paused")
    torch.manual_seed(child.SEED)
    _fit(directory, child.Regressor(), io=IOS[request.param], pause_at=3)
    return {"pause": directory / "pause.ckpt", "io": IOS[request.param]}


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _assert_untouched(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key


def _refused(paused: dict, tmp_path: Path, model: pl.LightningModule, error: type, **options: Any):
    shutil.copy(paused["pause"], tmp_path / "pause.ckpt")
    torch.manual_seed(child.SEED + 1)  # weights that differ from the paused run's
    before = _snapshot(model)
    with pytest.raises(error) as caught:
        _fit(tmp_path, model, io=paused["io"], ckpt_path=tmp_path / "pause.ckpt", **options)
    _assert_untouched(model, before)
    assert model.training_steps == 0
    return str(caught.value)


def _fresh(config: Any = child.CONFIG) -> child.Regressor:
    torch.manual_seed(child.SEED + 1)
    return child.Regressor(config)


def test_a_pause_of_another_config_is_refused_with_the_module_untouched(paused, tmp_path):
    changed = {**child.CONFIG, "optim": {**child.CONFIG["optim"], "lr": 0.02}}
    message = _refused(
        paused, tmp_path, _fresh(changed), ConfigSignatureMismatchError, config=changed
    )
    assert message.startswith(f"[323] {ConfigSignatureMismatchError.message}: {tmp_path}")
    assert "optim.lr" in message


def test_a_checkpoint_of_a_model_with_another_shape_is_refused_before_any_tensor_is_copied(
    paused, tmp_path
):
    model = _fresh()
    model.net[3] = nn.Linear(child.CONFIG["model"]["hidden"], 2)  # net.0 still fits
    message = _refused(paused, tmp_path, model, ResumeStateMismatchError)
    assert message == (
        f"[330] {ResumeStateMismatchError.message}: {tmp_path / 'pause.ckpt'}: Regressor: "
        "'net.3.weight' has shape [1, 32] in the checkpoint, [2, 32] here"
    )


def test_a_checkpoint_missing_a_layer_of_the_model_is_refused(paused, tmp_path):
    model = _fresh()
    model.net.append(nn.Linear(1, 1))
    message = _refused(paused, tmp_path, model, ResumeStateMismatchError)
    assert message == (
        f"[330] {ResumeStateMismatchError.message}: {tmp_path / 'pause.ckpt'}: Regressor: "
        "missing from the checkpoint: 'net.4.weight', 'net.4.bias'"
    )


class _TwoGroups(child.Regressor):
    """The same parameters in two groups: the saved optimizer state has one."""

    def configure_optimizers(self) -> Any:
        weights = [p for name, p in self.named_parameters() if name.endswith("weight")]
        biases = [p for name, p in self.named_parameters() if name.endswith("bias")]
        return torch.optim.Adam([{"params": weights}, {"params": biases}], lr=0.01)


def test_an_optimizer_that_does_not_fit_is_refused_when_it_exists_and_the_module_is_put_back(
    paused, tmp_path
):
    # The module fits, so Lightning restores it; the optimizers exist only later.
    torch.manual_seed(child.SEED + 1)
    message = _refused(paused, tmp_path, _TwoGroups(), ResumeStateMismatchError)
    assert message == (
        f"[330] {ResumeStateMismatchError.message}: {tmp_path / 'pause.ckpt'}: optimizer 0 "
        "(Adam): 1 parameter groups in the checkpoint, 2 in this optimizer; build it with the "
        "paused run's parameter groups (and add any group the paused run added before its pause)"
    )


class _Smaller(child.Regressor):
    """Without its last layer, loaded non-strictly: the module fits, the optimizer state cannot."""

    strict_loading = False

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(child.FEATURES, child.CONFIG["model"]["hidden"]))


def test_optimizer_state_of_more_parameters_than_the_module_has_is_refused_before_the_restore(
    paused, tmp_path
):
    torch.manual_seed(child.SEED + 1)
    message = _refused(paused, tmp_path, _Smaller(), ResumeStateMismatchError)
    assert message == (
        f"[330] {ResumeStateMismatchError.message}: {tmp_path / 'pause.ckpt'}: optimizer 0 "
        "holds the state of 4 parameters, _Smaller has 2"
    )
