"""Augmentation seeding: per batch (default for epoch loaders) or per sample, and the
caller's generators handed back exactly."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from support import epoch_streams as epochs
from support import loader_streams as streams
from support.cli import TESTS

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


class ReplacingDataset(torch.utils.data.Dataset):
    """Installs a PCG64 of its own as NumPy's global bit generator in every __getitem__,
    seeded from a draw of the generator the batch was seeded with, and draws from it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        np.random.set_bit_generator(np.random.PCG64(int(np.random.randint(0, 2**31))))
        return torch.from_numpy(np.random.rand(2))


def _replacing_loader(workers: int = 0, seeding: str = "batch") -> ResumableDataLoader:
    return ResumableDataLoader(
        ReplacingDataset(),
        batch_size=2,
        num_workers=workers,
        resumable=True,
        generator=torch.Generator().manual_seed(0),
        augmentation_seeding=seeding,
    )


def _batches(loader: ResumableDataLoader) -> list[torch.Tensor]:
    batches = list(loader)
    loader.close()
    return batches


def _same(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(map(torch.equal, first, second))


@pytest.fixture
def numpy_bit_generator():
    """NumPy's global bit generator, put back after the test whatever the test left."""
    kept = np.random.get_bit_generator()
    state = kept.state
    yield kept
    kept.state = state
    np.random.set_bit_generator(kept)


def test_the_callers_numpy_generator_comes_back_when_the_dataset_replaces_it(numpy_bit_generator):
    caller_draw = np.random.get_bit_generator().state
    expected = np.random.rand()
    np.random.get_bit_generator().state = caller_draw
    batches = _batches(_replacing_loader())
    assert len(batches) == 4
    assert np.random.get_bit_generator() is numpy_bit_generator
    assert np.random.rand() == expected


@pytest.mark.parametrize("seeding", ["batch", "sample"])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_dataset_that_replaces_numpys_bit_generator_gets_the_same_batches_in_every_run(
    numpy_bit_generator, workers, seeding
):
    reference = _batches(_replacing_loader(seeding=seeding))
    # A second run in the same process, with the workers, and resumed in a fresh loader.
    assert _same(_batches(_replacing_loader(workers, seeding)), reference)
    paused = _replacing_loader(workers, seeding)
    iterator = iter(paused)
    head = [next(iterator) for _ in range(2)]
    state = paused.state_dict()
    paused.close()
    resumed = _replacing_loader(workers, seeding)
    resumed.load_state_dict(state)
    assert _same(head + _batches(resumed), reference)


def _gaussian_batches() -> list[torch.Tensor]:
    return _batches(
        ResumableDataLoader(
            GaussianDataset(),
            batch_size=3,
            resumable=True,
            generator=torch.Generator().manual_seed(0),
        )
    )


class ReplacingStream(torch.utils.data.IterableDataset):
    """A stateful stream whose third item installs a PCG64 as NumPy's global bit generator."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> ReplacingStream:
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= 8:
            raise StopIteration
        self.position += 1
        if self.position == 3:
            np.random.set_bit_generator(np.random.PCG64(int(np.random.randint(0, 2**31))))
        return torch.tensor([float(self.position), np.random.rand()])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_a_stream_read_in_the_main_process_that_replaces_numpys_generator_is_refused_naming_the_fix(
    numpy_bit_generator,
):
    loader = ResumableDataLoader(ReplacingStream(), batch_size=2, resumable=True)
    iterator = iter(loader)
    first = next(iterator)
    with pytest.raises(LoaderFetchFailedError, match="np.random.set_bit_generator") as caught:
        next(iterator)
    assert "np.random.Generator of the dataset's own" in str(caught.value)
    assert np.random.get_bit_generator() is numpy_bit_generator
    assert first[:, 0].tolist() == [1.0, 2.0]
    loader.close()


class DrawingStream(ReplacingStream):
    """The same stream without the replacement: it draws from NumPy's global generator."""

    def __next__(self) -> torch.Tensor:
        if self.position >= 8:
            raise StopIteration
        self.position += 1
        return torch.tensor([float(self.position), np.random.rand()])


def _stream_batches() -> list[torch.Tensor]:
    torch.manual_seed(0)  # the loader's augmentation seed
    return _batches(ResumableDataLoader(DrawingStream(), batch_size=2, resumable=True))


@pytest.mark.parametrize("batches", [_gaussian_batches, _stream_batches], ids=["map", "stream"])
def test_a_caller_whose_numpy_generator_is_a_pcg64_gets_the_batches_of_the_default_one(
    numpy_bit_generator, batches
):
    reference = batches()
    caller = np.random.PCG64(7)
    np.random.set_bit_generator(caller)
    before = caller.state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy warning per batch about the legacy form
        got = batches()
    assert len(reference) >= 4 and _same(got, reference)
    assert np.random.get_bit_generator() is caller and caller.state == before


@pytest.mark.slow
def test_a_process_whose_numpy_generator_is_a_pcg64_before_any_loader_reads_gets_the_default_batches(
    tmp_path,
):
    # The generators' raw views are found at the first read: here, under the PCG64.
    runs = {}
    for kind in ("MT19937", "PCG64"):
        out = tmp_path / f"{kind}.pt"
        subprocess.run(
            [sys.executable, "-m", "support.numpy_kind_child", kind, str(out)],
            cwd=TESTS,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            },
            check=True,
            timeout=120,
        )
        runs[kind] = torch.load(out, weights_only=True)
    for kind, run in runs.items():
        assert run["caller_unchanged"], kind
    for name, reference in runs["MT19937"]["batches"].items():
        assert len(reference) == 4 and _same(runs["PCG64"]["batches"][name], reference), name


class WorkerReplacingStream(torch.utils.data.IterableDataset):
    """A stateful stream whose worker copies install a PCG64 as NumPy's global bit
    generator when a pass starts, and draw from it."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> WorkerReplacingStream:
        info = torch.utils.data.get_worker_info()
        self.stride = 1 if info is None else info.num_workers
        self.position = max(self.position, 0 if info is None else info.id)
        np.random.set_bit_generator(np.random.PCG64(3))
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= 12:
            raise StopIteration
        self.position += self.stride
        return torch.tensor([float(self.position), np.random.rand()])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


@pytest.mark.slow
def test_a_stream_whose_worker_copies_replace_numpys_generator_with_a_pcg64_is_refused_naming_the_fix(
    numpy_bit_generator,
):
    loader = ResumableDataLoader(
        WorkerReplacingStream(), batch_size=2, num_workers=2, resumable=True, timeout=60
    )
    with pytest.raises(LoaderFetchFailedError, match="made a PCG64 NumPy's global") as caught:
        next(iter(loader))
    assert "np.random.Generator of the dataset's own" in str(caught.value)
    assert np.random.get_bit_generator() is numpy_bit_generator
    loader.close()
