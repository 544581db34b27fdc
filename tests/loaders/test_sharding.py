"""Sharded streams: rank r of W reads global positions r, r+W, ... and states hold the global cursor.

No process group is needed: every sampler here gets explicit ``num_replicas`` / ``rank``.
The reference is always the same stream read by one replica (same seed).
"""

from __future__ import annotations

import collections
import io
from typing import Any

import pytest
import torch
from support import loader_streams as streams

from trainer_resume.errors import LoaderStateError, ResumableBatchConfigurationError
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    _sharding,
    build_batch_sampler,
)

SEED = 1234
TARGETS = streams.TARGETS  # "sampler" plus every batch-sampler target
OPTIONS: dict[str, dict[str, Any]] = {
    "balance": {"groups": streams.GROUPS, "ratios": streams.RATIOS}
}


def _generator() -> torch.Generator:
    # Every rank draws the same stream seed (the documented requirement).
    return torch.Generator().manual_seed(SEED)


def _sampler(
    target: str,
    *,
    world: int,
    rank: int,
    repeat: bool = True,
    batch: int = streams.BATCH,
) -> Any:
    dataset = streams.AugmentedDataset()
    if target == "sampler":
        return InfiniteRandomSampler(
            dataset,
            generator=_generator(),
            resumable=True,
            num_replicas=world,
            rank=rank,
        )
    return build_batch_sampler(
        target,
        dataset,
        batch,
        repeat=repeat,
        shuffle=True,
        drop_last=False,
        resumable=True,
        generator=_generator(),
        num_replicas=world,
        rank=rank,
        **OPTIONS.get(target, {}),
    )


def _loader(target: str, *, world: int, rank: int, workers: int = 0) -> ResumableDataLoader:
    sampler = _sampler(target, world=world, rank=rank)
    dataset = streams.AugmentedDataset()
    generator = torch.Generator().manual_seed(
        SEED + 1
    )  # the augmentation seed, equal on every rank
    if target == "sampler":
        return ResumableDataLoader(
            dataset,
            batch_size=streams.BATCH,
            sampler=sampler,
            num_workers=workers,
            generator=generator,
            resumable=True,
        )
    return ResumableDataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        generator=generator,
        resumable=True,
    )


def _take(iterator: Any, count: int) -> list[Any]:
    return [next(iterator) for _ in range(count)]


def _rows_by_id(batches: list[torch.Tensor]) -> collections.Counter:
    return collections.Counter(int(row[0]) for batch in batches for row in batch)


@pytest.mark.parametrize("world", [2, 3])
def test_sampler_rank_r_reads_every_world_th_position_of_the_global_stream(world):
    reference = iter(_sampler("sampler", world=1, rank=0))
    global_stream = _take(reference, 40 * world)
    for rank in range(world):
        shard = _take(iter(_sampler("sampler", world=world, rank=rank)), 40)
        assert shard == global_stream[rank::world]


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "sampler"])
@pytest.mark.parametrize("world", [2, 3])
def test_batch_sampler_rank_r_reads_whole_global_batches_r_plus_multiples_of_world(target, world):
    global_batches = _take(iter(_sampler(target, world=1, rank=0)), 12 * world)
    for rank in range(world):
        shard = _take(iter(_sampler(target, world=world, rank=rank)), 12)
        assert shard == global_batches[rank::world]


@pytest.mark.parametrize("target", TARGETS)
def test_union_of_all_ranks_loaders_equals_the_global_stream_with_the_same_augmentation(
    target,
):
    world, steps = 3, 7
    reference = _loader(target, world=1, rank=0)
    expected = _take(iter(reference), steps * world)
    reference_state = reference.state_dict()
    shards = [_loader(target, world=world, rank=rank) for rank in range(world)]
    got = [_take(iter(loader), steps) for loader in shards]
    if target == "sampler":
        # Sample-level sharding: rank r's batch j holds global samples r + (j*B + i) * W.
        flat_expected = torch.cat(expected)
        for rank in range(world):
            assert torch.equal(torch.cat(got[rank]), flat_expected[rank::world])
    else:
        for rank in range(world):
            for mine, theirs in zip(got[rank], expected[rank::world], strict=True):
                assert torch.equal(mine, theirs)
    for loader in shards:
        state = loader.state_dict()
        assert state["sampler"]["num_replicas"] == world
        assert state["delivered_batches"] == steps * world
        assert {k: v for k, v in state["sampler"].items() if k != "num_replicas"} == {
            k: v for k, v in reference_state["sampler"].items() if k != "num_replicas"
        }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("new_world", [1, 3])
def test_resume_with_another_world_size_loses_and_repeats_nothing(target, new_world):
    old_world, steps_before, steps_after = 2, 5, 6
    before = [_loader(target, world=old_world, rank=rank) for rank in range(old_world)]
    consumed = [batch for loader in before for batch in _take(iter(loader), steps_before)]
    state = before[0].state_dict()
    assert all(
        loader.state_dict() == state for loader in before
    )  # the global cursor, rank-independent
    for loader in before:
        loader.close()
    after = [_loader(target, world=new_world, rank=rank) for rank in range(new_world)]
    for loader in after:
        loader.load_state_dict(state)
        consumed += _take(iter(loader), steps_after)
    total = old_world * steps_before + new_world * steps_after
    expected = _take(iter(_loader(target, world=1, rank=0)), total)
    if target == "sampler":
        # Rows carry (id, augmentation draws): equal rows mean the same samples at the same
        # global positions, hence the same augmentation whatever the world size.
        got_rows = sorted(torch.cat(consumed).tolist())
        assert got_rows == sorted(torch.cat(expected).tolist())
    else:
        assert sorted(batch.tolist() for batch in consumed) == sorted(
            batch.tolist() for batch in expected
        )
    assert _rows_by_id(consumed) == _rows_by_id(expected)


@pytest.mark.parametrize("target", ["sampler", "naive"])
def test_same_world_size_resume_continues_each_rank_exactly(target):
    world, k, after = 2, 3, 5
    uninterrupted = []
    for rank in range(world):
        loader = _loader(target, world=world, rank=rank)
        uninterrupted.append(_take(iter(loader), k + after))
    paused = [_loader(target, world=world, rank=rank) for rank in range(world)]
    for loader in paused:
        _take(iter(loader), k)
    states = [loader.state_dict() for loader in paused]
    for rank in range(world):
        fresh = _loader(target, world=world, rank=rank)
        torch.manual_seed(999)  # the state must win over fresh seeds
        fresh.load_state_dict(states[rank])
        resumed = _take(iter(fresh), after)
        assert all(torch.equal(a, b) for a, b in zip(resumed, uninterrupted[rank][k:], strict=True))


def test_sharded_loader_with_workers_delivers_what_it_does_without():
    world = 2
    for rank in range(world):
        plain = _take(iter(_loader("sampler", world=world, rank=rank)), 5)
        with_workers = _loader("sampler", world=world, rank=rank, workers=2)
        got = _take(iter(with_workers), 5)
        state = with_workers.state_dict()
        with_workers.close()
        assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
        assert state["sampler"]["consumed"] == 5 * streams.BATCH * world


@pytest.mark.parametrize("target", TARGETS)
def test_states_without_num_replicas_read_as_one_replica(target):
    writer = _sampler(target, world=1, rank=0)
    writer.advance(7)
    old = {key: value for key, value in writer.state_dict().items() if key != "num_replicas"}
    reader = _sampler(target, world=1, rank=0)
    reader.load_state_dict(old)
    assert _take(iter(reader), 5) == _take(iter(writer), 5)


@pytest.mark.parametrize("target", TARGETS)
def test_sharded_state_is_plain_data(target):
    sampler = _sampler(target, world=3, rank=2)
    sampler.advance(4)
    state = sampler.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state


@pytest.mark.parametrize("target", TARGETS)
def test_advance_moves_the_global_cursor_by_world_size_per_item(target):
    sampler = _sampler(target, world=3, rank=1)
    reference = _sampler(target, world=1, rank=0)
    sampler.advance(4)
    reference.advance(12)
    assert {k: v for k, v in sampler.state_dict().items() if k != "num_replicas"} == {
        k: v for k, v in reference.state_dict().items() if k != "num_replicas"
    }


@pytest.mark.parametrize(
    ("world", "rank", "error"),
    [
        (2, 2, ValueError),
        (2, -1, ValueError),
        (0, 0, ValueError),
        (2.0, 0, TypeError),
        (2, True, TypeError),
    ],
)
def test_invalid_world_or_rank_is_refused_at_construction(world, rank, error):
    with pytest.raises(error):
        InfiniteRandomSampler(streams.AugmentedDataset(), num_replicas=world, rank=rank)
    with pytest.raises(error):
        _sampler("naive", world=world, rank=rank)


def test_defaults_come_from_an_initialized_process_group(monkeypatch):
    dist = _sharding.dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    sampler = InfiniteRandomSampler(streams.AugmentedDataset(), generator=_generator())
    batches = build_batch_sampler(
        "naive",
        streams.AugmentedDataset(),
        2,
        repeat=True,
        shuffle=False,
        drop_last=False,
    )
    assert (sampler.num_replicas, sampler.rank) == (4, 3)
    assert (batches.num_replicas, batches.rank) == (4, 3)
    assert next(iter(batches)) == [6, 7]  # global batch 3 of range(10) cut in twos


def test_defaults_without_a_process_group_are_one_replica_rank_zero():
    sampler = InfiniteRandomSampler(streams.AugmentedDataset())
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


def test_repeat_false_refuses_a_cycle_the_ranks_cannot_share_evenly():
    # naive over 10 samples in batches of 4: 3 batches per cycle.
    with pytest.raises(ResumableBatchConfigurationError, match="cannot share evenly"):
        _sampler("naive", world=2, rank=0, repeat=False)


def test_repeat_false_iterations_end_at_the_cycle_with_equal_counts_per_rank():
    # 10 samples in batches of 5: 2 batches per cycle, one per rank.
    world = 2
    shards = [
        _sampler("naive", world=world, rank=rank, repeat=False, batch=5) for rank in range(world)
    ]
    first = [list(iter(shard)) for shard in shards]
    assert [len(batches) for batches in first] == [len(shard) for shard in shards] == [1, 1]
    assert sorted(first[0][0] + first[1][0]) == list(range(10))


def test_resuming_repeat_false_where_the_rest_of_the_cycle_cannot_be_shared_fails_before_any_change():
    # 10 samples in batches of 1: 10 batches per cycle; after 1 step of 2 ranks, 8 are left.
    writers = [_sampler("naive", world=2, rank=rank, repeat=False, batch=1) for rank in range(2)]
    for writer in writers:
        writer.advance(1)
    state = writers[0].state_dict()
    reader = _sampler("naive", world=5, rank=0, repeat=False, batch=1)
    before = reader.state_dict()
    with pytest.raises(LoaderStateError, match="cannot share evenly"):
        reader.load_state_dict(state)
    assert reader.state_dict() == before
    # One rank can take the 8 that are left.
    one = _sampler("naive", world=1, rank=0, repeat=False, batch=1)
    one.load_state_dict(state)
    assert len(list(iter(one))) == 8
