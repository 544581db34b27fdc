"""ResumableDataLoader with worker processes: persistent workers, spawn, pin_memory, worker_init_fn."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from support import loader_streams as streams

pytestmark = pytest.mark.slow


def _stream(
    target: str, count: int, *, repeat: bool = True, seed: int = 0, **options
) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    loader = streams.make_loader(target, repeat=repeat, **options)
    batches = []
    while len(batches) < count:  # with repeat=False each loop is one cycle
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
    loader.close()
    return batches


def _assert_same(expected, got):
    assert len(expected) == len(got)
    for number, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"batch {number}"


def test_persistent_workers_over_several_cycles_and_a_resume_give_the_single_process_stream():
    expected = _stream("class_balance", 14, repeat=False)
    torch.manual_seed(0)
    loader = streams.make_loader(
        "class_balance", repeat=False, num_workers=2, persistent_workers=True
    )
    got = list(loader)  # cycle 0
    iterator = iter(loader)
    got += [next(iterator), next(iterator)]
    state = loader.state_dict()
    got += list(iterator)  # rest of cycle 1, then a new loop reuses the workers
    got += list(loader)
    _assert_same(expected[:12], got)

    resumed = streams.make_loader(
        "class_balance", repeat=False, num_workers=2, persistent_workers=True
    )
    resumed.load_state_dict(state)
    tail = list(resumed) + list(resumed)
    _assert_same(expected[6:12], tail)
    resumed.close()
    loader.close()


def test_spawned_workers_with_worker_init_fn_and_pin_memory_give_the_single_process_stream(
    tmp_path,
):
    expected = _stream("sampler", 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator warns
        got = _stream(
            "sampler",
            6,
            num_workers=2,
            multiprocessing_context="spawn",
            worker_init_fn=functools.partial(streams.mark_worker, str(tmp_path)),
            pin_memory=True,
            prefetch_factor=1,
        )
    _assert_same(expected, got)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["worker-0", "worker-1"]


def test_closing_a_loader_whose_spawned_workers_abort_as_they_exit_raises_nothing():
    # torch's SIGCHLD handler would raise "DataLoader worker (pid N) is killed by signal:
    # Aborted" inside close(), after every batch had been delivered.
    expected = _stream("sampler", 3)
    got = _stream(
        "sampler",
        3,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=streams.abort_at_exit,
        prefetch_factor=1,
    )
    _assert_same(expected, got)
