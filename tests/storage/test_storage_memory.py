"""Paths that are URLs, on fsspec's in-memory filesystem: what is refused at once, what
is written whole or not at all, and what is read back verified."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from support.point_trainers import points_trainer
from support.trainers import TinyTrainer

from trainer_resume import ResumePoints, SkippedCheckpointWarning
from trainer_resume.difference import first_difference
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointWriteError,
    RunFinishedError,
    StorageURLError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.storage import objects
from trainer_resume.storage.urls import filesystem, is_url


@pytest.fixture
def url() -> str:
    """A fresh prefix on the in-memory filesystem."""
    return f"memory://runs-{uuid.uuid4().hex}"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("where", "package"),
    [("gs://bucket/run/pause.ckpt", "gcsfs"), ("abfs://c/run/pause.ckpt", "adlfs")],
)
def test_a_pause_to_an_uninstalled_scheme_is_refused_naming_the_package_and_creates_no_folder(
    in_tmp: Path, where: str, package: str
) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    with pytest.raises(StorageURLError, match=package):
        trainer.pause(where)
    with pytest.raises(StorageURLError, match=package):
        trainer.pause_on_signal(where)
    with pytest.raises(StorageURLError, match=package):
        trainer.request_pause(where)
    with pytest.raises(StorageURLError, match=package):
        ResumePoints(where.rsplit("/", 1)[0], every_steps=1)
    with pytest.raises(StorageURLError, match=package):
        TinyTrainer().resume(where)
    assert list(in_tmp.iterdir()) == []


def test_a_scheme_fsspec_does_not_know_is_refused(in_tmp: Path) -> None:
    with pytest.raises(StorageURLError, match="'nosuch'"):
        save_checkpoint({"a": 1}, "nosuch://bucket/a.ckpt")
    assert list(in_tmp.iterdir()) == []


def test_file_urls_and_windows_drives_are_local_paths(tmp_path: Path) -> None:
    assert not is_url("C:/runs/pause.ckpt") and not is_url(f"file://{tmp_path}/a.ckpt")
    save_checkpoint({"a": torch.ones(2)}, f"file://{tmp_path}/a.ckpt")
    assert torch.equal(load_checkpoint(tmp_path / "a.ckpt")["a"], torch.ones(2))


def test_a_pause_at_a_url_resumes_exactly(url: str) -> None:
    reference = TinyTrainer()
    expected = [reference.train_step() for _ in range(5)]
    trainer = TinyTrainer()
    trainer.train_step(), trainer.train_step()
    trainer.pause(f"{url}/pause.ckpt")
    resumed = TinyTrainer()
    resumed.resume(f"{url}/pause.ckpt")
    for want in expected[2:]:
        assert torch.equal(resumed.train_step(), want)
    assert first_difference(reference.state(), resumed.state()) is None


def test_a_failed_upload_leaves_the_previous_object_intact(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = f"{url}/pause.ckpt"
    save_checkpoint({"step": 1, "w": torch.arange(4)}, target)
    real_upload = objects.upload

    def failing(where: str, pieces) -> None:
        def broken():
            iterator = iter(pieces)
            yield next(iterator)
            raise OSError("connection reset")

        real_upload(where, broken())

    monkeypatch.setattr(objects, "upload", failing)
    with pytest.raises(CheckpointWriteError, match="previous object there is intact"):
        save_checkpoint({"step": 2, "w": torch.zeros(1000)}, target)
    monkeypatch.undo()
    loaded = load_checkpoint(target)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.arange(4))


def test_a_damaged_object_is_refused_before_anything_is_unpickled(url: str) -> None:
    target = f"{url}/pause.ckpt"
    save_checkpoint({"w": torch.arange(1000)}, target)
    fs, path = filesystem(target)
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    with pytest.raises(CheckpointCorruptedError):
        load_checkpoint(target)


def test_resume_latest_at_a_url_skips_a_damaged_point_for_the_one_before(url: str) -> None:
    trainer = points_trainer(url, every_steps=2, keep=3, when_busy="wait")
    for _ in range(4):
        trainer.train_step()
    trainer.points.wait()
    fs = fsspec.filesystem("memory")
    newest = f"{url}/point-000000000004.ckpt"
    fs.pipe_file(newest, fs.cat_file(newest)[:-10])
    resumed = TinyTrainer()
    with pytest.warns(SkippedCheckpointWarning, match="point-000000000004"):
        assert resumed.resume_latest(url) == f"{url}/point-000000000002.ckpt"
    assert resumed.completed_steps == 2
    assert not os.path.exists("memory:")


def test_a_run_finished_before_its_first_point_at_a_url_is_found_finished(url: str) -> None:
    trainer = points_trainer(url, every_steps=100)
    trainer.train_step()
    trainer.finish(f"{url}/pause.ckpt")
    with pytest.raises(RunFinishedError):
        TinyTrainer().resume_latest(url)


def test_a_sharded_models_pause_to_a_url_is_refused_before_anything_is_written(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_resume.mixin import _pause, _pause_request
    from trainer_resume.sharded.detect import ShardedObjects

    sharded = ShardedObjects({"model": ["optimizer"]})
    monkeypatch.setattr(_pause, "sharded_objects", lambda objects: sharded)
    monkeypatch.setattr(_pause_request, "sharded_objects", lambda objects: sharded)
    trainer = TinyTrainer()
    trainer.train_step()
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"\[332\].*shared file system"):
        trainer.pause_on_signal(f"{url}/pause.ckpt")
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"\[332\].*\(model, optimizer\)"):
        trainer.pause(f"{url}/pause.ckpt")
    assert objects.list_names(url) == []


def test_export_reads_a_pause_at_a_url_and_writes_the_weights_to_a_url(url: str) -> None:
    from trainer_resume.export import export_checkpoint

    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(f"{url}/pause.ckpt")
    result = export_checkpoint(f"{url}/pause.ckpt", f"{url}/weights.pt")
    fs, path = filesystem(f"{url}/weights.pt")
    with fs.open(path, "rb") as exported:
        weights = torch.load(exported, weights_only=True)
    assert first_difference(trainer.model.state_dict(), weights) is None
    assert result.file_bytes == fs.size(path)
    with pytest.raises(CheckpointFormatError, match=r"\[321\].* is a prefix of objects"):
        export_checkpoint(url, f"{url}/again.pt")  # the prefix, not the pause in it
    with pytest.raises(FileNotFoundError):
        export_checkpoint(f"{url}/nothing.ckpt", f"{url}/again.pt")


def test_a_scheme_in_capitals_names_the_same_place(url: str) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(url.upper().split("://")[0] + "://" + url.split("://")[1] + "/pause.ckpt")
    resumed = TinyTrainer()
    resumed.resume(f"{url}/pause.ckpt")
    assert first_difference(trainer.model.state_dict(), resumed.model.state_dict()) is None
    assert objects.list_names(url) == ["pause.ckpt"]


@pytest.mark.parametrize("where", ["s3:/bucket/run/pause.ckpt", "memory:/run/pause.ckpt"])
def test_a_url_with_a_slash_missing_is_refused_and_creates_no_folder(
    in_tmp: Path, where: str
) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    scheme = where.split(":")[0]
    with pytest.raises(StorageURLError, match=f"write '{scheme}://"):
        trainer.pause(where)
    with pytest.raises(StorageURLError, match="a slash missing"):
        trainer.pause_on_signal(where)
    with pytest.raises(StorageURLError, match="a slash missing"):
        TinyTrainer().resume(where)
    assert list(in_tmp.iterdir()) == []
    trainer.pause(f"./{where}")  # a local folder named after the scheme, said so
    assert (in_tmp / where).is_file()


class _BrokenFileSystem(fsspec.AbstractFileSystem):
    """A scheme whose filesystem cannot be set up here (as hdfs:// without a JVM)."""

    protocol = "brokenfs"

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise OSError("Unable to load libjvm\nmore lines of the loader")


def test_a_filesystem_that_cannot_be_set_up_is_refused_with_353(in_tmp: Path) -> None:
    fsspec.register_implementation("brokenfs", _BrokenFileSystem, clobber=True)
    trainer = TinyTrainer()
    trainer.train_step()
    with pytest.raises(
        StorageURLError, match=r"could not be set up: OSError: Unable to load libjvm$"
    ):
        trainer.pause("brokenfs://cluster/run/pause.ckpt")
    assert list(in_tmp.iterdir()) == []


def test_resume_latest_of_a_pause_file_instead_of_its_directory_is_refused(url: str) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(f"{url}/pause.ckpt")
    fresh = TinyTrainer()
    with pytest.raises(CheckpointFormatError, match=r"\[321\].*is a file, not a resume-point"):
        fresh.resume_latest(f"{url}/pause.ckpt")
    assert fresh.completed_steps == 0
    assert fresh.resume_latest(url) == f"{url}/pause.ckpt"  # its directory
    assert fresh.completed_steps == 1
