from __future__ import annotations

import numpy as np
import pytest

from trainer_resume.loaders.reuse import ReusePolicy, ReuseSampler, keyed_permutation
from trainer_resume.rng import derive_seed


def simulate_generations(index: int, lifetime: int, epochs: int) -> list[tuple[int, int, int]]:
    """Brute force, from the rules in words: generation 0 serves ``lifetime - phase``
    epochs, every later generation ``lifetime`` epochs, back to back.

    Returns (generation, first_epoch, use) per epoch, where ``use`` counts the
    generation's window from its (possibly pre-epoch-0) start.
    """
    phase = index % lifetime
    generation, first_epoch, remaining = 0, 0, lifetime - phase
    result = []
    for epoch in range(epochs):
        if remaining == 0:
            generation, first_epoch, remaining = generation + 1, epoch, lifetime
        result.append((generation, first_epoch, lifetime - remaining))
        remaining -= 1
    return result


def rebuilds_per_epoch(size: int, lifetime: int, epochs: int) -> list[int]:
    """Brute force: how many indices start a new generation in each epoch."""
    counts = [0] * epochs
    for index in range(size):
        previous = None
        for epoch, (generation, _, _) in enumerate(simulate_generations(index, lifetime, epochs)):
            if generation != previous:
                counts[epoch] += 1
            previous = generation
    return counts


@pytest.mark.parametrize("lifetime", [1, 2, 3, 4, 5, 7])
def test_key_matches_brute_force_generations(lifetime):
    policy = ReusePolicy(lifetime, seed=99)
    for index in range(40):
        for epoch, (generation, first_epoch, use) in enumerate(
            simulate_generations(index, lifetime, 30)
        ):
            key = policy.key(index, epoch)
            assert (key.index, key.epoch) == (index, epoch)
            assert (key.generation, key.first_epoch, key.use) == (generation, first_epoch, use), (
                index,
                epoch,
            )
            assert key.seed == derive_seed(99, index, generation)


@pytest.mark.parametrize("lifetime", [2, 3])
@pytest.mark.parametrize("size", [24, 25, 1000])
def test_after_epoch_zero_about_one_in_lifetime_samples_expire_per_epoch(size, lifetime):
    policy = ReusePolicy(lifetime, seed=0)
    counts = [0] * 12
    for index in range(size):
        for epoch in range(12):
            if (
                epoch == 0
                or policy.key(index, epoch).generation != policy.key(index, epoch - 1).generation
            ):
                counts[epoch] += 1
    assert counts == rebuilds_per_epoch(size, lifetime, 12)
    assert counts[0] == size
    for count in counts[1:]:
        assert abs(count - size / lifetime) <= 1


def test_every_generation_serves_lifetime_consecutive_epochs_after_the_first():
    lifetime = 4
    policy = ReusePolicy(lifetime, seed=5)
    for index in range(12):
        epochs_of = {}
        for epoch in range(40):
            epochs_of.setdefault(policy.key(index, epoch).generation, []).append(epoch)
        phase = index % lifetime
        assert epochs_of[0] == list(range(lifetime - phase))
        for generation in range(1, 9):
            served = epochs_of[generation]
            assert served == list(range(served[0], served[0] + lifetime))


def test_sample_seed_changes_with_generation_index_and_seed():
    policy = ReusePolicy(2, seed=1)
    assert policy.key(0, 0).seed == policy.key(0, 1).seed  # same generation
    assert policy.key(0, 0).seed != policy.key(0, 2).seed
    assert policy.key(0, 0).seed != policy.key(2, 0).seed
    assert policy.key(0, 0).seed != ReusePolicy(2, seed=2).key(0, 0).seed


def test_key_is_a_frozen_value():
    key = ReusePolicy(3, seed=1).key(4, 7)
    assert key == ReusePolicy(3, seed=1).key(4, 7)
    with pytest.raises(AttributeError):
        key.epoch = 8  # type: ignore[misc]


@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_order_is_a_permutation_of_every_epoch(size):
    policy = ReusePolicy(2, seed=11)
    for epoch in (0, 1, 2, 10**9):
        order = [policy.order(position, epoch, size) for position in range(size)]
        assert sorted(order) == list(range(size))


def test_order_of_a_million_is_a_permutation_and_matches_positionwise_evaluation():
    size = 10**6
    policy = ReusePolicy(1, seed=3)
    permutation = policy.permutation(4, size)
    everything = np.concatenate(list(permutation.iter_chunks()))
    assert np.array_equal(np.sort(everything), np.arange(size))
    rng = np.random.default_rng(0)
    for position in rng.integers(0, size, 300).tolist() + [0, size - 1]:
        assert policy.order(position, 4, size) == everything[position]


def test_order_differs_between_epochs():
    policy = ReusePolicy(1, seed=3)
    orders = [tuple(policy.order(p, epoch, 1000) for p in range(1000)) for epoch in range(5)]
    assert len(set(orders)) == 5
    million = [[policy.order(p, epoch, 10**6) for p in range(50)] for epoch in range(3)]
    assert million[0] != million[1] != million[2] != million[0]


def test_order_differs_between_seeds():
    first = [ReusePolicy(1, seed=1).order(p, 0, 1000) for p in range(1000)]
    second = [ReusePolicy(1, seed=2).order(p, 0, 1000) for p in range(1000)]
    assert first != second


def test_order_cost_does_not_grow_with_position_or_epoch(monkeypatch):
    passes = []
    real_network = keyed_permutation._network

    def counting_network(*args):
        passes.append(1)
        return real_network(*args)

    monkeypatch.setattr(keyed_permutation, "_network", counting_network)
    policy = ReusePolicy(1, seed=8)
    size = 1000
    for epoch in (0, 10**15):
        passes.clear()
        for position in range(size):
            policy.order(position, epoch, size)
        # Cycle walks from all positions visit each value of the 1024-value domain
        # at most once, whatever the epoch: at most 1024 network passes in total.
        assert size <= len(passes) <= 1024
    passes.clear()
    policy.order(10**6 - 1, 10**15, 10**6)
    assert 1 <= len(passes) <= 64


def test_sampler_yields_each_epochs_order():
    policy = ReusePolicy(2, seed=4)
    sampler = ReuseSampler(100, policy)
    assert len(sampler) == 100
    for epoch in (0, 1, 7):
        sampler.set_epoch(epoch)
        assert list(sampler) == [policy.order(p, epoch, 100) for p in range(100)]


def test_sampler_epoch_is_fixed_when_iteration_starts():
    policy = ReusePolicy(2, seed=4)
    sampler = ReuseSampler(10, policy, epoch=0)
    iterator = iter(sampler)
    sampler.set_epoch(1)
    assert list(iterator) == [policy.order(p, 0, 10) for p in range(10)]


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ((0, 1), ValueError, "lifetime must be at least 1, got 0"),
        ((-3, 1), ValueError, "got -3"),
        ((True, 1), TypeError, "True"),
        ((2, "7"), TypeError, "'7'"),
    ],
)
def test_bad_policy_arguments_are_refused_naming_the_value(arguments, error, named):
    with pytest.raises(error, match=named):
        ReusePolicy(*arguments)


def test_bad_key_and_order_arguments_are_refused():
    policy = ReusePolicy(2, seed=0)
    with pytest.raises(ValueError, match="-1"):
        policy.key(0, -1)
    with pytest.raises(ValueError, match="-2"):
        policy.key(-2, 0)
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        policy.order(0, 0, 0)
    for position in (-1, 5):
        with pytest.raises(IndexError, match=str(position)):
            policy.order(position, 0, 5)
