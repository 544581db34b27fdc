"""A loader's deferred state: the position of its moment, built later, however far it read on."""

from __future__ import annotations

from typing import Any

import pytest
from support import iterable_streams as iterables
from support.loader_streams import AugmentedDataset

from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.state import built
from trainer_resume.testing import first_difference


def _map_loader() -> ResumableDataLoader:
    return ResumableDataLoader(AugmentedDataset(40), batch_size=4, shuffle=True, resumable=True)


def _loaders() -> dict[str, object]:
    return {
        "map-style, shuffled": _map_loader,
        "iterable, its own state": lambda: iterables.make_loader("dataset-state"),
        "iterable, torch generator in its state": lambda: iterables.make_loader("torch-rng-eager"),
    }


@pytest.mark.parametrize("kind", list(_loaders()))
@pytest.mark.parametrize("taken_after", [0, 2, 5])
def test_a_deferred_state_built_after_reading_on_is_the_state_dict_of_its_moment(
    kind: str, taken_after: int
) -> None:
    loader = _loaders()[kind]()
    batches = iter(loader)
    for _ in range(taken_after):
        next(batches)
    deferred = loader.deferred_state_dict()
    expected = loader.state_dict()
    for _ in range(4):  # on past the end of the iterable's first pass (5 batches)
        try:
            next(batches)
        except StopIteration:
            batches = iter(loader)
    built = deferred()
    assert first_difference(built, expected) is None
    assert first_difference(loader.state_dict(), expected) is not None  # it did move on
    again = deferred()
    assert first_difference(again, expected) is None
    if taken_after == 2 and "iterable" in kind:  # each build is a copy of its own
        generators = built["sampler"]["workers"][0]["generators"]
        assert generators["torch"] is not again["sampler"]["workers"][0]["generators"]["torch"]


@pytest.mark.parametrize("kind", list(_loaders()))
def test_a_boundary_record_is_the_deferred_state_and_epoch_ended_of_its_moment(kind: str) -> None:
    loader = _loaders()[kind]()
    batches = iter(loader)
    seen_end = False
    for _ in range(12):  # past the end of an epoch (10 batches) or a pass (5)
        try:
            next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        deferred, ended = loader.boundary_record()
        assert ended is loader.epoch_ended
        seen_end = seen_end or ended
        assert first_difference(built(deferred), loader.state_dict()) is None
    assert seen_end


def test_a_boundary_record_takes_a_subclass_s_own_epoch_end() -> None:
    class EveryBatchEndsAnEpoch(ResumableDataLoader):
        @property
        def epoch_ended(self) -> bool:
            return True

    loader = EveryBatchEndsAnEpoch(AugmentedDataset(40), batch_size=4, resumable=True)
    next(iter(loader))
    deferred, ended = loader.boundary_record()
    assert ended is True
    assert first_difference(built(deferred), loader.state_dict()) is None


def test_a_boundary_record_takes_a_subclass_s_own_deferred_state() -> None:
    class TaggedState(ResumableDataLoader):
        def deferred_state_dict(self) -> Any:
            build = super().deferred_state_dict()
            return lambda: {**build(), "tagged": True}

    loader = TaggedState(AugmentedDataset(40), batch_size=4, resumable=True)
    next(iter(loader))
    deferred, ended = loader.boundary_record()
    assert first_difference(built(deferred), {**loader.state_dict(), "tagged": True}) is None
    assert ended is False


def test_a_boundary_record_runs_a_subclass_s_own_settle_once() -> None:
    settled: list[int] = []

    class CountsSettles(ResumableDataLoader):
        def _settle(self) -> None:
            settled.append(len(settled))
            super()._settle()

    loader = CountsSettles(AugmentedDataset(40), batch_size=4, resumable=True)
    next(iter(loader))
    settled.clear()
    deferred, ended = loader.boundary_record()

    assert settled == [0]
    assert first_difference(built(deferred), loader.state_dict()) is None
    assert ended is False
