"""Loaders from elsewhere returned by ``_resume_loaders()``: refused before the first step
unless declared to draw no random numbers (the declared case resumes exactly in a new
process in tests/mixin/test_mixin_foreign_loaders.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.foreign_loaders import LoaderTrainer
from support.litdata_runs import write_dataset
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainer_resume import declare_no_random_draws
from trainer_resume.errors import UnsupportedResumeConfigurationError


class Augmented(Dataset):
    """Samples with a random augmentation, drawn in the loader's workers."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index)) + torch.rand(2)


def _refusal(kind: str) -> str:
    return (
        f"LoaderTrainer._resume_loaders() returns 'train' ({kind}), a loader from elsewhere: its "
        "state_dict() and load_state_dict() save its position, but not the random numbers its "
        "samples draw (its workers are reseeded at each iter()), so a resume would differ "
        "wherever a sample draws one (a random augmentation); return a trainer_resume.loaders."
        "ResumableDataLoader(..., resumable=True) (the DataLoader drop-in, which replays them), "
        "or, if its samples draw no random numbers, declare it with "
        "trainer_resume.declare_no_random_draws(loader)"
    )


@pytest.mark.slow
def test_an_undeclared_stateful_dataloader_is_refused_before_the_first_step(
    tmp_path: Path,
) -> None:
    loader = StatefulDataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=2)
    trainer = LoaderTrainer(loader)
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert refused.value.code == 332
    assert refused.value.detail == _refusal(f"{StatefulDataLoader.__module__}.StatefulDataLoader")
    assert not hasattr(trainer, "ran") and trainer.completed_steps == 0
    with pytest.raises(UnsupportedResumeConfigurationError) as at_pause:
        trainer.pause(tmp_path / "pause.ckpt")  # nor can it be paused, and no file is left
    assert at_pause.value.detail == refused.value.detail
    assert not (tmp_path / "pause.ckpt").exists()
    # torchdata's state_dict() before any iter() starts the workers: stop them here rather
    # than when a later test collects the loader.
    if loader._iterator is not None:
        loader._iterator._shutdown_workers()


def test_a_streaming_librarys_own_loader_is_refused_undeclared_and_taken_declared(
    tmp_path: Path,
) -> None:
    from litdata import StreamingDataLoader, StreamingDataset

    write_dataset(str(tmp_path / "data"))
    loader = StreamingDataLoader(StreamingDataset(str(tmp_path / "data")), batch_size=4)
    trainer = LoaderTrainer(loader)
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert refused.value.detail == _refusal(f"{StreamingDataLoader.__module__}.StreamingDataLoader")
    declared = LoaderTrainer(declare_no_random_draws(loader))
    declared.step()
    assert declared.completed_steps == 1


def test_only_a_loader_with_state_methods_can_be_declared() -> None:
    with pytest.raises(TypeError) as refused:
        declare_no_random_draws(object())
    assert str(refused.value) == (
        "declare_no_random_draws() takes a loader with state_dict() and load_state_dict(), got "
        "a builtins.object"
    )
