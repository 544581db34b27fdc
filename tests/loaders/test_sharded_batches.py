"""ShardedBatchSampler: whole global batches per rank, equal counts, a global cursor."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, DistributedSampler, SequentialSampler

from trainer_resume.difference import first_difference
from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.loaders.sharded_batches import ShardedBatchSampler

SIZE, BATCH = 23, 4  # 6 global batches per epoch, the last one of 3 samples


class Augmented(Dataset):
    """Sample i: its index and a draw from each global generator (its augmentation)."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = random.random() + float(np.random.rand()) + torch.rand(()).item()
        return torch.tensor([float(index), noise], dtype=torch.float64)


def _plain(seed: int = 5, **options) -> ResumableDataLoader:
    return ResumableDataLoader(
        Augmented(),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        resumable=True,
        **options,
    )


def _sharded(replicas: int, rank: int, seed: int = 5, **options) -> ResumableDataLoader:
    inner = _plain(seed).batch_sampler
    return ResumableDataLoader(
        Augmented(),
        batch_sampler=ShardedBatchSampler(inner, num_replicas=replicas, rank=rank),
        generator=torch.Generator().manual_seed(seed),
        resumable=True,
        **options,
    )


def _epochs(loader: ResumableDataLoader, count: int) -> list[list[torch.Tensor]]:
    return [list(loader) for _ in range(count)]


def test_rank_r_of_w_reads_global_batches_r_r_plus_w_and_the_last_is_completed_from_the_start():
    batches = [list(range(start, min(start + BATCH, SIZE))) for start in range(0, SIZE, BATCH)]
    sampler = BatchSampler(SequentialSampler(range(SIZE)), BATCH, False)
    first = list(range(2 * BATCH))  # the epoch's first two batches
    assert list(ShardedBatchSampler(sampler, num_replicas=2, rank=0)) == batches[0::2]
    assert list(ShardedBatchSampler(sampler, num_replicas=2, rank=1)) == [
        batches[1],
        batches[3],
        batches[5] + first[:1],
    ]
    three = [list(ShardedBatchSampler(sampler, num_replicas=3, rank=r)) for r in range(3)]
    assert three[2][-1] == batches[5] + first[:1]
    assert [len(shard) for shard in three] == [2, 2, 2]
    dropping = BatchSampler(SequentialSampler(range(SIZE)), BATCH, True)  # 5 whole batches
    assert list(ShardedBatchSampler(dropping, num_replicas=2, rank=1)) == [batches[1], batches[3]]
    assert len(ShardedBatchSampler(dropping, num_replicas=2, rank=1)) == 2


def test_one_rank_reads_exactly_what_the_loader_without_shard_reads():
    expected = _epochs(_plain(num_workers=0), 2)
    got = _epochs(_sharded(1, 0, num_workers=2), 2)
    assert len(got[0]) == len(expected[0]) == 6
    for epoch, (a, b) in enumerate(zip(expected, got)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), epoch


def test_two_ranks_read_the_global_batches_in_turn_with_the_same_augmentation():
    # Global batch g gets the same samples and the same augmentation on whichever rank
    # reads it: its seed follows its global position, not the world size.
    single = _epochs(_plain(), 1)[0]
    ranks = [_epochs(_sharded(2, rank), 1)[0] for rank in range(2)]
    assert [len(shard) for shard in ranks] == [3, 3]
    for number, batch in enumerate(single[:5]):
        assert torch.equal(ranks[number % 2][number // 2], batch), number
    last = ranks[1][2]
    assert torch.equal(last[:3], single[5])
    assert last[3, 0] == single[0][0, 0]  # the epoch's first sample completes the last batch


def test_ranks_at_the_same_step_save_the_same_global_position():
    ranks = [_sharded(2, rank) for rank in range(2)]
    iterators = [iter(loader) for loader in ranks]
    for iterator in iterators:
        next(iterator)
    states = [loader.state_dict() for loader in ranks]
    assert first_difference(states[0], states[1]) is None
    assert states[0]["sampler"]["offset"] == 2
    assert states[0]["delivered_batches"] == 2


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_state_of_two_ranks_continues_the_epoch_on_another_number_of_ranks(replicas):
    single = _epochs(_plain(), 2)
    ranks = [_sharded(2, rank) for rank in range(2)]
    iterators = [iter(loader) for loader in ranks]
    for iterator in iterators:
        next(iterator)  # global batches 0 and 1 delivered
    state = ranks[0].state_dict()
    resumed = [_sharded(replicas, rank, seed=99) for rank in range(replicas)]
    for loader in resumed:
        loader.load_state_dict(state)
    rest = [list(loader) for loader in resumed]
    assert len({len(shard) for shard in rest}) == 1  # every rank the same count
    read = sorted((number, rank) for rank in range(replicas) for number in range(len(rest[rank])))
    global_rest = [rest[rank][number] for number, rank in read]
    # Global batches 2..5, each once, in order; then the new world size's completion.
    for offset, batch in enumerate(single[0][2:5]):
        assert torch.equal(global_rest[offset], batch), offset
    assert torch.equal(global_rest[3][:3], single[0][5])
    if replicas == 1:
        assert len(global_rest) == 4
    next_epoch = [list(loader) for loader in resumed]
    if replicas == 1:
        assert all(torch.equal(a, b) for a, b in zip(single[1], next_epoch[0]))


def test_a_sharded_distributed_sampler_is_refused_where_the_loader_is_built():
    dataset = Augmented()
    inner = BatchSampler(DistributedSampler(dataset, num_replicas=2, rank=0), BATCH, False)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(
            dataset,
            batch_sampler=ShardedBatchSampler(inner, num_replicas=2, rank=0),
            resumable=True,
        )
    assert caught.value.code == 332
    assert caught.value.detail == (
        "a ShardedBatchSampler over "
        "DistributedSampler cannot be repositioned: use torch's SequentialSampler, RandomSampler, "
        "SubsetRandomSampler or WeightedRandomSampler inside it (a DistributedSampler is sharded "
        "already)"
    )


def test_only_torch_batch_sampler_is_sharded():
    with pytest.raises(TypeError, match="exact type"):
        ShardedBatchSampler([[0, 1]], num_replicas=1, rank=0)  # type: ignore[arg-type]
