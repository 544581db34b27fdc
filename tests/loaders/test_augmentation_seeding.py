"""Augmentation seeding: per batch (default for epoch loaders) or per sample, and the
caller's generators handed back exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from support import epoch_streams as epochs
from support import loader_streams as streams

from trainer_resume.errors import LoaderFetchFailedError, LoaderStateError
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader


class GaussianDataset(streams.AugmentedDataset):
    """Draws one legacy NumPy Gaussian per sample (an odd count leaves one cached)."""

    def __getitem__(self, index: int) -> torch.Tensor:
        row = super().__getitem__(index)
        return torch.cat([row, torch.tensor([float(np.random.randn())], dtype=torch.float64)])


class ItemsDataset(streams.AugmentedDataset):
    """Offers ``__getitems__``, as DataLoader's batched fetch uses it; counts its calls."""

    calls = 0

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        type(self).calls += 1
        return [self[index] for index in indices]


class FailingDataset(streams.AugmentedDataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        random.random()
        np.random.rand()
        torch.rand(())
        raise ValueError(f"cannot decode {index}")


def _numpy_state_equal(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def _loader(dataset, seeding=None, batch_size=7, **options):
    torch.manual_seed(0)
    return ResumableDataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        resumable=True,
        augmentation_seeding=seeding,
        **options,
    )


def test_epoch_loaders_seed_per_batch_and_endless_samplers_per_sample_by_default():
    dataset = streams.AugmentedDataset()
    assert _loader(dataset).augmentation_seeding == "batch"
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    assert (
        ResumableDataLoader(dataset, sampler=sampler, resumable=True).augmentation_seeding
        == "sample"
    )


@pytest.mark.parametrize("caller_draws_a_gaussian", [False, True])
def test_the_callers_generators_come_back_exactly_after_every_batch(
    caller_draws_a_gaussian,
):
    loader = _loader(GaussianDataset(epochs.SIZE))
    iterator = iter(loader)
    np.random.seed(8)
    random.seed(8)
    for _ in range(3):
        if caller_draws_a_gaussian:
            np.random.randn(1)  # leaves the second Gaussian of a pair cached
        python, numpy_state, torch_state = (
            random.getstate(),
            np.random.get_state(),
            torch.get_rng_state(),
        )
        next(iterator)
        assert random.getstate() == python
        assert _numpy_state_equal(np.random.get_state(), numpy_state)
        assert torch.equal(torch.get_rng_state(), torch_state)


def test_the_callers_generators_come_back_when_a_sample_fails():
    loader = _loader(FailingDataset(epochs.SIZE))
    python, numpy_state, torch_state = (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
    )
    with pytest.raises(LoaderFetchFailedError):
        next(iter(loader))
    assert random.getstate() == python
    assert _numpy_state_equal(np.random.get_state(), numpy_state)
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_batches_do_not_depend_on_what_the_caller_draws_between_them():
    quiet = list(_loader(GaussianDataset(epochs.SIZE)))
    loader = _loader(GaussianDataset(epochs.SIZE))
    noisy = []
    for batch in loader:
        noisy.append(batch)
        random.random(), np.random.randn(3), torch.rand(2)
    assert len(quiet) == len(noisy) == 4
    assert all(torch.equal(a, b) for a, b in zip(quiet, noisy))


def test_per_sample_seeding_makes_a_samples_augmentation_independent_of_the_batch_size():
    dataset = streams.AugmentedDataset(epochs.SIZE)

    def rows(batch_size, seeding):
        torch.manual_seed(0)
        loader = ResumableDataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            resumable=True,
            augmentation_seeding=seeding,
        )
        return torch.cat(list(loader))

    assert torch.equal(rows(7, "sample"), rows(3, "sample"))
    by_batch_7, by_batch_3 = rows(7, "batch"), rows(3, "batch")
    assert torch.equal(by_batch_7[:, 0], by_batch_3[:, 0])  # same samples, drawn in other batches
    assert not torch.equal(by_batch_7, by_batch_3)


@pytest.mark.parametrize("seeding", ["batch", "sample"])
def test_each_seeding_resumes_exactly_in_a_fresh_loader(seeding):
    dataset = GaussianDataset(epochs.SIZE)
    loader = _loader(dataset, seeding)
    expected = list(loader) + list(loader)
    loader = _loader(dataset, seeding)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(2)]
    state = loader.state_dict()
    torch.manual_seed(99)
    fresh = _loader(dataset, seeding)
    fresh.load_state_dict(state)
    got = first + list(fresh) + list(fresh)
    assert len(got) == len(expected) == 8
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_a_state_saved_with_the_other_seeding_is_refused_naming_the_fix():
    dataset = streams.AugmentedDataset(epochs.SIZE)
    state = _loader(dataset, "sample").state_dict()
    with pytest.raises(LoaderStateError) as caught:
        _loader(dataset, "batch").load_state_dict(state)
    assert caught.value.code == 333 and "augmentation_seeding='sample'" in str(caught.value)


def test_per_batch_seeding_of_a_sharded_stream_is_an_argument_error():
    dataset = streams.AugmentedDataset()
    sampler = InfiniteRandomSampler(dataset, resumable=True, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="world size"):
        ResumableDataLoader(dataset, sampler=sampler, resumable=True, augmentation_seeding="batch")


def test_per_batch_seeding_fetches_through_getitems_when_the_dataset_has_it():
    dataset = ItemsDataset(epochs.SIZE)
    ItemsDataset.calls = 0
    batches = list(_loader(dataset))
    assert ItemsDataset.calls == len(batches) == 4
    plain = list(_loader(streams.AugmentedDataset(epochs.SIZE)))
    assert all(torch.equal(a, b) for a, b in zip(plain, batches))


@pytest.mark.slow
@pytest.mark.parametrize("seeding", ["batch", "sample"])
def test_each_seeding_gives_the_same_batches_with_two_workers(seeding):
    dataset = GaussianDataset(epochs.SIZE)
    single = list(_loader(dataset, seeding))
    loader = _loader(dataset, seeding, num_workers=2, multiprocessing_context="fork")
    assert all(torch.equal(a, b) for a, b in zip(single, list(loader)))


def test_batch_seeds_computed_ahead_are_those_of_each_position_in_any_order_of_asking():
    from trainer_resume.loaders._fetch import _COLLATE_SALT, batch_seed
    from trainer_resume.rng import derive_seed

    generator = random.Random(5)
    positions = (
        list(range(0, 32 * 3000, 32))  # consecutive batches: runs computed ahead
        + list(range(7, 7 + 96 * 50, 96))  # a worker's share of them
        + [5, 7, 100, 101, 96000, 3]  # back and forth
        + [generator.randrange(1 << 40) for _ in range(300)]  # anywhere
        + list(range(32 * 3000, 0, -32))  # backwards
    )
    for augmentation_seed in (0, 987654321, (1 << 63) - 1):
        for position in positions:
            expected = derive_seed(augmentation_seed, position, _COLLATE_SALT)
            assert batch_seed(augmentation_seed, position) == expected, position
