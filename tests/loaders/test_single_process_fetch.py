"""Without workers, a resumable loader fetches each batch past torch's per-item wrappers."""

from __future__ import annotations

import pytest
import torch
from support.iterable_streams import CountingStream
from torch.utils.data import TensorDataset
from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

from trainer_resume.loaders import ResumableDataLoader, _iterator


def _map_style() -> ResumableDataLoader:
    dataset = TensorDataset(torch.arange(40, dtype=torch.float64).unsqueeze(1))
    return ResumableDataLoader(dataset, batch_size=4, shuffle=True, resumable=True)


def _iterable() -> ResumableDataLoader:
    return ResumableDataLoader(CountingStream(), batch_size=4, resumable=True)


def _batches(make, count: int) -> list[torch.Tensor]:
    torch.manual_seed(0)  # the loader's seeds (shuffle, augmentation) drawn alike
    loader = make()
    batches = iter(loader)
    taken = []
    for _ in range(count):
        batch = next(batches)
        taken.append(batch[0] if isinstance(batch, list) else batch)
    loader.close()
    return taken


@pytest.mark.parametrize("make", [_map_style, _iterable], ids=["map-style", "iterable"])
def test_batches_fetched_past_next_data_equal_those_fetched_through_it(monkeypatch, make):
    with monkeypatch.context() as through_torch:
        through_torch.setattr(_iterator, "_direct_route", lambda inner: None)
        expected = _batches(make, 7)

    def refuse(self):
        raise AssertionError("the loader went through _next_data")

    monkeypatch.setattr(_SingleProcessDataLoaderIter, "_next_data", refuse)
    got = _batches(make, 7)
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("make", [_map_style, _iterable], ids=["map-style", "iterable"])
def test_under_a_profiler_each_batch_keeps_torchs_record(make):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        _batches(make, 3)
    names = [event.name for event in profile.events()]
    assert sum(name.startswith("enumerate(DataLoader)") for name in names) == 3
