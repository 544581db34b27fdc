"""The step-boundary agreement leaves nothing for the backend's threads to release in Python.

A tensor made in Python and released by gloo's run loop makes that thread take the GIL
with a thread state created for the occasion; at a step boundary, with a loader forking
its workers right after, that hangs the forked child on CPython 3.11 before 3.11.8 and
on 3.10 (CPython gh-112275).
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from trainer_resume import distributed

ROUNDS = 20


@pytest.fixture
def gloo_group(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _settled(released: list[int], count: int) -> None:
    """Wait (at most 30 s) until ``count`` tensors are released, then a little longer."""
    deadline = time.monotonic() + 30
    while len(released) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time for one more release, which must not come


def test_the_step_boundary_agreement_holds_its_tensor_until_the_next_one_releases_it_here(
    gloo_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    released_on: list[int] = []
    all_reduce = dist.all_reduce

    def watched(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        weakref.finalize(tensor, lambda: released_on.append(threading.get_ident()))
        return all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", watched)
    for round in range(ROUNDS):
        assert distributed.any_ranks([round % 2 == 0, True]) == [round % 2 == 0, True]
    _settled(released_on, ROUNDS - 1)
    assert len(released_on) == ROUNDS - 1  # the latest agreement's tensor is still held
    assert distributed.any_ranks([False]) == [False]
    _settled(released_on, ROUNDS)
    # Held long after the backend let go of it, it is released by the next agreement, here.
    assert len(released_on) == ROUNDS and released_on[-1] == threading.get_ident()


def test_is_distributed_sees_a_process_group_made_after_the_library_was_imported(
    gloo_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dist, "get_world_size", lambda *args, **kwargs: 2)  # as two ranks would
    assert distributed.is_distributed()


def test_is_distributed_is_false_once_the_process_group_is_destroyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    dist.destroy_process_group()
    monkeypatch.setattr(dist, "get_world_size", lambda *args, **kwargs: 2)
    assert not distributed.is_distributed()
