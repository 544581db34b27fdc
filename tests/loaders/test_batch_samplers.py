"""build_batch_sampler targets: cycles, batching, cursor, state and configuration errors."""

from __future__ import annotations

import collections
import gc
import itertools
import weakref

import numpy as np
import pytest
import torch
from support import loader_streams as streams

from trainer_resume.errors import (
    LoaderStateError,
    ResumableBatchConfigurationError,
    ResumableModeRequiredError,
    ResumableSamplerGeneratorError,
)
from trainer_resume.loaders import build_batch_sampler


class Labelled:
    def __init__(self, labels, attribute: str = "labels") -> None:
        self.size = len(labels)
        setattr(self, attribute, labels)

    def __len__(self) -> int:
        return self.size


def _build(target="naive", dataset=range(10), batch_size=4, *, seed=0, **kwargs):
    settings = {"repeat": True, "shuffle": True, "drop_last": False, "resumable": True}
    settings.update(kwargs)
    generator = torch.Generator()
    generator.manual_seed(seed)
    return build_batch_sampler(target, dataset, batch_size, generator=generator, **settings)


def _take(batch_sampler, count):
    return list(itertools.islice(iter(batch_sampler), count))


# --- naive ------------------------------------------------------------------------


def test_naive_cycle_is_a_permutation_cut_into_batches_with_the_partial_batch_kept():
    batches = _take(_build(), 6)
    assert [len(batch) for batch in batches] == [4, 4, 2, 4, 4, 2]
    for cycle in (batches[:3], batches[3:]):
        assert sorted(sum(cycle, [])) == list(range(10))
    assert sum(batches[:3], []) != sum(batches[3:], [])


def test_naive_drop_last_drops_each_cycles_partial_batch():
    batches = _take(_build(drop_last=True), 4)
    assert [len(batch) for batch in batches] == [4, 4, 4, 4]
    assert len(set(sum(batches[:2], []))) == 8


def test_naive_without_shuffle_is_range_order():
    assert _take(_build(shuffle=False), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]


def test_without_repeat_an_iteration_ends_after_one_cycle_and_the_next_starts_the_next_cycle():
    plain = _build(repeat=False, resumable=False)
    endless = _take(_build(resumable=False), 6)
    assert list(plain) == endless[:3]
    assert list(plain) == endless[3:]
    assert len(plain) == 3

    resumable = _build(repeat=False)
    first = list(resumable)
    assert first == endless[:3]
    resumable.advance(len(first))
    assert resumable.state_dict()["cycle"] == 1 and resumable.state_dict()["offset"] == 0
    assert list(resumable) == endless[3:]


def test_an_endless_batch_sampler_has_no_len():
    with pytest.raises(TypeError):
        len(_build())


# --- class_balance ------------------------------------------------------------------

LABELS = [0, 0, 0, 0, 0, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("source", ["option", "labels", "targets", "tensor", "array"])
def test_class_balance_oversamples_every_class_to_the_largest_each_cycle(source):
    if source == "option":
        sampler = _build("class_balance", range(10), labels=LABELS)
    elif source == "tensor":
        sampler = _build("class_balance", Labelled(torch.tensor(LABELS)))
    elif source == "array":
        sampler = _build("class_balance", Labelled(np.array(LABELS), "targets"))
    else:
        sampler = _build("class_balance", Labelled(LABELS, source))
    batches = _take(sampler, 8)  # 15 samples per cycle -> batches 4, 4, 4, 3
    assert [len(batch) for batch in batches] == [4, 4, 4, 3] * 2
    for cycle in (batches[:4], batches[4:]):
        indices = sum(cycle, [])
        assert collections.Counter(LABELS[i] for i in indices) == {0: 5, 1: 5, 2: 5}
        counts = collections.Counter(indices)
        assert set(counts) == set(range(10))
        # Whole shuffled passes: each index of a class is used floor or ceil of 5 / class size times.
        assert all(counts[i] == 1 for i in range(5))
        assert sorted(counts[i] for i in (5, 6)) == [2, 3]
        assert sorted(counts[i] for i in (7, 8, 9)) == [1, 2, 2]


def test_class_balance_batches_are_as_class_uniform_as_possible():
    labels = [0] * 12 + [1] * 3 + [2] * 6
    sampler = _build("class_balance", range(len(labels)), batch_size=6, labels=labels)
    for batch in _take(sampler, 12):
        assert collections.Counter(labels[i] for i in batch) == {0: 2, 1: 2, 2: 2}


def test_class_balance_without_labels_is_an_argument_error():
    with pytest.raises(ValueError, match="labels"):
        _build("class_balance", range(10))
    with pytest.raises(ValueError):
        _build("class_balance", range(10), labels=[0, 1])


# --- balance --------------------------------------------------------------------------

GROUPS = ["a"] * 4 + ["b"] * 6


def test_balance_repeats_each_group_by_its_ratio_with_a_seeded_fractional_subset():
    sampler = _build("balance", range(10), batch_size=5, groups=GROUPS, ratios={"a": 2.5, "b": 0.5})
    batches = _take(
        sampler, 3 * 6
    )  # a: 4 x 2.5 = 10, b: 6 x 0.5 = 3 -> 13 samples, batches 5, 5, 3
    assert [len(batch) for batch in batches[:3]] == [5, 5, 3]
    subsets = []
    for cycle in range(6):
        indices = sum(batches[3 * cycle : 3 * cycle + 3], [])
        counts = collections.Counter(indices)
        assert collections.Counter(GROUPS[i] for i in indices) == {"a": 10, "b": 3}
        assert sorted(counts[i] for i in range(4)) == [2, 2, 3, 3]
        assert all(counts[i] <= 1 for i in range(4, 10))
        subsets.append(frozenset(i for i in range(4) if counts[i] == 3))
    assert len(set(subsets)) > 1, "the fractional subset must be drawn per cycle"
    again = _build("balance", range(10), batch_size=5, groups=GROUPS, ratios={"a": 2.5, "b": 0.5})
    assert _take(again, 3 * 6) == batches


def test_balance_unlisted_groups_keep_ratio_one_and_zero_removes_a_group():
    sampler = _build("balance", range(10), batch_size=10, groups=GROUPS, ratios={"a": 0})
    (batch,) = _take(sampler, 1)
    assert sorted(batch) == list(range(4, 10))


@pytest.mark.parametrize(
    ("ratios", "error"),
    [
        ({"a": -1.0}, ValueError),
        ({"a": float("nan")}, ValueError),
        ({"a": "2"}, TypeError),
        ([("a", 1.0)], TypeError),
    ],
)
def test_balance_refuses_bad_ratios(ratios, error):
    with pytest.raises(error):
        _build("balance", range(10), groups=GROUPS, ratios=ratios)


# --- cursor and state -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "options"),
    [
        ("naive", {}),
        ("class_balance", {"labels": LABELS}),
        ("balance", {"groups": GROUPS, "ratios": {"a": 1.5}}),
    ],
)
def test_a_loaded_state_regenerates_the_same_batches_in_a_fresh_sampler(target, options):
    sampler = _build(target, seed=1, **options)
    stream = _take(sampler, 12)
    for count in range(12):
        resumed = _build(target, seed=2, **options)
        reference = _build(target, seed=1, **options)
        reference.advance(count)
        resumed.load_state_dict(reference.state_dict())
        assert _take(resumed, 12 - count) == stream[count:], f"after {count} batches"


def test_a_partial_last_batch_advances_consumed_by_its_real_size():
    sampler = _build()  # batches of 4, 4, 2 per cycle
    consumed = []
    for _ in range(4):
        sampler.advance_batch()
        consumed.append(sampler.state_dict()["consumed"])
    assert consumed == [4, 8, 10, 14]
    assert sampler.state_dict()["cycle"] == 1 and sampler.state_dict()["offset"] == 1


def test_batch_sampler_state_round_trips_through_weights_only_torch_load_and_json():
    sampler = _build("class_balance", labels=LABELS)
    sampler.advance(5)
    state = sampler.state_dict()
    streams.assert_plain_data(state)


def test_a_state_without_the_optional_readable_settings_still_loads():
    sampler = _build()
    sampler.advance(4)
    state = sampler.state_dict()
    del state["settings"]
    fresh = _build(seed=9)
    fresh.load_state_dict(state)
    assert _take(fresh, 3) == _take(sampler, 3)


def test_batches_handed_out_are_copies():
    sampler = _build()
    first = _take(sampler, 2)
    expected = [list(batch) for batch in first]
    for batch in first:
        batch.clear()
    assert _take(sampler, 2) == expected


def test_only_the_cycle_being_read_is_held_and_no_cycle_is_in_the_state():
    sampler = _build()
    orders = {}
    real = sampler._cycle_order

    def recording(seed, cycle):
        order = real(seed, cycle)
        orders[cycle] = weakref.ref(order)
        return order

    sampler._cycle_order = recording
    iterator = iter(sampler)
    for _ in range(3 * 3 + 1):  # into cycle 3
        next(iterator)
    gc.collect()
    assert sorted(orders) == [0, 1, 2, 3]
    assert [orders[cycle]() is None for cycle in range(4)] == [True, True, True, False]
    assert not any(isinstance(value, torch.Tensor) for value in sampler.state_dict().values())
    del iterator
    gc.collect()
    assert orders[3]() is None


def _corrupt(**changes):
    sampler = _build()
    sampler.advance(4)
    state = sampler.state_dict()
    state.update(changes)
    return state


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(_corrupt(format="trainer_resume.sampler/1"), id="format"),
        pytest.param(_corrupt(settings_digest="0" * 64), id="digest"),
        pytest.param(_corrupt(offset=3, consumed=13), id="offset-out-of-range"),
        pytest.param(_corrupt(consumed=15), id="consumed-vs-cursor"),
        pytest.param(_corrupt(cycle=-1), id="negative-cycle"),
        pytest.param(_corrupt(offset=False), id="bool"),
        pytest.param(_corrupt(settings=[1]), id="settings-not-a-dict"),
        pytest.param({"format": "trainer_resume.batch_sampler/1"}, id="missing-keys"),
    ],
)
def test_malformed_batch_sampler_state_raises_loader_state_error_and_changes_nothing(state):
    sampler = _build()
    sampler.advance(2)
    before = sampler.state_dict()
    with pytest.raises(LoaderStateError):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == before


@pytest.mark.parametrize(
    ("changed", "names"),
    [
        ({"batch_size": 3}, "batch_size"),
        ({"drop_last": True}, "drop_last"),
        ({"dataset": range(11)}, "dataset_size"),
        ({"shuffle": False}, "shuffle"),
    ],
)
def test_a_state_from_other_settings_is_refused_naming_the_setting(changed, names):
    state = _build().state_dict()
    other = _build(**changed)
    with pytest.raises(LoaderStateError, match=names):
        other.load_state_dict(state)
    del state["settings"]
    with pytest.raises(LoaderStateError, match="settings_digest"):
        other.load_state_dict(state)


def test_a_state_from_other_labels_is_refused():
    state = _build("class_balance", labels=LABELS).state_dict()
    other = _build("class_balance", labels=list(reversed(LABELS)))
    with pytest.raises(LoaderStateError, match="settings_digest"):
        other.load_state_dict(state)


@pytest.mark.parametrize("seed", [-5, 1 << 63, 2.0, None])
def test_a_corrupted_batch_sampler_seed_raises_sampler_generator_error(seed):
    sampler = _build()
    with pytest.raises(ResumableSamplerGeneratorError):
        sampler.load_state_dict(_corrupt(seed=seed))
    assert sampler.state_dict()["cycle"] == 0


def test_plain_batch_sampler_has_no_state():
    plain = _build(resumable=False)
    for call in (
        plain.state_dict,
        plain.advance_batch,
        lambda: plain.load_state_dict(_build().state_dict()),
    ):
        with pytest.raises(ResumableModeRequiredError):
            call()


# --- configuration errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "dataset", "batch_size", "options"),
    [
        pytest.param("naive", range(0), 2, {}, id="empty-dataset"),
        pytest.param("class_balance", Labelled([]), 2, {}, id="empty-dataset-class-balance"),
        pytest.param("naive", range(5), 0, {}, id="batch-size-0"),
        pytest.param("naive", range(5), -3, {}, id="batch-size-negative"),
        pytest.param("naive", range(5), 6, {"drop_last": True}, id="drop-last-yields-no-batch"),
        pytest.param(
            "balance",
            range(10),
            2,
            {"groups": GROUPS, "ratios": {"c": 1.0}},
            id="ratio-for-empty-group",
        ),
        pytest.param(
            "balance",
            range(10),
            2,
            {"groups": GROUPS, "ratios": {"a": 0, "b": 0}},
            id="all-ratios-zero",
        ),
        pytest.param(
            "balance",
            range(10),
            4,
            {"groups": GROUPS, "ratios": {"a": 0.5, "b": 0.1}, "drop_last": True},
            id="balanced-cycle-below-one-batch",
        ),
    ],
)
def test_settings_that_cannot_produce_a_batch_are_refused_at_construction(
    target, dataset, batch_size, options
):
    with pytest.raises(ResumableBatchConfigurationError):
        _build(target, dataset, batch_size, **options)


def test_unknown_target_and_unknown_option_are_argument_errors():
    with pytest.raises(ValueError, match="naive"):
        _build("uniform")
    with pytest.raises(TypeError):
        _build("naive", labels=LABELS)
    with pytest.raises(TypeError):
        _build("balance", groups=GROUPS)
    with pytest.raises(TypeError):
        _build(batch_size=2.0)
    with pytest.raises(TypeError):
        _build(repeat=1)
