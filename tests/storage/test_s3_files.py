"""Against a real S3 server (moto), in this process: a damaged object refused, ``inspect``
on a URL, and a Lightning fit paused to and resumed from ``s3://`` by ``ResumeCallback``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import s3fs
import torch
from support import lightning_child as child
from support.point_trainers import points_trainer

from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.cli import main
from trainer_resume.difference import first_difference
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import CheckpointCorruptedError


def test_a_damaged_object_is_refused_with_322(bucket: str) -> None:
    url = f"{bucket}/run/pause.ckpt"
    save_checkpoint({"w": torch.arange(10_000)}, url)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    path = url[len("s3://") :]
    data = bytearray(fs.cat_file(path))
    data[-100] ^= 0x01
    fs.pipe_file(path, bytes(data))
    with pytest.raises(CheckpointCorruptedError, match=r"\[322\].*BLAKE3 mismatch"):
        load_checkpoint(url)


def _inspect(*arguments: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["inspect", "--json", *arguments]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_reads_a_pause_file_and_a_point_directory_at_a_url(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = points_trainer(f"{bucket}/points", every_steps=2, when_busy="wait")
    for _ in range(4):
        trainer.train_step()
    trainer.points.wait()
    trainer.pause(f"{bucket}/points/pause.ckpt")

    summary = _inspect(f"{bucket}/points/pause.ckpt", capsys=capsys)
    assert summary["kind"] == "pause" and summary["integrity"]["digest_algorithm"] == "BLAKE3"
    assert summary["steps"]["completed_steps"] == 4
    listing = _inspect(f"{bucket}/points", capsys=capsys)
    assert [p["file"] for p in listing["points"]] == [
        "point-000000000004.ckpt",
        "point-000000000002.ckpt",
    ]
    assert [p["file"] for p in listing["pause_files"]] == ["pause.ckpt"]
    assert listing["newest"]["path"] == f"{bucket}/points/pause.ckpt"


def _fit(url: str, *, steps: int, pause_at: int | None = None, resume: bool = False) -> Any:
    torch.manual_seed(child.SEED)
    model = child.Regressor(child.CONFIG)
    callback = ResumeCallback(url, config=child.CONFIG)
    callbacks: list[Any] = [callback]
    if pause_at is not None:
        callbacks.insert(0, _RequestPauseAt(pause_at, callback))
    trainer = child.build_trainer(steps=steps, epoch_batches=0, callbacks=callbacks)
    trainer.fit(
        model, child.build_loader(workers=0), ckpt_path=callback.ckpt_path if resume else None
    )
    return child.result(model, trainer), callback


class _RequestPauseAt(child.pl.Callback):
    def __init__(self, step: int, callback: ResumeCallback) -> None:
        self.step, self.callback = step, callback

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.callback.request_pause()


def test_a_lightning_fit_paused_to_s3_by_resume_callback_resumes_exactly(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"{bucket}/lightning/pause.ckpt"
    expected, _ = _fit(f"{bucket}/reference/pause.ckpt", steps=6)
    _, paused = _fit(url, steps=6, pause_at=3)
    assert paused.paused_at_step == 3
    resumed, callback = _fit(url, steps=6, resume=True)
    # The resumed fit records the losses of the steps it ran, 4 to 6.
    expected["losses"] = {step: loss for step, loss in expected["losses"].items() if step > 3}
    for entry in ("losses", "model", "optimizer", "global_step"):
        assert first_difference(expected[entry], resumed[entry]) is None, entry
    assert callback.finished and list(tmp_path.iterdir()) == []
