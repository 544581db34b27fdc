"""ResumableDataLoader failures: fetch, commit, invalidation, bad states, worker cleanup."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from support import iterable_streams
from support import loader_streams as streams
from torch.utils.data import DataLoader

from trainer_resume.errors import (
    IteratorInvalidatedError,
    LoaderCommitFailedError,
    LoaderFetchFailedError,
    LoaderStateError,
)

WORKERS = [0, pytest.param(2, marks=pytest.mark.slow)]


def _reference(target: str, count: int, seed: int = 0) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    loader = streams.make_loader(target)
    iterator = iter(loader)
    return [next(iterator) for _ in range(count)]


def _first_batch_containing(batches: list[torch.Tensor], index: int) -> int:
    return next(
        number for number, batch in enumerate(batches) if index in batch[:-1, 0].long().tolist()
    )


@pytest.mark.parametrize("workers", WORKERS)
def test_resume_after_fetch_failure_restarts_at_the_last_delivered_batch(tmp_path, workers):
    expected = _reference("sampler", 8)
    bad = 7
    failing = _first_batch_containing(expected, bad)
    flag = tmp_path / "fail"
    flag.touch()
    torch.manual_seed(0)
    loader = streams.make_loader(
        "sampler", num_workers=workers, dataset=streams.FlagFailingDataset(str(flag), bad)
    )
    iterator = iter(loader)
    got = [next(iterator) for _ in range(failing)]
    with pytest.raises(LoaderFetchFailedError) as caught:
        next(iterator)
    assert f"dataset[{bad}]" in caught.value.detail
    assert isinstance(caught.value.__cause__, ValueError)
    assert f"cannot decode sample {bad}" in str(caught.value.__cause__)
    assert loader.state_dict()["delivered_batches"] == failing
    with pytest.raises(LoaderFetchFailedError):  # the iterator is dead
        next(iterator)
    with pytest.raises(LoaderFetchFailedError):  # close() first
        iter(loader)

    flag.unlink()
    loader.close()
    resumed = iter(loader)
    got += [next(resumed) for _ in range(len(expected) - failing)]
    loader.close()  # `caught` keeps this frame alive in a cycle: stop the workers now
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


class _FailsAt(torch.utils.data.Dataset):
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad:
            raise ValueError(f"cannot read sample {index}")
        return torch.tensor([index])


@pytest.mark.parametrize("bad", [8, 9, 11])
def test_a_failing_sample_is_named_with_its_stream_position_wherever_it_lies_in_its_batch(bad):
    from trainer_resume.loaders import ResumableDataLoader

    loader = ResumableDataLoader(_FailsAt(bad), batch_size=4, resumable=True)
    iterator = iter(loader)
    assert [next(iterator).flatten().tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(LoaderFetchFailedError) as caught:
        next(iterator)
    # Unshuffled, one replica: sample i lies at stream position i.
    assert f"dataset[{bad}] raised ValueError" in caught.value.detail
    assert f"(stream position {bad})" in caught.value.detail
    assert loader.state_dict()["delivered_batches"] == 2
    loader.close()


@pytest.mark.slow
def test_resume_after_a_worker_died_restarts_at_the_last_delivered_batch(tmp_path):
    expected = _reference("sampler", 8)
    bad = 5
    failing = _first_batch_containing(expected, bad)
    flag = tmp_path / "exit"
    flag.touch()
    torch.manual_seed(0)
    loader = streams.make_loader(
        "sampler",
        num_workers=2,
        prefetch_factor=1,
        dataset=streams.FlagExitingDataset(str(flag), bad),
    )
    got = []
    # The worker may die while iter() still starts the workers (torch raises from its
    # SIGCHLD handler wherever the main thread is) or after some batches were delivered.
    with pytest.raises(LoaderFetchFailedError, match="stream position") as caught:
        iterator = iter(loader)
        while True:
            got.append(next(iterator))
    assert isinstance(caught.value.__cause__, RuntimeError)  # torch's "worker exited unexpectedly"
    assert len(got) <= failing
    assert loader.state_dict()["delivered_batches"] == len(got)
    flag.unlink()
    loader.close()
    resumed = iter(loader)
    got += [next(resumed) for _ in range(len(expected) - len(got))]
    loader.close()
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def _map_style_loader() -> Any:
    torch.manual_seed(0)
    return streams.make_loader("sampler", num_workers=2, prefetch_factor=1)


def _iterable_loader() -> Any:
    torch.manual_seed(0)
    return iterable_streams.make_loader(num_workers=2, prefetch_factor=1)


@pytest.mark.parametrize("make", [_map_style_loader, _iterable_loader], ids=["map", "iterable"])
def test_a_worker_dying_while_iter_starts_the_workers_is_a_fetch_failure_that_close_clears(
    monkeypatch, make
):
    # Where torch raises it when a worker dies before iter() returned: from iter() itself.
    uninterrupted = make()
    reference = iter(uninterrupted)
    expected = [next(reference) for _ in range(4)]
    uninterrupted.close()
    loader = make()
    started = DataLoader._get_iterator

    def dying(engine):
        started(engine)  # the workers start; one of them then dies
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly with exit code 3")

    monkeypatch.setattr(DataLoader, "_get_iterator", dying)
    with pytest.raises(LoaderFetchFailedError) as caught:
        iter(loader)
    assert caught.value.detail.startswith(
        "starting the iteration failed: RuntimeError: DataLoader worker (pid 1) exited "
        "unexpectedly with exit code 3"
    )
    assert caught.value.detail.endswith(
        "; call close() on the loader, then iter() resumes at the last delivered batch"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(LoaderFetchFailedError):  # close() first
        iter(loader)
    monkeypatch.undo()
    loader.close()
    resumed = iter(loader)
    got = [next(resumed) for _ in range(len(expected))]
    loader.close()
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_another_failure_to_start_the_workers_is_raised_as_it_is(monkeypatch):
    # Not a worker that died: a retry would fail the same way, so no advice to retry.
    loader = _map_style_loader()

    def failing(engine):
        raise RuntimeError("cannot pickle the dataset for the spawned workers")

    monkeypatch.setattr(DataLoader, "_get_iterator", failing)
    with pytest.raises(RuntimeError, match="cannot pickle") as caught:
        iter(loader)
    assert not isinstance(caught.value, LoaderFetchFailedError)


def _failing_collate(samples):
    if any(int(sample[0]) == 3 for sample in samples):
        raise RuntimeError("collate cannot stack sample 3")
    return streams.noisy_collate(samples)


def test_a_failing_collate_raises_fetch_failed_naming_the_batch():
    torch.manual_seed(0)
    loader = streams.make_loader("naive", collate_fn=_failing_collate)
    with pytest.raises(LoaderFetchFailedError, match="collate_fn") as caught:
        for _ in loader:
            pass
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "stream position" in caught.value.detail


@pytest.mark.slow
def test_a_worker_exception_that_cannot_be_pickled_is_reported_with_its_worker_traceback():
    torch.manual_seed(0)
    loader = streams.make_loader(
        "sampler", num_workers=2, dataset=streams.UnpicklableFailureDataset()
    )
    with pytest.raises(LoaderFetchFailedError, match="UnpicklableError") as caught:
        next(iter(loader))
    cause = caught.value.__cause__
    assert isinstance(cause, RuntimeError) and "sample 0 is unreadable" in str(cause)
    assert "UnpicklableError" in str(cause) and "__getitem__" in str(
        cause
    )  # the worker's traceback


def test_commit_failure_blocks_state_and_iteration_until_load_state_dict(monkeypatch):
    expected = _reference("naive", 6)
    torch.manual_seed(0)
    loader = streams.make_loader("naive")
    batch_sampler = loader.batch_sampler
    iterator = iter(loader)
    got = [next(iterator), next(iterator)]
    saved = loader.state_dict()
    calls = []

    def broken_commit(cycle, offset):
        calls.append((cycle, offset))
        raise OSError("cursor storage unavailable")

    monkeypatch.setattr(batch_sampler, "_commit", broken_commit)
    with pytest.raises(LoaderCommitFailedError) as caught:
        next(iterator)
    assert calls == [(1, 0)]  # the patch hit the real commit of batch 2
    assert isinstance(caught.value.__cause__, OSError)
    for blocked in (loader.state_dict, lambda: iter(loader), lambda: next(iterator)):
        with pytest.raises(LoaderCommitFailedError):
            blocked()
    monkeypatch.undo()
    with pytest.raises(LoaderCommitFailedError):  # fixing the cause is not enough
        loader.state_dict()
    loader.load_state_dict(saved)
    resumed = iter(loader)
    got += [next(resumed) for _ in range(4)]
    loader.close()
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_moving_the_sampler_under_the_loader_is_a_commit_failure():
    loader = streams.make_loader("sampler")
    iterator = iter(loader)
    next(iterator)
    loader.sampler.advance(1)
    with pytest.raises(LoaderCommitFailedError, match="stream position"):
        next(iterator)


@pytest.mark.parametrize("workers", WORKERS)
def test_close_invalidates_iterators_and_the_next_iter_starts_at_the_first_undelivered_batch(
    workers,
):
    expected = _reference("class_balance", 7)
    torch.manual_seed(0)
    loader = streams.make_loader(
        "class_balance", num_workers=workers, prefetch_factor=3 if workers else None
    )
    old = iter(loader)
    got = [next(old) for _ in range(3)]
    loader.close()
    with pytest.raises(IteratorInvalidatedError):
        next(old)
    new = iter(loader)
    assert new is not old
    got += [next(new) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("workers", WORKERS)
def test_load_state_dict_invalidates_old_iterators_and_drops_the_prefetch(workers):
    expected = _reference("balance", 9)
    torch.manual_seed(0)
    source = streams.make_loader("balance")
    source_iterator = iter(source)
    for _ in range(2):
        next(source_iterator)
    state = source.state_dict()

    torch.manual_seed(0)
    loader = streams.make_loader("balance", num_workers=workers)
    old = iter(loader)
    for _ in range(5):  # ahead of the state, with prefetched batches in flight
        next(old)
    loader.load_state_dict(state)
    with pytest.raises(IteratorInvalidatedError):
        next(old)
    new = iter(loader)
    got = [next(new) for _ in range(7)]
    assert all(torch.equal(a, b) for a, b in zip(expected[2:], got, strict=True))


@pytest.mark.slow
def test_a_rejected_state_leaves_running_workers_and_iterator_untouched():
    expected = _reference("sampler", 8)
    torch.manual_seed(0)
    loader = streams.make_loader("sampler", num_workers=2, prefetch_factor=4)
    iterator = iter(loader)
    got = [next(iterator) for _ in range(3)]
    bad = loader.state_dict()
    bad["sampler"] = {**bad["sampler"], "consumed": 1}
    workers = [worker.pid for worker in iterator._inner._workers]
    with pytest.raises(LoaderStateError):
        loader.load_state_dict(bad)
    assert [worker.pid for worker in iterator._inner._workers] == workers
    assert all(worker.is_alive() for worker in iterator._inner._workers)
    got += [next(iterator) for _ in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.slow
def test_dropping_loader_and_iterator_stops_the_workers_without_a_reference_cycle():
    loader = streams.make_loader("sampler", num_workers=2)
    iterator = iter(loader)
    next(iterator)
    inner = iterator._inner
    processes = list(inner._workers)
    references = [weakref.ref(obj) for obj in (loader, iterator, inner)]
    del inner
    gc.disable()  # freed by reference counting alone, or not at all
    try:
        del loader, iterator
        assert [reference() is None for reference in references] == [True, True, True]
    finally:
        gc.enable()
    for process in processes:
        process.join(timeout=10)
        assert not process.is_alive()
