"""A bucket that does not answer (its endpoint unreachable) or does not exist is never
taken for an empty one: every question about it raises 355, the command line says so in
one line, and the pause there is intact once the bucket answers again."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
import torch
from support.trainers import TinyTrainer

from trainer_resume import run_finished
from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.cli import main
from trainer_resume.errors import StorageUnavailableError
from trainer_resume.storage import exists, paths, set_storage_options


@contextlib.contextmanager
def _refusing_port() -> Iterator[int]:
    """A port bound and never listened on, held for the test: connections are refused,
    and no other server can take it meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@pytest.fixture
def paused(bucket: str) -> Iterator[tuple[str, list[torch.Tensor]]]:
    """A pause after 2 steps in the bucket and the losses of steps 3 and 4 of the
    uninterrupted run; then the bucket's endpoint pointed at a closed port."""
    reference = TinyTrainer()
    expected = [reference.train_step() for _ in range(4)]
    trainer = TinyTrainer()
    trainer.train_step(), trainer.train_step()
    url = f"{bucket}/run/pause.ckpt"
    trainer.pause(url)
    with _refusing_port() as port:
        set_storage_options(
            bucket,
            {
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
                "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
            },
        )
        try:
            yield url, expected[2:]
        finally:
            set_storage_options(bucket, None)


def test_questions_about_an_unreachable_bucket_raise_355_instead_of_no_such_file(
    paused: tuple[str, list[torch.Tensor]],
) -> None:
    url, _ = paused
    directory = url.rsplit("/", 1)[0]
    for ask in (
        lambda: paths.exists(url),
        lambda: paths.is_dir(directory),
        lambda: paths.list_names(directory),
        lambda: run_finished(url),
        lambda: ResumeCallback(url).ckpt_path,  # None would fit from the start
        lambda: TinyTrainer().resume(url),
    ):
        with pytest.raises(StorageUnavailableError, match=r"\[355\].*Could not connect"):
            ask()


def test_the_command_line_reports_an_unreachable_bucket_in_one_line_with_status_3(
    paused: tuple[str, list[torch.Tensor]], tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = paused
    for arguments in (["inspect", url], ["export", url, str(tmp_path / "weights.pt")]):
        assert main(arguments) == 3
        captured = capsys.readouterr()
        assert captured.err.startswith("error [355]: "), captured.err
        assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_pause_resumes_once_the_bucket_answers_again(
    paused: tuple[str, list[torch.Tensor]], bucket: str
) -> None:
    url, expected = paused
    with pytest.raises(StorageUnavailableError):
        TinyTrainer().resume(url)
    set_storage_options(bucket, None)
    resumed = TinyTrainer()
    resumed.resume(url)
    for want in expected:
        assert torch.equal(resumed.train_step(), want)


def test_a_bucket_that_does_not_exist_raises_355_naming_it_instead_of_no_pause_yet(
    s3_endpoint: str,
) -> None:
    directory = "s3://no-such-bucket-anywhere/run"
    url = f"{directory}/pause.ckpt"
    for ask in (
        lambda: exists(url),
        lambda: paths.is_dir(directory),
        lambda: paths.list_names(directory),
        lambda: run_finished(url),
        lambda: ResumeCallback(url).ckpt_path,
        lambda: TinyTrainer().resume(url),
        lambda: TinyTrainer().resume_latest(directory),
    ):
        with pytest.raises(
            StorageUnavailableError, match=r"\[355\].*'no-such-bucket-anywhere' does not exist"
        ):
            ask()


def test_storage_exists_sees_a_pause_in_a_bucket_and_on_a_disk(bucket: str, tmp_path) -> None:
    for url in (f"{bucket}/run/pause.ckpt", str(tmp_path / "pause.ckpt")):
        assert not exists(url)
        trainer = TinyTrainer()
        trainer.train_step()
        trainer.pause(url)
        assert exists(url)


def test_a_bucket_deleted_during_the_run_raises_355_instead_of_no_pause(bucket: str) -> None:
    from trainer_resume.storage.urls import filesystem

    url = f"{bucket}/run/pause.ckpt"
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(url)
    assert exists(url) and run_finished(url) is None  # the bucket answered: seen to exist
    fs, path = filesystem(bucket)
    fs.rm(path, recursive=True)  # its objects, then the bucket
    fs.invalidate_cache()
    for ask in (
        lambda: exists(url),
        lambda: run_finished(url),
        lambda: TinyTrainer().resume(url),
        lambda: TinyTrainer().resume_latest(url.rsplit("/", 1)[0]),
    ):
        with pytest.raises(StorageUnavailableError, match=r"\[355\].*does not exist"):
            ask()
