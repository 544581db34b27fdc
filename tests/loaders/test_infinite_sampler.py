"""InfiniteRandomSampler: cycles, closed-form cursor, state and its validation."""

from __future__ import annotations

import itertools

import pytest
import torch
from support import loader_streams as streams

from trainer_resume.errors import (
    LoaderStateError,
    ResumableBatchConfigurationError,
    ResumableModeRequiredError,
    ResumableSamplerGeneratorError,
)
from trainer_resume.loaders import InfiniteRandomSampler
from trainer_resume.loaders import sampler as sampler_module

SIZE = 7


def _seeded(resumable: bool = True, seed: int = 0, size: int = SIZE) -> InfiniteRandomSampler:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return InfiniteRandomSampler(range(size), generator=generator, resumable=resumable)


def _take(sampler: InfiniteRandomSampler, count: int) -> list[int]:
    return list(itertools.islice(iter(sampler), count))


def test_every_cycle_is_a_permutation_and_cycles_differ():
    stream = _take(_seeded(), 4 * SIZE)
    cycles = [stream[i * SIZE : (i + 1) * SIZE] for i in range(4)]
    for cycle in cycles:
        assert sorted(cycle) == list(range(SIZE))
    assert len({tuple(cycle) for cycle in cycles}) == 4


def test_the_seed_is_drawn_once_from_the_generator_and_fixes_the_stream():
    assert _take(_seeded(seed=3), 30) == _take(_seeded(seed=3), 30)
    assert _take(_seeded(seed=3), 30) != _take(_seeded(seed=4), 30)
    torch.manual_seed(11)
    first = _take(InfiniteRandomSampler(range(SIZE)), 30)
    torch.manual_seed(11)
    assert _take(InfiniteRandomSampler(range(SIZE)), 30) == first


def test_plain_sampler_restarts_every_iteration_and_has_no_cursor():
    sampler = _seeded(resumable=False)
    assert _take(sampler, 20) == _take(sampler, 20)
    with pytest.raises(ResumableModeRequiredError):
        sampler.state_dict()
    with pytest.raises(ResumableModeRequiredError):
        sampler.advance(1)
    with pytest.raises(ResumableModeRequiredError):
        sampler.load_state_dict(_seeded().state_dict())


def test_resumable_iteration_starts_at_the_delivered_cursor_which_only_advance_moves():
    sampler = _seeded()
    stream = _take(sampler, 40)
    assert _take(sampler, 5) == stream[:5]  # iterating delivers nothing
    sampler.advance(9)
    assert _take(sampler, 20) == stream[9:29]
    sampler.advance(3)
    assert sampler.consumed == 12
    assert _take(sampler, 10) == stream[12:22]


def test_a_loaded_state_continues_the_stream_in_a_fresh_sampler():
    sampler = _seeded(seed=5)
    stream = _take(sampler, 50)
    sampler.advance(17)
    fresh = _seeded(seed=99)
    fresh.load_state_dict(sampler.state_dict())
    assert fresh.seed == sampler.seed
    assert _take(fresh, 33) == stream[17:]


def test_state_fields_follow_the_cursor():
    sampler = _seeded()
    sampler.advance(2 * SIZE + 3)
    state = sampler.state_dict()
    assert state["format"] == "trainer_resume.sampler/1"
    assert (state["dataset_size"], state["consumed"], state["cycle"], state["offset"]) == (
        SIZE,
        17,
        2,
        3,
    )


def test_reaching_a_far_position_costs_one_permutation_per_cycle_read(monkeypatch):
    calls = []
    real = sampler_module.permutation

    def counting(size, seed, cycle):
        calls.append(cycle)
        return real(size, seed, cycle)

    monkeypatch.setattr(sampler_module, "permutation", counting)
    sampler = _seeded()
    far_cycle = 10**15
    state = sampler.state_dict()
    state.update(consumed=far_cycle * SIZE + 5, cycle=far_cycle, offset=5)
    sampler.load_state_dict(state)
    indices = _take(sampler, SIZE)  # 2 from cycle far_cycle, 5 from the next
    assert calls == [far_cycle, far_cycle + 1]
    assert indices[:2] == real(SIZE, sampler.seed, far_cycle)[5:].tolist()
    assert indices[2:] == real(SIZE, sampler.seed, far_cycle + 1)[:5].tolist()


def test_state_round_trips_through_weights_only_torch_load_and_json():
    sampler = _seeded()
    sampler.advance(123)
    state = sampler.state_dict()
    streams.assert_plain_data(state)


def test_empty_dataset_is_refused():
    with pytest.raises(ResumableBatchConfigurationError):
        InfiniteRandomSampler([], resumable=True)


def test_advance_refuses_negative_and_non_int_counts():
    sampler = _seeded()
    with pytest.raises(ValueError):
        sampler.advance(-1)
    with pytest.raises(TypeError):
        sampler.advance(1.0)
    with pytest.raises(TypeError):
        sampler.advance(True)
    assert sampler.consumed == 0


def _corrupt(**changes):
    state = _seeded().state_dict()
    state.update(changes)
    return {key: value for key, value in state.items() if value is not _DROP}


_DROP = object()


@pytest.mark.parametrize(
    "state",
    [
        pytest.param("not a dict", id="not-a-dict"),
        pytest.param(_corrupt(format="trainer_resume.sampler/0"), id="format"),
        pytest.param(_corrupt(dataset_size=SIZE + 1), id="dataset-size"),
        pytest.param(_corrupt(consumed=5, cycle=0, offset=4), id="consumed-vs-cursor"),
        pytest.param(
            _corrupt(consumed=SIZE + 1, cycle=0, offset=SIZE + 1), id="offset-not-below-size"
        ),
        pytest.param(_corrupt(consumed=-1), id="negative"),
        pytest.param(_corrupt(consumed=True, offset=1), id="bool"),
        pytest.param(_corrupt(consumed=1.0, offset=1), id="float"),
        pytest.param(_corrupt(cycle="0"), id="str"),
        pytest.param(_corrupt(offset=_DROP), id="missing-key"),
        pytest.param(_corrupt(extra=1), id="unexpected-key"),
    ],
)
def test_malformed_state_raises_loader_state_error_and_changes_nothing(state):
    sampler = _seeded()
    sampler.advance(4)
    before = sampler.state_dict()
    with pytest.raises(LoaderStateError):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == before


@pytest.mark.parametrize("seed", [-1, 1 << 63, 1.5, "7", None, True])
def test_corrupted_seed_raises_sampler_generator_error_and_changes_nothing(seed):
    sampler = _seeded()
    before = sampler.state_dict()
    with pytest.raises(ResumableSamplerGeneratorError):
        sampler.load_state_dict(_corrupt(seed=seed))
    assert sampler.state_dict() == before
