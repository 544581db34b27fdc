"""Our Lightning files (pause file, DurableCheckpointIO checkpoints) read as Lightning reads
its own: load_from_checkpoint, plain checkpoint dicts, Trainer.validate/test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from support import lightning_child as child
from torch.utils.data import DataLoader, TensorDataset

from trainer_resume.adapters.lightning import (
    DurableCheckpointIO,
    ResumeCallback,
    load_from_checkpoint,
    plain_lightning_checkpoint,
)
from trainer_resume.errors import CheckpointFormatError, CheckpointSignatureError
from trainer_resume.testing import first_difference

KEY = b"files-key-of-16+bytes"


class ConfiguredModel(child.Regressor):
    """Takes an OmegaConf config, saves it as its hyper-parameters (Lightning's usual pairing)."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(OmegaConf.to_container(cfg))
        self.save_hyperparameters(cfg)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))


def _eval_loader() -> DataLoader:
    data = child.AugmentedDataset(8)  # its fixed samples, without the random augmentation
    return DataLoader(TensorDataset(data.x, data.y), batch_size=4)


class _PauseAt(pl.Callback):
    def __init__(self, step: int, callback: ResumeCallback) -> None:
        self.step, self.callback = step, callback

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.callback.request_pause()


def _train(directory: Path, name: str, plugins: list[Any]) -> None:
    torch.manual_seed(child.SEED)
    checkpoints = ModelCheckpoint(
        dirpath=directory, filename=name, every_n_train_steps=2, enable_version_counter=False
    )
    resume = ResumeCallback(directory / f"{name}-pause.ckpt")
    trainer = child.build_trainer(
        steps=3,
        epoch_batches=0,
        callbacks=[checkpoints, _PauseAt(2, resume), resume],
        checkpointing=True,
        plugins=plugins,
    )
    trainer.fit(ConfiguredModel(OmegaConf.create(child.CONFIG)), child.build_loader(workers=0))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run twice: through DurableCheckpointIO (signed) and through Lightning's own IO."""
    directory = tmp_path_factory.mktemp("files")
    _train(directory, "durable", [DurableCheckpointIO(key=KEY)])
    _train(directory, "plain", [])
    return directory


def _module_state(model: pl.LightningModule) -> dict[str, Any]:
    return {
        "weights": model.state_dict(),
        "hparams": OmegaConf.to_container(model.hparams),
        "device": model.device,
    }


def test_load_from_checkpoint_gives_what_lightning_gives_for_the_plain_file(files: Path) -> None:
    ours = load_from_checkpoint(ConfiguredModel, files / "durable.ckpt", key=KEY)
    lightnings = ConfiguredModel.load_from_checkpoint(files / "plain.ckpt", weights_only=False)
    assert isinstance(ours.hparams, DictConfig) and type(ours.hparams) is type(lightnings.hparams)
    assert first_difference(_module_state(lightnings), _module_state(ours)) is None
    assert ours.training == lightnings.training


def test_load_from_checkpoint_reads_a_pause_file_and_takes_hyperparameter_overrides(
    files: Path,
) -> None:
    model = load_from_checkpoint(ConfiguredModel, files / "durable-pause.ckpt", key=KEY)
    paused = plain_lightning_checkpoint(files / "durable-pause.ckpt", key=KEY)
    assert first_difference(paused["state_dict"], model.state_dict()) is None

    changed = OmegaConf.create({**child.CONFIG, "model": {"hidden": 32, "dropout": 0.5}})
    overridden = load_from_checkpoint(ConfiguredModel, files / "durable.ckpt", key=KEY, cfg=changed)
    assert overridden.hparams.model.dropout == 0.5


def test_plain_lightning_checkpoint_equals_lightnings_own_file_of_the_same_run(files: Path) -> None:
    ours = plain_lightning_checkpoint(files / "durable.ckpt", key=KEY)
    lightnings = torch.load(files / "plain.ckpt", weights_only=False)
    assert sorted(ours) == sorted(lightnings)
    for name in (
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "loops",
        "global_step",
        "epoch",
    ):
        assert first_difference(lightnings[name], ours[name]) is None, name
    assert ours["hyper_parameters"] == lightnings["hyper_parameters"]
    assert ours["hparams_type"] is lightnings["hparams_type"]


def test_plain_lightning_checkpoint_of_a_pause_file_saves_as_a_file_lightning_loads(
    files: Path, tmp_path: Path
) -> None:
    plain = plain_lightning_checkpoint(files / "durable-pause.ckpt", key=KEY)
    assert plain["global_step"] == 2 and isinstance(plain["hyper_parameters"], DictConfig)
    torch.save(plain, tmp_path / "exported.ckpt")
    model = ConfiguredModel.load_from_checkpoint(tmp_path / "exported.ckpt", weights_only=False)
    assert first_difference(plain["state_dict"], model.state_dict()) is None


def test_our_files_are_refused_without_their_key_and_foreign_files_with_a_format_error(
    files: Path,
) -> None:
    with pytest.raises(CheckpointSignatureError):
        plain_lightning_checkpoint(files / "durable.ckpt", key=b"another-key-of-16+bytes")
    with pytest.raises(CheckpointFormatError) as caught:
        load_from_checkpoint(ConfiguredModel, files / "plain.ckpt")
    assert caught.value.code == 321


@pytest.mark.parametrize(
    ("stage", "name"), [("validate", "durable.ckpt"), ("test", "durable-pause.ckpt")]
)
def test_trainer_validate_and_test_read_our_files_through_the_plugin(
    stage: str, name: str, files: Path
) -> None:
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    with_file = pl.Trainer(plugins=[DurableCheckpointIO(key=KEY)], **options)
    torch.manual_seed(0)
    [from_file] = getattr(with_file, stage)(
        ConfiguredModel(OmegaConf.create(child.CONFIG)),
        dataloaders=_eval_loader(),
        ckpt_path=files / name,
        verbose=False,
    )

    loaded = load_from_checkpoint(ConfiguredModel, files / name, key=KEY)
    [direct] = getattr(pl.Trainer(**options), stage)(
        loaded, dataloaders=_eval_loader(), verbose=False
    )
    assert from_file == direct and len(direct) == 1
