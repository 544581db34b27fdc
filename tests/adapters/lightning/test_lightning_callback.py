"""ResumeCallback behaviour in one process: how it pauses, what the pause file holds,
what it refuses before any training step, and how it leaves the signal handlers."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from support import lightning_child as child

from trainer_resume import declare_no_random_draws
from trainer_resume.adapters.lightning import DurableCheckpointIO, ResumeCallback
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    ConfigSignatureMismatchError,
    ResumeStateMismatchError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.signature import config_signature


class _RequestPauseAt(pl.Callback):
    def __init__(self, step: int, resume: ResumeCallback) -> None:
        self.step = step
        self.resume = resume

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.resume.request_pause()


class _FailAt(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 2:
            raise RuntimeError("training failed")


def _fit(
    directory: Path,
    *,
    steps: int = 6,
    config: Any = child.CONFIG,
    ckpt_path: Any = None,
    before: tuple[pl.Callback, ...] = (),
    pause_at: int | None = None,
    resume: ResumeCallback | None = None,
    **trainer_options: Any,
) -> tuple[child.Regressor, pl.Trainer, ResumeCallback, Any]:
    torch.manual_seed(child.SEED)
    model = child.Regressor(config)
    loader = child.build_loader(workers=0)
    resume = resume or ResumeCallback(directory / "pause.ckpt", config=config)
    callbacks = [*before, resume]
    if pause_at is not None:
        callbacks.insert(0, _RequestPauseAt(pause_at, resume))
    trainer = child.build_trainer(
        steps=steps, epoch_batches=0, callbacks=callbacks, **trainer_options
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model, trainer, resume, loader


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pause file written at step 3 of 6 (workers=0, endless epoch: Lightning prefetches)."""
    directory = tmp_path_factory.mktemp("paused")
    _, trainer, resume, loader = _fit(directory, pause_at=3)
    assert resume.paused_at_step == 3 and trainer.global_step == 3
    # Lightning pulled one batch ahead of training: the loader itself is at 4.
    assert loader.state_dict()["delivered_batches"] == 4
    return directory / "pause.ckpt"


def test_pause_file_records_the_delivered_loader_position_not_lightnings_prefetch(
    paused_run: Path,
) -> None:
    checkpoint = load_checkpoint(paused_run)
    [state] = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state["delivered_batches"] == 3
    assert checkpoint["global_step"] == 3


def test_pause_file_adds_main_process_rng_and_config_signature_to_lightnings_checkpoint(
    paused_run: Path,
) -> None:
    checkpoint = load_checkpoint(paused_run)  # weights-only by construction
    entry = checkpoint["trainer_resume"]
    assert entry["config_signature"] == config_signature(child.CONFIG)
    assert entry["world_size"] == 1 and entry["global_step"] == 3
    [rng] = entry["rng"]
    assert isinstance(rng["torch"], torch.Tensor) and rng["torch"].dtype == torch.uint8
    for key in (
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "loops",
        "pytorch-lightning_version",
    ):
        assert key in checkpoint


_LAST_MODEL: list[child.Regressor] = []


def caught_model() -> child.Regressor | None:
    return _LAST_MODEL[-1] if _LAST_MODEL else None


@pytest.fixture(autouse=True)
def _track_models(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the last model built by _fit, so a test can look at it after fit raised.
    _LAST_MODEL.clear()
    original = child.Regressor.__init__

    def init(self: child.Regressor, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _LAST_MODEL.append(self)

    monkeypatch.setattr(child.Regressor, "__init__", init)


def test_resume_with_a_different_config_is_refused_before_any_training_step(
    paused_run: Path, tmp_path: Path
) -> None:
    shutil.copy(paused_run, tmp_path / "pause.ckpt")
    changed = {**child.CONFIG, "optim": {**child.CONFIG["optim"], "lr": 0.02}}
    with pytest.raises(ConfigSignatureMismatchError) as caught:
        _fit(tmp_path, config=changed, ckpt_path=tmp_path / "pause.ckpt")
    assert caught.value.code == 323
    assert "optim.lr" in str(caught.value) and str(tmp_path / "pause.ckpt") in str(caught.value)
    model = caught_model()
    assert model is not None and model.training_steps == 0


def test_a_resume_that_ignores_the_changed_key_fits_on_and_its_pause_records_the_paths(
    paused_run: Path, tmp_path: Path
) -> None:
    shutil.copy(paused_run, tmp_path / "pause.ckpt")
    changed = {**child.CONFIG, "note": "a key the paused run did not have"}
    resume = ResumeCallback(tmp_path / "pause.ckpt", config=changed, config_ignore=["note"])
    _fit(tmp_path, config=changed, ckpt_path=tmp_path / "pause.ckpt", resume=resume, pause_at=4)
    assert resume.paused_at_step == 4
    assert load_checkpoint(tmp_path / "pause.ckpt")["trainer_resume"]["config_ignore"] == ["note"]
    with pytest.raises(ConfigSignatureMismatchError) as caught:
        _fit(tmp_path, config=changed, ckpt_path=tmp_path / "pause.ckpt")
    assert "was paused with config_ignore=['note'] and this run passes config_ignore=[]" in (
        caught.value.detail
    )


def test_config_ignore_without_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config_ignore names keys of config"):
        ResumeCallback(tmp_path / "pause.ckpt", config_ignore=["logger"])


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", [_truncate, _flip_payload_byte], ids=["truncated", "altered_byte"]
)
def test_damaged_pause_file_fails_with_integrity_error_before_any_training_step(
    damage: Any, paused_run: Path, tmp_path: Path
) -> None:
    target = tmp_path / "pause.ckpt"
    shutil.copy(paused_run, target)
    damage(target)
    with pytest.raises(CheckpointCorruptedError) as caught:
        _fit(tmp_path, ckpt_path=target)
    assert caught.value.code == 322 and str(target) in str(caught.value)
    model = caught_model()
    assert model is not None and model.training_steps == 0


def _malformed_rng(entry: dict) -> None:
    del entry["rng"][0]["torch"]


def _two_processes(entry: dict) -> None:
    entry["world_size"] = 2
    entry["rng"] = entry["rng"] * 2


@pytest.mark.parametrize(
    ("edit", "error", "code"),
    [(_malformed_rng, CheckpointFormatError, 321), (_two_processes, ResumeStateMismatchError, 330)],
    ids=["malformed_rng", "other_world_size"],
)
def test_pause_state_that_cannot_be_honoured_is_refused_before_any_training_step(
    edit: Any, error: type[Exception], code: int, paused_run: Path, tmp_path: Path
) -> None:
    checkpoint = load_checkpoint(paused_run)
    edit(checkpoint["trainer_resume"])
    save_checkpoint(checkpoint, tmp_path / "pause.ckpt")
    with pytest.raises(error) as caught:
        _fit(tmp_path, ckpt_path=tmp_path / "pause.ckpt")
    assert caught.value.code == code and str(tmp_path / "pause.ckpt") in str(caught.value)
    model = caught_model()
    assert model is not None and model.training_steps == 0


def test_request_pause_from_another_thread_stops_fit_normally_at_the_next_batch(
    tmp_path: Path,
) -> None:
    resume = ResumeCallback(tmp_path / "pause.ckpt", config=child.CONFIG)
    reached, requested = threading.Event(), threading.Event()

    class _Handshake(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                reached.set()
                assert requested.wait(timeout=30)

    def request() -> None:
        if reached.wait(timeout=60):
            resume.request_pause()
            requested.set()

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    _, trainer, _, _ = _fit(tmp_path, before=(_Handshake(),), resume=resume)
    thread.join(timeout=30)
    assert resume.paused_at_step == 2 and trainer.global_step == 2
    assert trainer.state.status == "finished"
    assert load_checkpoint(tmp_path / "pause.ckpt")["global_step"] == 2


def test_sigterm_during_fit_becomes_a_pause_instead_of_lightnings_sigterm_exception(
    tmp_path: Path,
) -> None:
    class _SendSigterm(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    _, trainer, resume, _ = _fit(tmp_path, before=(_SendSigterm(),))
    # Python runs the handler between bytecodes; the pause lands at step 2 or, at
    # the latest, at the end of step 3 if delivery is late.
    assert resume.paused_at_step in (2, 3) and trainer.global_step == resume.paused_at_step
    assert not trainer.received_sigterm
    assert trainer.state.status == "finished"
    assert signal.getsignal(signal.SIGTERM) == previous


def test_previous_signal_handlers_are_back_after_fit(tmp_path: Path) -> None:
    calls: list[int] = []

    def sentinel(signum: int, frame: Any) -> None:
        calls.append(signum)

    before = {
        number: signal.signal(number, sentinel) for number in (signal.SIGTERM, signal.SIGUSR1)
    }
    try:
        _fit(tmp_path, pause_at=2)
        assert signal.getsignal(signal.SIGTERM) is sentinel
        assert signal.getsignal(signal.SIGUSR1) is sentinel
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_after_a_failed_fit_a_signal_still_reaches_the_previous_handler(tmp_path: Path) -> None:
    calls: list[int] = []

    def sentinel(signum: int, frame: Any) -> None:
        calls.append(signum)

    before = signal.signal(signal.SIGUSR1, sentinel)
    try:
        with pytest.raises(RuntimeError, match="training failed"):
            _fit(tmp_path, before=(_FailAt(),))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_trainer_held_by_min_steps_stops_at_the_pause_and_gets_its_minimum_back(
    tmp_path: Path,
) -> None:
    # Lightning ignores should_stop until min_steps is met; the pause stops it anyway.
    model, trainer, resume, _ = _fit(tmp_path, pause_at=2, min_steps=6)
    assert resume.paused_at_step == 2 and model.training_steps == 2
    assert load_checkpoint(tmp_path / "pause.ckpt")["global_step"] == 2
    assert trainer.fit_loop.epoch_loop.min_steps == 6  # for the trainer's next fit


def test_resuming_from_a_checkpoint_without_pause_state_warns_that_it_is_not_exact(
    tmp_path: Path,
) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        filename="last",
        every_n_train_steps=2,
        enable_version_counter=False,
    )
    _fit(
        tmp_path,
        steps=2,
        before=(checkpoints,),
        checkpointing=True,
        plugins=[DurableCheckpointIO()],
    )
    # The first fit completed, so its pause path is marked finished: the resume pauses elsewhere.
    resume = ResumeCallback(tmp_path / "resumed.ckpt", config=child.CONFIG)
    with pytest.warns(UserWarning, match="not a pause file"):
        _, trainer, _, _ = _fit(
            tmp_path,
            steps=4,
            ckpt_path=tmp_path / "ckpts" / "last.ckpt",
            plugins=[DurableCheckpointIO()],
            resume=resume,
        )
    assert trainer.global_step == 4


class _FiniteStatefulStream:
    """Four batches per pass and no length, so Lightning prefetches; saves its position."""

    def __init__(self) -> None:
        self.position = 0
        self.data = child.AugmentedDataset(16)

    def __iter__(self) -> Any:
        for _ in range(4):
            index = self.position % len(self.data)
            self.position += 1
            x, y = self.data.x[index : index + 1], self.data.y[index : index + 1]
            yield x, y

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def _pause_finite_stream(directory: Path, step: int) -> None:
    torch.manual_seed(child.SEED)
    resume = ResumeCallback(directory / "pause.ckpt")
    trainer = child.build_trainer(
        steps=8, epoch_batches=0, callbacks=[_RequestPauseAt(step, resume), resume]
    )
    # Its batches draw no random numbers: its own state resumes it exactly.
    trainer.fit(child.Regressor(), declare_no_random_draws(_FiniteStatefulStream()))


@pytest.mark.parametrize("step", [2, 4, 6])
def test_pause_saves_the_trained_position_of_a_prefetched_finite_stream(
    step: int, tmp_path: Path
) -> None:
    _pause_finite_stream(tmp_path, step)
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"position": step}]


def test_pause_at_the_first_batch_of_a_later_epoch_of_a_prefetched_finite_stream_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        _pause_finite_stream(tmp_path, 5)
    assert caught.value.code == 332 and "limit_train_batches" in str(caught.value)
    assert not (tmp_path / "pause.ckpt").exists()


def test_without_the_plugin_model_checkpoint_files_keep_lightnings_format_and_io(
    tmp_path: Path,
) -> None:
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        filename="last",
        every_n_train_steps=2,
        enable_version_counter=False,
    )
    _, trainer, _, _ = _fit(
        tmp_path, steps=4, pause_at=2, before=(checkpoints,), checkpointing=True
    )
    original = trainer.strategy.checkpoint_io
    assert type(original).__name__ == "TorchCheckpointIO"
    assert torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=True)["global_step"] == 2
    # The pause file itself is read through the verified loader, then the IO is put back.
    again = ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        filename="last",
        every_n_train_steps=2,
        enable_version_counter=False,
    )
    _, resumed, _, _ = _fit(
        tmp_path, steps=4, before=(again,), checkpointing=True, ckpt_path=tmp_path / "pause.ckpt"
    )
    assert resumed.global_step == 4
    assert type(resumed.strategy.checkpoint_io).__name__ == "TorchCheckpointIO"
    assert torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_a_config_ignore_path_the_config_does_not_have_is_warned_about_when_built(tmp_path):
    import warnings

    from trainer_resume import UnsavedStateWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ResumeCallback(tmp_path / "pause.ckpt", config={"note": 1}, config_ignore=["ntoe"])
        ResumeCallback(tmp_path / "pause.ckpt", config={"note": 1}, config_ignore=["note"])
    assert [(w.category, w.filename) for w in caught] == [(UnsavedStateWarning, __file__)]
    assert str(caught[0].message).startswith("config_ignore names 'ntoe', which the config")
