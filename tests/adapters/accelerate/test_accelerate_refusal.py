"""A ResumableDataLoader passed through accelerator.prepare, or Accelerate's stateful loader, is
refused when training starts, with the fix that names prepare_loader."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from support.accelerate_loop import BATCH, NoisyDataset, fresh_accelerate_state
from torch.utils.data import DataLoader

import trainer_resume.adapters.accelerate  # noqa: F401  (registers the fix in the refusal)
from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.adapters.accelerate import prepare_loader
from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader

FIX = (
    "accelerator.prepare made it Accelerate's DataLoaderShard, which does not resume at the samples "
    "it stopped at: "
    "pass the ResumableDataLoader to trainer_resume.adapters.accelerate.prepare_loader(accelerator, "
    "loader) instead of accelerator.prepare, and return what prepare_loader returns"
)


@pytest.fixture(autouse=True)
def _fresh_accelerate():
    fresh_accelerate_state()
    yield
    fresh_accelerate_state()


class PreparedByAccelerate(TrainingResumeMixin):
    """The natural mistake: the resumable loader goes through accelerator.prepare."""

    def __init__(self) -> None:
        self.accelerator = Accelerator(cpu=True)
        self.model = self.accelerator.prepare(torch.nn.Linear(6, 1))
        self.resumable = ResumableDataLoader(NoisyDataset(), BATCH, shuffle=True, resumable=True)
        self.loader = self.accelerator.prepare(self.resumable)
        self._initialize_training_resume({"refusal": "accelerate"}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> None:
        self.model(batch[0]).sum().backward()


def test_a_resumable_loader_prepared_by_accelerate_is_refused_at_the_first_step_naming_prepare_loader():
    trainer = PreparedByAccelerate()
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(next(iter(trainer.loader)))
    assert caught.value.code == 332
    assert caught.value.detail == (
        "PreparedByAccelerate._resume_loaders() returns 'train' "
        "(accelerate.data_loader.DataLoaderShard), whose position cannot be saved (its state_dict() "
        "raised AttributeError: 'DataLoader' object has no attribute 'dl_state_dict'); it replaced "
        f"the resumable loader self.resumable (ResumableDataLoader) by its own wrapper; {FIX}"
    )
    assert trainer.model.weight.grad is None  # refused before the step ran
    assert all(
        torch.equal(before[name], value) for name, value in trainer.model.state_dict().items()
    )


class StatefulByAccelerate(PreparedByAccelerate):
    """Accelerate's own stateful loader: it has a state, which resumes other samples."""

    def __init__(self) -> None:
        self.accelerator = Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
        )
        self.model = self.accelerator.prepare(torch.nn.Linear(6, 1))
        self.loader = self.accelerator.prepare(
            DataLoader(NoisyDataset(), batch_size=BATCH, shuffle=True)
        )
        self._initialize_training_resume({"refusal": "accelerate"}, version="1")


def test_accelerates_stateful_loader_is_refused_too_though_it_has_a_state():
    trainer = StatefulByAccelerate()
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(next(iter(trainer.loader)))
    assert caught.value.detail == (
        "StatefulByAccelerate._resume_loaders() returns 'train' "
        "(accelerate.data_loader.DataLoaderShard), whose position cannot be saved (the state its "
        f"framework gives it does not bring back the same samples); {FIX}"
    )


class ReturnsTheOriginal(PreparedByAccelerate):
    """The other natural mistake: the loop iterates the prepared loader, the hook returns the original."""

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.resumable}


def test_returning_the_original_loader_while_iterating_accelerates_is_refused():
    trainer = ReturnsTheOriginal()
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(next(iter(trainer.loader)))
    assert caught.value.detail == (
        "ReturnsTheOriginal.loader (accelerate.data_loader.DataLoaderShard) reads the dataset of "
        "the loader 'train' that ReturnsTheOriginal._resume_loaders() returns: the loop's batches "
        f"come from the wrapper, whose position is not saved, and 'train' never moves; {FIX}"
    )


SKIP_FIX = (
    "Accelerate's skip_first_batches made it a {kind} that skips batches, which does not resume "
    "at the samples it stopped at: resume() puts the loader "
    "trainer_resume.adapters.accelerate.prepare_loader(accelerator, loader) returns at its "
    "position, with no batches to skip; iterate that loader and return it"
)


class SkipsBatches(PreparedByAccelerate):
    """Accelerate's resume recipe over a prepare_loader loader: skip_first_batches."""

    def __init__(self, workers: int, *, keep_returning_prepared: bool) -> None:
        self.accelerator = Accelerator(cpu=True)
        self.model = self.accelerator.prepare(torch.nn.Linear(6, 1))
        loader = ResumableDataLoader(
            NoisyDataset(), BATCH, shuffle=True, num_workers=workers, resumable=True
        )
        self.prepared = prepare_loader(self.accelerator, loader)
        self.batches = self.accelerator.skip_first_batches(self.prepared, 2)
        self.returns = self.prepared if keep_returning_prepared else self.batches
        self._initialize_training_resume({"refusal": "accelerate"}, version="1")

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.returns}


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_first_batches_over_a_prepared_loader_is_refused_at_the_first_step_whichever_is_returned(
    workers,
):
    returned = SkipsBatches(workers, keep_returning_prepared=False)
    assert returned.batches.num_workers == workers  # the prepared loader's settings, as offered
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        returned.step(next(iter(returned.batches)))
    assert caught.value.code == 332
    assert caught.value.detail.endswith(SKIP_FIX.format(kind="DataLoader"))
    assert returned.model.weight.grad is None

    held = SkipsBatches(workers, keep_returning_prepared=True)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        held.step(next(iter(held.batches)))
    assert caught.value.detail == (
        "SkipsBatches.batches (torch.utils.data.dataloader.DataLoader) reads the dataset of the "
        "loader 'train' that SkipsBatches._resume_loaders() returns: the loop's batches come "
        "from the wrapper, whose position is not saved, and 'train' never moves; "
        + SKIP_FIX.format(kind="DataLoader")
    )
    assert held.model.weight.grad is None
    held.prepared.close()
    returned.prepared.close()
