"""DurableCheckpointIO: every file Lightning writes goes through the durable writer and
the verified, weights-only loader; a SIGKILL mid-save leaves the previous file."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from support import lightning_child as child
from support import lightning_procs as procs

from trainer_resume.adapters.lightning import DurableCheckpointIO
from trainer_resume.durable import (
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from trainer_resume.errors import (
    CheckpointFormatError,
    CheckpointSignatureError,
    StorageURLError,
    UnsafeCheckpointError,
)


class _WithHyperparameters(child.Regressor):
    def __init__(self, hparams: Any) -> None:
        super().__init__()
        self.save_hyperparameters({"run": hparams})


def _fit(
    directory: Path,
    *,
    model: child.Regressor,
    steps: int,
    callbacks: list[pl.Callback],
    ckpt_path: Path | None = None,
    **options: Any,
) -> pl.Trainer:
    torch.manual_seed(child.SEED)
    trainer = child.build_trainer(
        steps=steps, epoch_batches=3, callbacks=callbacks, checkpointing=True, **options
    )
    trainer.fit(model, child.build_loader(workers=0), ckpt_path=ckpt_path)
    return trainer


def test_model_checkpoint_files_are_durable_and_load_weights_only(tmp_path: Path) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path, filename="{step}", every_n_train_steps=2, save_top_k=-1
    )
    early = EarlyStopping(
        monitor="train_loss_missing", check_on_train_epoch_end=False, strict=False
    )
    model = _WithHyperparameters({"lr": 0.01, "layers": [32, 1], "name": "run-1"})
    _fit(
        tmp_path,
        model=model,
        steps=4,
        callbacks=[checkpoints, early],
        plugins=[DurableCheckpointIO()],
    )

    files = sorted(path.name for path in tmp_path.glob("*.ckpt"))
    assert files == ["step=2.ckpt", "step=4.ckpt"]
    read_checkpoint_header(tmp_path / "step=4.ckpt")  # verified trainer-resume format
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "step=4.ckpt", weights_only=True)  # not a bare torch.save file
    loaded = DurableCheckpointIO().load_checkpoint(tmp_path / "step=4.ckpt")
    assert loaded["global_step"] == 4
    assert loaded["hyper_parameters"] == {"run": {"lr": 0.01, "layers": [32, 1], "name": "run-1"}}
    for name, value in model.state_dict().items():
        assert torch.equal(loaded["state_dict"][name], value), name


def test_fit_resumes_from_a_model_checkpoint_file_written_by_the_plugin(tmp_path: Path) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path, filename="last", every_n_train_steps=2, enable_version_counter=False
    )
    _fit(
        tmp_path,
        model=child.Regressor(),
        steps=2,
        callbacks=[checkpoints],
        plugins=[DurableCheckpointIO()],
    )
    again = ModelCheckpoint(
        dirpath=tmp_path, filename="last", every_n_train_steps=2, enable_version_counter=False
    )
    trainer = _fit(
        tmp_path,
        model=child.Regressor(),
        steps=4,
        callbacks=[again],
        plugins=[DurableCheckpointIO()],
        ckpt_path=tmp_path / "last.ckpt",
    )
    assert trainer.global_step == 4
    assert DurableCheckpointIO().load_checkpoint(tmp_path / "last.ckpt")["global_step"] == 4


def test_model_checkpoint_removes_superseded_files_through_the_plugin(tmp_path: Path) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path, filename="{step}", every_n_train_steps=1, save_top_k=1
    )
    _fit(
        tmp_path,
        model=child.Regressor(),
        steps=3,
        callbacks=[checkpoints],
        plugins=[DurableCheckpointIO()],
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step=3.ckpt"]


def test_omegaconf_hyperparameters_are_stored_as_plain_containers_and_loaded_back_as_configs(
    tmp_path: Path,
) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path, filename="last", every_n_train_steps=2, enable_version_counter=False
    )
    config = OmegaConf.create({"lr": 0.01, "layers": [32, 1], "scaled": "${lr}"})
    _fit(
        tmp_path,
        model=_WithHyperparameters(config),
        steps=2,
        callbacks=[checkpoints],
        plugins=[DurableCheckpointIO()],
    )

    stored = load_checkpoint(tmp_path / "last.ckpt")  # weights-only, no rebuilding
    assert stored["hyper_parameters"] == {"run": {"lr": 0.01, "layers": [32, 1], "scaled": "${lr}"}}
    loaded = DurableCheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    run = loaded["hyper_parameters"]["run"]
    assert isinstance(run, DictConfig) and isinstance(run.layers, ListConfig)
    assert run.scaled == 0.01  # the interpolation survives, unresolved in the file
    assert "trainer_resume_hparams_types" not in loaded


class _Opaque:
    """An object torch's weights-only loading refuses."""


def test_hyperparameters_that_weights_only_loading_would_refuse_are_refused_before_writing(
    tmp_path: Path,
) -> None:
    io = DurableCheckpointIO()
    checkpoint = {
        "pytorch-lightning_version": "2.6.6",
        "hyper_parameters": {"run": {"tokenizer": _Opaque()}},
    }
    with pytest.raises(UnsafeCheckpointError) as caught:
        io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    assert caught.value.code == 328
    assert "['hyper_parameters']['run']['tokenizer'] is a" in str(caught.value)
    assert "_Opaque" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_unsafe_loading_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    save_checkpoint({"pytorch-lightning_version": "2.6.6"}, tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="weights-only"):
        DurableCheckpointIO().load_checkpoint(tmp_path / "a.ckpt", weights_only=False)
    assert DurableCheckpointIO().load_checkpoint(tmp_path / "a.ckpt", weights_only=True) == {
        "pytorch-lightning_version": "2.6.6"
    }


def test_a_trainer_resume_file_that_does_not_hold_a_dict_is_refused(tmp_path: Path) -> None:
    save_checkpoint([torch.zeros(2)], tmp_path / "other.ckpt")
    with pytest.raises(CheckpointFormatError) as caught:
        DurableCheckpointIO().load_checkpoint(tmp_path / "other.ckpt")
    assert caught.value.code == 321 and "list" in str(caught.value)


def test_signed_files_need_the_key(tmp_path: Path) -> None:
    io = DurableCheckpointIO(key=b"secret-key-of-16+bytes")
    io.save_checkpoint(
        {"pytorch-lightning_version": "2.6.6", "x": torch.ones(1)}, tmp_path / "sub" / "s.ckpt"
    )
    assert torch.equal(io.load_checkpoint(tmp_path / "sub" / "s.ckpt")["x"], torch.ones(1))
    with pytest.raises(CheckpointSignatureError):
        other = DurableCheckpointIO(key=b"other-key-of-16+bytes")
        other.load_checkpoint(tmp_path / "sub" / "s.ckpt")


def test_a_url_is_written_as_an_object_and_read_back_verified() -> None:
    io = DurableCheckpointIO()
    url = "memory://lightning-io-test/run/a.ckpt"
    io.save_checkpoint({"pytorch-lightning_version": "2.6.6", "x": torch.arange(3)}, url)
    assert torch.equal(io.load_checkpoint(url)["x"], torch.arange(3))
    assert not Path("memory:").exists()


def test_a_url_of_an_unknown_scheme_is_refused_naming_the_package() -> None:
    with pytest.raises(StorageURLError, match="gcsfs"):
        DurableCheckpointIO().save_checkpoint({}, "gs://bucket/a.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize("point", ["pickling", "fsync"])
def test_sigkill_during_a_model_checkpoint_save_leaves_the_previous_file_intact(
    point: str, tmp_path: Path
) -> None:
    status, lines = procs.run_and_signal(
        procs.child_command(f"kill-{point}", tmp_path, "--steps", "4", "--workers", "0"),
        tmp_path / "stderr.txt",
        line="SAVING",
        signum=procs.SIGKILL,
    )
    assert status == -procs.SIGKILL
    directory = tmp_path / "ckpts"
    # The kill hit the second save mid-write: its temp file is still there.
    assert [path.name for path in directory.iterdir() if path.name.endswith(".tmp")]
    loaded = DurableCheckpointIO().load_checkpoint(directory / "model.ckpt")
    assert loaded["global_step"] == 1
    expected = torch.load(tmp_path / "weights_step1.pt", weights_only=True)
    assert expected.keys() == loaded["state_dict"].keys()
    for name, value in expected.items():
        assert torch.equal(loaded["state_dict"][name], value), name
