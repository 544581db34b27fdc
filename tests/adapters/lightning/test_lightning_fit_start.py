"""What ResumeCallback refuses or warns about when fit starts, before any training step,
and how a completed fit ends the run (finished marker)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from support import lightning_child as child
from torch.utils.data import DataLoader

from trainer_resume import declare_no_random_draws
from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.errors import (
    RunFinishedError,
    UnsafeCheckpointError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.finished import run_finished
from trainer_resume.loaders import ResumableDataLoader


class _Counting(child.Regressor):
    def __init__(self, **hparams: Any) -> None:
        super().__init__()
        if hparams:
            self.save_hyperparameters(hparams)


def _fit(
    directory: Path,
    loader: Any,
    *,
    model: child.Regressor | None = None,
    steps: int = 3,
    **callback_options: Any,
) -> tuple[child.Regressor, pl.Trainer, ResumeCallback]:
    torch.manual_seed(child.SEED)
    model = model or _Counting()
    resume = ResumeCallback(directory / "pause.ckpt", **callback_options)
    trainer = child.build_trainer(steps=steps, epoch_batches=0, callbacks=[resume])
    trainer.fit(model, loader, ckpt_path=resume.ckpt_path)
    return model, trainer, resume


class _RequestPauseAt(pl.Callback):
    def __init__(self, step: int, callback: ResumeCallback) -> None:
        self.step = step
        self.callback = callback

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.callback.request_pause()


def _plain_loader() -> DataLoader:
    return DataLoader(child.AugmentedDataset(16), batch_size=4, shuffle=True)


def test_a_plain_dataloader_is_refused_when_fit_starts_naming_the_resumable_loader(
    tmp_path: Path,
) -> None:
    model = _Counting()
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        _fit(tmp_path, _plain_loader(), model=model)
    assert caught.value.code == 332
    message = str(caught.value)
    assert (
        "(DataLoader)" in message and "ResumableDataLoader" in message and "strict=False" in message
    )
    assert model.training_steps == 0


def test_a_resumable_loader_built_with_resumable_false_is_refused(tmp_path: Path) -> None:
    dataset, model = child.AugmentedDataset(16), _Counting()
    with pytest.raises(UnsupportedResumeConfigurationError, match="resumable=False"):
        _fit(tmp_path, ResumableDataLoader(dataset, batch_size=4, shuffle=True), model=model)
    assert model.training_steps == 0


def test_strict_false_accepts_a_plain_dataloader_with_a_warning_that_the_resume_is_not_exact(
    tmp_path: Path,
) -> None:
    with pytest.warns(UserWarning, match="will not be exact"):
        _, trainer, _ = _fit(tmp_path, _plain_loader(), strict=False)
    assert trainer.global_step == 3


class _SelfSavingLoader(DataLoader):
    """A loader of another library that saves its own position (as torchdata's
    ``StatefulDataLoader`` does): the callback sees only ``state_dict``/``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]:
        return {"batches": 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


_UNDECLARED = (
    "the training loader (_SelfSavingLoader) saves its position, but not the random numbers its "
    "samples draw (its workers are reseeded at each iter()), so a resumed fit would differ "
    "wherever a sample draws one; if its samples draw no random numbers, declare it with "
    "trainer_resume.declare_no_random_draws(loader)"
)


def test_a_loader_from_elsewhere_is_refused_unless_declared(tmp_path: Path) -> None:
    loader = _SelfSavingLoader(child.AugmentedDataset(16), batch_size=4, shuffle=True)
    model = _Counting()
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        _fit(tmp_path, loader, model=model)
    assert caught.value.detail.startswith(_UNDECLARED + "; use trainer_resume.loaders.")
    assert model.training_steps == 0
    (tmp_path / "lenient").mkdir()
    with pytest.warns(UserWarning, match="will not be exact") as warned:
        _fit(tmp_path / "lenient", loader, strict=False)
    assert any(_UNDECLARED in str(warning.message) for warning in warned)


def test_a_declared_loader_from_elsewhere_is_taken_silently(tmp_path: Path) -> None:
    loader = _SelfSavingLoader(child.AugmentedDataset(16), batch_size=4, shuffle=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(exact|vouch)")
        _, trainer, _ = _fit(tmp_path, declare_no_random_draws(loader))
    assert trainer.global_step == 3


def test_one_unsaveable_loader_among_several_is_refused_by_its_name(tmp_path: Path) -> None:
    loaders = {"a": child.build_loader(workers=0), "b": _plain_loader()}
    with pytest.raises(
        UnsupportedResumeConfigurationError, match=r"training loader 1 \(DataLoader\)"
    ):
        _fit(tmp_path, loaders)


def _combined(mode: str, *sizes: int) -> Any:
    from pytorch_lightning.utilities.combined_loader import CombinedLoader

    loaders = {
        f"l{index}": ResumableDataLoader(
            child.AugmentedDataset(size), batch_size=4, shuffle=True, resumable=True
        )
        for index, size in enumerate(sizes)
    }
    return CombinedLoader(loaders, mode=mode)


def test_a_max_size_combined_loader_over_loaders_of_different_lengths_is_refused(
    tmp_path: Path,
) -> None:
    # It gives None for a loader once exhausted, which no checkpoint records: resumed
    # after that, the loader's next epoch was read instead, silently.
    model = child.LoopsRegressor()
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        _fit(tmp_path, _combined("max_size", 16, 8), model=model)
    assert caught.value.detail.startswith(
        'CombinedLoader(mode="max_size") over training loaders of different lengths gives None '
        "for a loader once it is exhausted"
    )
    assert 'use mode="max_size_cycle" (the default) or "min_size"' in caught.value.detail
    assert model.training_steps == 0


@pytest.mark.parametrize(("mode", "sizes"), [("max_size", (16, 16)), ("min_size", (16, 8))])
def test_combined_loaders_that_never_give_none_are_taken(
    tmp_path: Path, mode: str, sizes: tuple[int, int]
) -> None:
    _, trainer, _ = _fit(tmp_path, _combined(mode, *sizes), model=child.LoopsRegressor())
    assert trainer.global_step == 3


def test_a_max_size_combined_loader_whose_epochs_end_before_the_shortest_loader_resumes_exactly(
    tmp_path: Path,
) -> None:
    # Two batches per epoch (limit_train_batches) over loaders of 4 and 2 batches: no
    # loader is ever exhausted inside an epoch, so no None is given and nothing is lost.
    def fit(steps: int, directory: Path, pause_at: int | None = None) -> child.LoopsRegressor:
        torch.manual_seed(child.SEED)
        model = child.LoopsRegressor()
        resume = ResumeCallback(directory / "pause.ckpt")
        callbacks: list[pl.Callback] = [resume]
        if pause_at is not None:
            callbacks.insert(0, _RequestPauseAt(pause_at, resume))
        trainer = child.build_trainer(steps=steps, epoch_batches=2, callbacks=callbacks)
        trainer.fit(model, _combined("max_size", 16, 8), ckpt_path=resume.ckpt_path)
        return model

    reference = fit(6, tmp_path / "reference")
    paused = fit(6, tmp_path, pause_at=3)  # in the middle of the second epoch
    assert sorted(paused.batch_losses) == ["e0b0", "e0b1", "e1b0"]
    resumed = fit(6, tmp_path)
    losses = {**paused.batch_losses, **resumed.batch_losses}
    assert sorted(losses) == sorted(reference.batch_losses)
    for key, value in reference.batch_losses.items():
        assert torch.equal(value, losses[key]), key
    for (name, want), have in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(want, have), name


class _Opaque:
    """Outside torch's weights-only set."""


def test_hyperparameters_a_pause_file_could_not_be_loaded_with_are_refused_before_training(
    tmp_path: Path,
) -> None:
    model = _Counting(tokenizer=_Opaque())
    with pytest.raises(UnsafeCheckpointError) as caught:
        _fit(tmp_path, child.build_loader(workers=0), model=model)
    assert caught.value.code == 328 and "['hyper_parameters']['tokenizer']" in str(caught.value)
    assert model.training_steps == 0


def test_a_completed_fit_marks_the_run_finished_and_retires_the_pause_file(tmp_path: Path) -> None:
    callback = ResumeCallback(tmp_path / "pause.ckpt")
    trainer = child.build_trainer(
        steps=4, epoch_batches=0, callbacks=[_RequestPauseAt(2, callback), callback]
    )
    trainer.fit(_Counting(), child.build_loader(workers=0))
    assert (
        callback.paused
        and not callback.finished
        and callback.ckpt_path == str(tmp_path / "pause.ckpt")
    )

    _, trainer, resumed = _fit(tmp_path, child.build_loader(workers=0), steps=4)
    assert trainer.global_step == 4 and not resumed.paused
    assert resumed.finished and resumed.ckpt_path is None
    assert not (tmp_path / "pause.ckpt").exists()
    finished = run_finished(tmp_path / "pause.ckpt")
    assert finished is not None and finished.completed_steps == 4


def test_a_new_fit_on_a_finished_run_is_refused_instead_of_training_again(tmp_path: Path) -> None:
    _fit(tmp_path, child.build_loader(workers=0))
    model = _Counting()
    with pytest.raises(RunFinishedError) as caught:
        _fit(tmp_path, child.build_loader(workers=0), model=model)
    assert caught.value.code == 340
    assert model.training_steps == 0


def test_a_paused_fit_does_not_mark_the_run_finished(tmp_path: Path) -> None:
    callback = ResumeCallback(tmp_path / "pause.ckpt")
    trainer = child.build_trainer(
        steps=4, epoch_batches=0, callbacks=[_RequestPauseAt(1, callback), callback]
    )
    trainer.fit(_Counting(), child.build_loader(workers=0))
    assert callback.paused_at_step == 1
    assert not callback.finished and run_finished(tmp_path / "pause.ckpt") is None


def test_a_fit_that_resumes_from_last_warns_about_the_exact_pause_file_and_keeps_it(
    tmp_path: Path,
) -> None:
    def trainer_with(callback: ResumeCallback, *before: pl.Callback) -> pl.Trainer:
        last = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True, every_n_train_steps=1)
        return child.build_trainer(
            steps=4, epoch_batches=0, callbacks=[*before, last, callback], checkpointing=True
        )

    first = ResumeCallback(tmp_path / "pause.ckpt")
    torch.manual_seed(child.SEED)
    trainer_with(first, _RequestPauseAt(2, first)).fit(_Counting(), child.build_loader(workers=0))
    assert first.paused and (tmp_path / "ckpts" / "last.ckpt").exists()

    second = ResumeCallback(tmp_path / "pause.ckpt")
    trainer = trainer_with(second)
    with pytest.warns(UserWarning) as caught:
        trainer.fit(_Counting(), child.build_loader(workers=0), ckpt_path="last")
    source = tmp_path / "ckpts" / "last.ckpt"
    assert (
        f"ResumeCallback: {source} is not a pause file (no 'trainer_resume' entry): training "
        "continues, but the main-process RNG is not restored, so the result is not bit-identical "
        f"to an uninterrupted run; the exact pause file {tmp_path / 'pause.ckpt'} exists: "
        "fit(ckpt_path=resume.ckpt_path) resumes it bit-identically (it is kept, not deleted, "
        "when this fit ends)"
    ) in [str(w.message) for w in caught]
    assert trainer.global_step == 4 and second.finished
    assert (tmp_path / "pause.ckpt").is_file()  # unused: kept beside the finished marker


def test_a_pause_path_in_a_missing_folder_gets_its_finished_marker_there(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "job-17" / "pause.ckpt"
    resume = ResumeCallback(path)
    torch.manual_seed(child.SEED)
    trainer = child.build_trainer(steps=2, epoch_batches=0, callbacks=[resume])
    trainer.fit(_Counting(), child.build_loader(workers=0))
    finished = run_finished(path)
    assert finished is not None and finished.completed_steps == 2
