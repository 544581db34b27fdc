"""Iterable datasets read as torch's fetcher reads them (one ``iter()`` per pass, then ``next()``)
and resumed exactly in a fresh loader: a dataset that is its own restarting iterator, one
that reads on after a load, and datasets that keep torch's global generator in their state,
applied at once or lazily."""

from __future__ import annotations

import random
from itertools import islice

import numpy as np
import pytest
import torch
from support import iterable_streams as iterables
from torch.utils.data import BatchSampler, DataLoader, Dataset

from trainer_resume.loaders import ResumableDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

KINDS = ["restarting", "resuming", "torch-rng-eager", "torch-rng-lazy"]
PASSES = 2
# Batches per pass: 35 items, with 3 workers split 23 + 0 + 12 (batches of 7: 4 + 0 + 2).
PER_PASS = {(7, 0): 5, (None, 0): 35, (7, 3): 6, (None, 3): 35}


def _check_every_interrupt(kind: str, batch_size: int | None, workers: int, persistent: bool):
    """Interrupted after 0, 1 and 10 batches and at the end of the first pass, a fresh
    loader finishes both passes with the uninterrupted loader's batches."""
    batches, states, _ = iterables.uninterrupted(
        kind, batch_size, workers, persistent, epochs=PASSES
    )
    per_pass = PER_PASS[batch_size, workers]
    assert len(batches) == PASSES * per_pass
    # A dataset that reads on at the iter() after a load, loaded at a pass's end, reads on
    # from that end in the next pass (docs/data-loading.md): its positions inside passes.
    ends = () if kind == "resuming" else (per_pass,)
    for k in (0, 1, 10, *ends):
        iterables.assert_same_batches(
            batches[k:],
            iterables.resumed(kind, batch_size, workers, persistent, states[k], epochs=PASSES),
            f"{kind}, batch_size={batch_size}, {workers} workers, persistent={persistent}, at {k}",
        )


@pytest.mark.parametrize("batch_size", [7, None])
@pytest.mark.parametrize("kind", KINDS)
def test_without_workers_a_fresh_loader_resumes_every_batch_of_the_uninterrupted_one(
    kind, batch_size
):
    _check_every_interrupt(kind, batch_size, 0, False)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize(
    ("kind", "batch_size"),
    [
        ("restarting", 7),
        ("restarting", None),
        ("resuming", 7),
        # The generator-keeping datasets read as the restarting one; one batch size keeps
        # the worker cases few.
        ("torch-rng-eager", 7),
        ("torch-rng-lazy", 7),
    ],
)
def test_with_three_workers_a_fresh_loader_resumes_every_batch_of_the_uninterrupted_one(
    kind, batch_size, persistent
):
    _check_every_interrupt(kind, batch_size, 3, persistent)


def _ids(loader, passes: int = PASSES, limit: int = 200) -> list:
    # At most `limit` batches per pass: a reader that restarts the iterator would never end.
    return [batch[..., 0].tolist() for _ in range(passes) for batch in islice(iter(loader), limit)]


@pytest.mark.parametrize(
    ("batch_size", "workers"),
    [(7, 0), (None, 0), pytest.param(7, 3, marks=pytest.mark.slow)],
)
def test_a_dataset_that_is_its_own_iterator_is_read_through_once_per_pass_as_by_dataloader(
    batch_size, workers
):
    def read(cls, **options):
        return _ids(
            cls(
                iterables.RestartingStream(),
                batch_size=batch_size,
                num_workers=workers,
                **options,
            )
        )

    ours = read(ResumableDataLoader, resumable=True)
    assert ours == read(DataLoader)
    items = [item for batch in ours for item in (batch if batch_size else [batch])]
    assert sorted(items) == sorted(list(range(35)) * PASSES)


def test_drop_last_with_a_dataset_that_is_its_own_iterator_drops_what_dataloader_drops():
    def read(cls, **options):
        return _ids(cls(iterables.RestartingStream(), batch_size=6, drop_last=True, **options))

    assert read(ResumableDataLoader, resumable=True) == read(DataLoader)


class _Items(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class _RestartingSampler:
    """A stateful sampler that is its own iterator and restarts in ``__iter__``."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> _RestartingSampler:
        self.position = 0
        return self

    def __next__(self) -> int:
        if self.position >= 10:
            raise StopIteration
        self.position += 1
        return (3 * self.position) % 10

    def __len__(self) -> int:
        return 10

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_a_stateful_sampler_that_is_its_own_iterator_is_read_through_once_per_epoch():
    # torch's own BatchSampler cuts it with islice, which restarts it for every batch
    # (DataLoader repeats its first batch forever); the resumable loader reads it through.
    loader = ResumableDataLoader(
        _Items(), batch_sampler=BatchSampler(_RestartingSampler(), 4, False), resumable=True
    )
    epoch = [[3.0, 6.0, 9.0, 2.0], [5.0, 8.0, 1.0, 4.0], [7.0, 0.0]]
    assert _ids(loader) == epoch * PASSES


@pytest.mark.parametrize("kind", ["torch-rng-eager", "torch-rng-lazy"])
def test_the_rng_datasets_draw_new_values_every_batch_and_save_the_generator(kind):
    batches, states, _ = iterables.uninterrupted(kind, 7, 0, False, epochs=PASSES)
    draws = torch.cat([batch[:, 1] for batch in batches])
    assert len(set(draws.tolist())) == len(draws)  # no batch repeats another's draws
    saved = states[3]["sampler"]["workers"][0]["dataset_state"]["torch"]
    assert saved.dtype == torch.uint8 and saved.numel() > 5000


def test_loading_a_state_that_sets_the_global_generator_leaves_the_callers_generators_alone():
    _, states, _ = iterables.uninterrupted("torch-rng-eager", 7, 0, False, epochs=PASSES)
    loader = iterables.make_loader("torch-rng-eager", 7)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    loader.load_state_dict(states[2])  # the dataset calls torch.set_rng_state() as it loads
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
