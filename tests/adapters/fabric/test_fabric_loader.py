"""Fabric's ``_FabricDataLoader`` around a ``ResumableDataLoader`` is accepted as it is and resumes
at its position, epochs numbered as Fabric numbered them; around a loader whose position
cannot be saved it is refused when training starts, naming the loader to wrap."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from lightning_fabric import Fabric
from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
from lightning_fabric.wrappers import _FabricDataLoader
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
    WeightedRandomSampler,
)
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.adapters.fabric import loader_epoch, setup_dataloaders
from trainer_resume.checks import hook_results
from trainer_resume.checks.hook_results import loader_view
from trainer_resume.errors import ResumableModeRequiredError, UnsupportedResumeConfigurationError
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.testing import first_difference

DATA = TensorDataset(torch.arange(12.0))


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


class Trainer(TrainingResumeMixin):
    """Returns the loader it iterates, as Fabric handed it back."""

    def __init__(self, loader: Any) -> None:
        self.model = torch.nn.Linear(1, 1)
        self.loader = loader
        self._initialize_training_resume({"fabric": "loader"}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> torch.Tensor:
        return batch[0]


def shuffled(fabric: Fabric) -> Any:
    generator = torch.Generator().manual_seed(5)
    loader = ResumableDataLoader(
        DATA, batch_size=2, shuffle=True, generator=generator, resumable=True
    )
    return fabric.setup_dataloaders(loader)


def test_a_loader_fabric_set_up_is_accepted_as_it_is_and_resumes_at_its_position(fabric, tmp_path):
    uninterrupted = shuffled(fabric)
    reference = [batch[0] for _ in range(2) for batch in uninterrupted]
    first = Trainer(shuffled(fabric))
    batches = iter(first.loader)
    seen = [first.step(next(batches)) for _ in range(3)]
    first.pause(tmp_path / "pause.ckpt")

    second = Trainer(shuffled(fabric))
    second.resume(tmp_path / "pause.ckpt")
    assert loader_epoch(second.loader) == 0
    for _ in range(loader_epoch(second.loader), 2):
        seen += [second.step(batch) for batch in second.loader]
    assert first_difference(reference, seen) is None


def distributed(epoch_batches: int = 3) -> _FabricDataLoader:
    # What fabric.setup_dataloaders makes of a shuffled loader on process 0 of 2.
    sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = ResumableDataLoader(
        DATA, batch_size=6 // epoch_batches, sampler=sampler, resumable=True
    )
    return _FabricDataLoader(loader)


def epochs_from(loader: _FabricDataLoader, count: int) -> list[list[torch.Tensor]]:
    """The loop as Fabric's docs write it, from the epoch the loader is at."""
    return [[batch[0] for batch in loader] for _ in range(loader_epoch(loader), count)]


@pytest.mark.parametrize("delivered", [5, 6], ids=["mid-epoch", "epoch-end"])
def test_a_distributed_sampler_fabric_sets_the_epoch_of_resumes_with_its_epochs_numbered_alike(
    delivered,
):
    reference = [batch for epoch in epochs_from(distributed(), 4) for batch in epoch]
    orders = [torch.cat(reference[start : start + 3]) for start in range(0, 12, 3)]
    assert all(not torch.equal(orders[0], order) for order in orders[1:])  # set_epoch matters

    paused = distributed()
    batches = iter(paused)  # one iteration per epoch, as a for loop makes it
    for _ in range(delivered):
        try:
            next(batches)
        except StopIteration:
            batches = iter(paused)
            next(batches)
    state = loader_view(paused).state_dict()

    resumed = distributed()
    loader_view(resumed).load_state_dict(state)
    rest = [batch for epoch in epochs_from(resumed, 4) for batch in epoch]
    assert first_difference(reference[delivered:], rest) is None


def refusal(loader: Any) -> str:
    trainer = Trainer(loader)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(next(iter(loader)))
    assert caught.value.code == 332
    return caught.value.detail


WHERE = (
    "Trainer._resume_loaders() returns 'train' (lightning_fabric.wrappers._FabricDataLoader), "
    "whose position cannot be saved (it has no state_dict() and load_state_dict())"
)


def test_a_fabric_loader_around_a_plain_data_loader_is_refused_naming_the_loader_to_wrap(fabric):
    assert refusal(fabric.setup_dataloaders(DataLoader(DATA, batch_size=2, shuffle=True))) == (
        f"{WHERE}; fabric.setup_dataloaders wrapped a torch.utils.data.dataloader.DataLoader, "
        "whose position cannot be saved: pass fabric.setup_dataloaders a "
        "trainer_resume.loaders.ResumableDataLoader(..., resumable=True) (the DataLoader drop-in, "
        "with the same arguments) and return the loader it returns"
    )


def test_a_fabric_loader_around_a_loader_built_without_resumable_is_refused(fabric):
    detail = refusal(fabric.setup_dataloaders(ResumableDataLoader(DATA, batch_size=2)))
    assert detail.endswith(
        "fabric.setup_dataloaders wrapped a ResumableDataLoader built with resumable=False: "
        "build it with resumable=True and return the loader fabric.setup_dataloaders returns"
    )


def test_a_fabric_loader_whose_stateful_sampler_fabric_gives_epochs_is_refused():
    sampler = StatefulDistributedSampler(DATA, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = ResumableDataLoader(DATA, batch_size=2, sampler=sampler, resumable=True)
    assert refusal(_FabricDataLoader(loader)).endswith(
        "Fabric sets the epoch of its StatefulDistributedSampler at every iteration from the "
        "number of iterations, which the loader's state does not record: use a "
        "DistributedSampler or a sampler without set_epoch"
    )


def test_before_the_adapter_is_imported_a_fabric_loader_is_refused_naming_the_import(
    fabric, monkeypatch
):
    monkeypatch.setattr(hook_results, "_VIEWS", [])
    monkeypatch.setattr(hook_results, "_HINTS", [])
    monkeypatch.delitem(sys.modules, "trainer_resume.adapters.fabric")
    detail = refusal(shuffled(fabric))
    assert detail.endswith(
        "by its own wrapper; it is lightning_fabric's own loader: import "
        "trainer_resume.adapters.fabric before training starts, which accepts what it can resume "
        "of lightning_fabric's loaders and names the fix for the rest"
    )


def test_loader_epoch_refuses_a_loader_it_cannot_read(fabric):
    with pytest.raises(TypeError, match="loader_epoch takes a ResumableDataLoader"):
        loader_epoch(fabric.setup_dataloaders(DataLoader(DATA)))


def test_setup_dataloaders_on_one_process_reads_what_the_loader_reads(fabric):
    generator = torch.Generator().manual_seed(5)
    loader = ResumableDataLoader(
        DATA, batch_size=2, shuffle=True, generator=generator, resumable=True
    )
    set_up = setup_dataloaders(fabric, loader)
    assert isinstance(set_up, _FabricDataLoader)
    expected = [batch[0] for batch in shuffled(fabric)]
    assert first_difference(expected, [batch[0] for batch in set_up]) is None


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_setup_dataloaders_keeps_an_iterable_dataset_as_fabric_does(fabric):
    loader = ResumableDataLoader(Stream(), batch_size=2, resumable=True)
    assert setup_dataloaders(fabric, loader)._dataloader is loader


def test_setup_dataloaders_refuses_what_it_cannot_set_up(fabric):
    with pytest.raises(TypeError, match="setup_dataloaders takes a ResumableDataLoader"):
        setup_dataloaders(fabric, DataLoader(DATA))
    with pytest.raises(ResumableModeRequiredError):
        setup_dataloaders(fabric, ResumableDataLoader(DATA))
    started = ResumableDataLoader(DATA, batch_size=2, resumable=True)
    next(iter(started))
    with pytest.raises(ValueError, match="delivered 1 batch"):
        setup_dataloaders(fabric, started)
    other = InfiniteRandomSampler(DATA, num_replicas=2, rank=1, resumable=True)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        setup_dataloaders(fabric, ResumableDataLoader(DATA, 2, sampler=other, resumable=True))
    assert caught.value.detail == (
        "the loader's InfiniteRandomSampler is sharded for rank 1 of 2, but this is process 0 of "
        "1; build it after fabric.launch() (it then shards by Fabric's process group) or pass "
        "num_replicas=1, rank=0"
    )


class InnerReturned(Trainer):
    """The loader inside Fabric's wrapper returned, while the loop iterates the wrapper."""

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader._dataloader}


def test_the_loader_inside_fabrics_wrapper_returned_instead_of_it_is_refused_where_fabric_numbers_epochs():
    trainer = InnerReturned(distributed())
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(next(iter(trainer.loader)))
    assert caught.value.detail == (
        "InnerReturned.loader (lightning_fabric.wrappers._FabricDataLoader) is the loader the loop "
        "iterates, and 'train' that InnerReturned._resume_loaders() returns is the loader inside "
        "it: Fabric numbers the epochs of its DistributedSampler by the wrapper's count of "
        "iterations, which only the wrapper's own resume brings back; return InnerReturned.loader "
        "itself"
    )
    # Without a sampler Fabric numbers, the loader inside resumes as well as the wrapper.
    accepted = InnerReturned(_FabricDataLoader(ResumableDataLoader(DATA, 2, resumable=True)))
    accepted.step(next(iter(accepted.loader)))


def test_a_sampler_lightning_wrapped_to_share_it_is_refused_naming_how_to_share_it_instead():
    # What fabric.setup_dataloaders makes of a WeightedRandomSampler under a distributed strategy.
    weighted = WeightedRandomSampler(torch.ones(12), 12)
    wrapped = DistributedSamplerWrapper(weighted, num_replicas=2, rank=0)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(DATA, batch_size=2, sampler=wrapped, resumable=True)
    assert (
        "sampler DistributedSamplerWrapper cannot be repositioned (subclasses of the supported "
        "samplers neither, unless stateful: their orders could not be recomputed): Lightning "
        "wrapped your sampler to share it among processes; pass use_distributed_sampler=False (to "
        "the Trainer, or to fabric.setup_dataloaders) with a sampler sharded by rank, or set the "
        "loader up with trainer_resume.adapters.fabric.setup_dataloaders(fabric, loader); or give "
        "it state_dict()" in caught.value.detail
    )


class HoldsBoth(Trainer):
    """Keeps the loader it gave Fabric, as well as the one Fabric returned."""

    def __init__(self, fabric: Fabric) -> None:
        self.data = ResumableDataLoader(DATA, batch_size=2, resumable=True)
        super().__init__(fabric.setup_dataloaders(self.data))


def test_the_loader_fabric_wraps_kept_beside_it_is_not_taken_for_unsaved_state(fabric, recwarn):
    trainer = HoldsBoth(fabric)
    for batch in trainer.loader:
        trainer.step(batch)
    assert not [item for item in recwarn if "has state that no hook returns" in str(item.message)]


class HoldsValidation(Trainer):
    """Returns its training loader; holds validation loaders Fabric set up, returned by no hook."""

    def __init__(self, fabric: Fabric) -> None:
        super().__init__(shuffled(fabric))
        generator = torch.Generator().manual_seed(6)
        validation = TensorDataset(torch.arange(6.0))
        self.val_loader = fabric.setup_dataloaders(
            ResumableDataLoader(
                validation, batch_size=2, shuffle=True, generator=generator, resumable=True
            )
        )
        self.plain_val_loader = fabric.setup_dataloaders(
            DataLoader(validation, batch_size=2, shuffle=True), use_distributed_sampler=False
        )


def test_loaders_fabric_set_up_that_no_hook_returns_are_warned_about_as_the_loaders_inside(
    fabric, recwarn
):
    trainer = HoldsValidation(fabric)
    for batch in trainer.loader:
        trainer.step(batch)
    warned = [str(item.message) for item in recwarn if "HoldsValidation." in str(item.message)]
    assert len(warned) == 2, warned
    assert warned[0].startswith(
        "HoldsValidation.val_loader (_FabricDataLoader around a ResumableDataLoader) has state "
        "that no hook returns"
    )
    assert warned[1].startswith(
        "HoldsValidation.plain_val_loader (_FabricDataLoader) is a loader that no hook returns "
        "and that a resumed run starts over"
    )


def test_a_loop_that_leaves_the_epochs_of_a_loader_fabric_set_up_part_way_is_warned_once(
    fabric, recwarn
):
    trainer = Trainer(shuffled(fabric))
    for _ in range(3):
        for number, batch in enumerate(trainer.loader):
            trainer.step(batch)
            if number == 1:
                break
    left = [str(w.message) for w in recwarn if "part-way" in str(w.message)]
    assert len(left) == 1, left
    assert left[0].startswith("iter(loader) left epoch 0 part-way, after 2 batch(es)")
