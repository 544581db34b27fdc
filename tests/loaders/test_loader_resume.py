"""Exact resume of ResumableDataLoader: uninterrupted stream == pause -> new process -> resume."""

from __future__ import annotations

import collections

import pytest
import torch
from support import loader_streams as streams

from trainer_resume.rng import derive_seed, random_state, rng_scope

AFTER = 9  # batches compared after the last pause point (crosses at least one more cycle)


def _total(target: str) -> int:
    return max(streams.pause_points(target)) + AFTER


@pytest.fixture(scope="module")
def uninterrupted():
    """Per (target, workers): the uninterrupted batches and the state before each batch."""
    return {
        (target, workers): streams.run_with_states(target, workers, _total(target))
        for target in streams.TARGETS
        for workers in (0, 2)
    }


@pytest.fixture(scope="module")
def resumed_in_spawned_process(uninterrupted, tmp_path_factory):
    """One spawned process resumes every (target, workers, pause point) from its saved state."""
    jobs = []
    for (target, workers), (_, states) in uninterrupted.items():
        for k in streams.pause_points(target):
            jobs.append((target, workers, k, states[k], _total(target) - k))
    out = tmp_path_factory.mktemp("resume") / "resumed.pt"
    return streams.run_spawned(streams.resume_jobs, jobs, out=out)["results"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("target", streams.TARGETS)
def test_resume_in_spawned_process_continues_the_uninterrupted_stream(
    uninterrupted, resumed_in_spawned_process, target, workers
):
    batches, _ = uninterrupted[(target, workers)]
    for k in streams.pause_points(target):
        got = resumed_in_spawned_process[f"{target}/{workers}/{k}"]
        assert len(got) == len(batches) - k
        for offset, (expected, actual) in enumerate(zip(batches[k:], got)):
            assert torch.equal(expected, actual), (
                f"paused after {k} batches: batch {k + offset} differs"
            )


@pytest.mark.slow
@pytest.mark.parametrize("target", streams.TARGETS)
def test_stream_and_states_do_not_depend_on_the_number_of_workers(uninterrupted, target):
    batches_0, states_0 = uninterrupted[(target, 0)]
    batches_2, states_2 = uninterrupted[(target, 2)]
    assert states_0 == states_2
    for index, (a, b) in enumerate(zip(batches_0, batches_2)):
        assert torch.equal(a, b), f"batch {index}"


@pytest.mark.slow
@pytest.mark.parametrize("target", streams.TARGETS)
def test_state_with_deep_prefetch_counts_only_delivered_batches(target):
    count = _total(target)
    _, states_0 = streams.run_with_states(target, 0, count, seed=5)
    _, states_2 = streams.run_with_states(target, 2, count, seed=5, prefetch_factor=4)
    assert states_2 == states_0
    assert [state["delivered_batches"] for state in states_2] == list(range(count + 1))


def test_a_sample_drawn_twice_gets_different_augmentation_and_a_resumed_position_the_same():
    torch.manual_seed(1)
    dataset = streams.AugmentedDataset(size=4)
    loader = streams.make_loader("sampler", dataset=dataset)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(3)]  # 3 batches of 4 = 3 cycles of the 4 samples
    state = loader.state_dict()
    later = [next(iterator) for _ in range(2)]
    rows = torch.cat([batch[:-1] for batch in first])  # drop the collate row
    by_id = collections.defaultdict(list)
    for row in rows:
        by_id[int(row[0])].append(row[1:])
    assert sorted(by_id) == [0, 1, 2, 3] and all(len(draws) == 3 for draws in by_id.values())
    for draws in by_id.values():
        for i in range(3):
            for j in range(i + 1, 3):
                assert (draws[i] != draws[j]).all(), "a repeated sample reused a generator draw"

    torch.manual_seed(2)
    fresh = streams.make_loader("sampler", dataset=streams.AugmentedDataset(size=4))
    fresh.load_state_dict(state)
    again = iter(fresh)
    for expected in later:
        assert torch.equal(next(again), expected)


def test_sample_augmentation_is_the_dataset_under_rng_scope_of_its_stream_position():
    torch.manual_seed(3)
    dataset = streams.AugmentedDataset()
    loader = streams.make_loader("sampler", dataset=dataset, collate_fn=None)
    iterator = iter(loader)
    for batch_number in range(4):
        batch = next(iterator)
        for row_number, row in enumerate(batch):
            position = batch_number * streams.BATCH + row_number
            with rng_scope(derive_seed(loader.augmentation_seed, position)):
                expected = dataset[int(row[0])]
            assert torch.equal(row, expected), f"stream position {position}"


@pytest.mark.parametrize("target", streams.TARGETS)
def test_iterating_leaves_the_callers_generators_untouched_without_workers(target):
    torch.manual_seed(4)
    loader = streams.make_loader(target)
    before = random_state()
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    after = random_state()
    assert torch.equal(before["torch"], after["torch"])
    assert torch.equal(before["python"]["internal"], after["python"]["internal"])
    assert torch.equal(before["numpy"]["keys"], after["numpy"]["keys"])
    assert before["numpy"]["pos"] == after["numpy"]["pos"]


@pytest.mark.parametrize("k", [0, 1, 2, 3, 7])
def test_a_full_cycle_after_resume_has_no_duplicate_and_no_gap(k):
    torch.manual_seed(6)
    loader = streams.make_loader("sampler", collate_fn=None)
    iterator = iter(loader)
    for _ in range(k):
        next(iterator)
    fresh = streams.make_loader("sampler", collate_fn=None)
    fresh.load_state_dict(loader.state_dict())
    consumed = fresh.state_dict()["sampler"]["consumed"]
    cycle_end = (consumed // streams.SIZE + 1) * streams.SIZE
    ids = torch.cat(
        [
            batch[:, 0]
            for batch in _take(fresh, (cycle_end + streams.SIZE - consumed) // streams.BATCH + 1)
        ]
    )
    first_full_cycle = ids[cycle_end - consumed : cycle_end - consumed + streams.SIZE]
    assert sorted(first_full_cycle.long().tolist()) == list(range(streams.SIZE))


@pytest.mark.parametrize("target", ["naive", "class_balance", "balance"])
def test_a_full_batch_sampler_cycle_after_resume_matches_a_full_cycle_of_a_fresh_stream(target):
    torch.manual_seed(7)
    loader = streams.make_loader(target, collate_fn=None)
    per_cycle = streams.batches_per_cycle(target)
    uninterrupted = _take(loader, 3 * per_cycle)
    torch.manual_seed(7)
    paused = streams.make_loader(target, collate_fn=None)
    _take(paused, 2)
    fresh = streams.make_loader(target, collate_fn=None)
    fresh.load_state_dict(paused.state_dict())
    rest = _take(fresh, 3 * per_cycle - 2)
    # The next complete cycle (cycle 1) holds exactly the ids the uninterrupted cycle 1 holds.
    resumed_cycle = torch.cat(rest[per_cycle - 2 : 2 * per_cycle - 2])[:, 0]
    expected_cycle = torch.cat(uninterrupted[per_cycle : 2 * per_cycle])[:, 0]
    assert torch.equal(resumed_cycle, expected_cycle)
    ids = resumed_cycle.long().tolist()
    if target == "naive":  # a permutation of the dataset
        assert sorted(ids) == list(range(streams.SIZE))
    elif target == "class_balance":  # every class oversampled to the largest (5 samples each)
        assert collections.Counter(streams.LABELS[i] for i in ids) == {0: 5, 1: 5, 2: 5}
        assert set(ids) == set(range(streams.SIZE))
    else:  # group 0: 5 indices x 1.5 -> 7 samples; group 1: 5 x 0.4 -> 2 samples
        assert collections.Counter(streams.GROUPS[i] for i in ids) == {0: 7, 1: 2}
        counts = collections.Counter(i for i in ids if streams.GROUPS[i] == 0)
        assert set(counts) == {0, 2, 4, 6, 8} and sorted(counts.values()) == [1, 1, 1, 2, 2]


def _take(loader, count: int) -> list[torch.Tensor]:
    iterator = iter(loader)
    return [next(iterator) for _ in range(count)]
