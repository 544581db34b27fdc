"""The global generators taken whole and put back as raw bytes: the same states, Gaussian
caches and seeds as through the public accessors, on the real Python, NumPy and torch."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from trainer_resume.loaders import _global_generators as generators
from trainer_resume.loaders import _torch_generator_memory as memory
from trainer_resume.loaders._seeding import CallerGenerators, OwnGenerators
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import first_difference


def _public() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _same(a: tuple, b: tuple) -> bool:
    python_a, numpy_a, torch_a = a
    python_b, numpy_b, torch_b = b
    return (
        python_a == python_b
        and numpy_a[0] == numpy_b[0]
        and np.array_equal(numpy_a[1], numpy_b[1])
        and numpy_a[2:] == numpy_b[2:]
        and torch.equal(torch_a, torch_b)
    )


def _with_cached_gaussians(seed: int) -> None:
    """Generators that each hold a cached second Gaussian, as the public states show."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    random.gauss(0.0, 1.0)
    np.random.randn()
    torch.randn(1, dtype=torch.float64)  # a pair drawn, one kept
    assert random.getstate()[2] is not None and np.random.get_state()[3] == 1


def test_this_interpreter_has_the_raw_layout_so_the_fast_path_is_what_the_tests_exercise():
    place = generators.layout()
    assert place.python is not None and place.gauss is not None
    assert place.numpy_key() is not None and place.scratch_key is not None
    assert place.torch_words is not None
    assert place.torch_state is not None and place.torch_default is not None


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31, 2**32 - 1])
def test_the_words_read_inside_a_torch_generator_are_numpys_legacy_seeding(seed):
    scratch = torch.Generator()
    words = memory.words_view(scratch)
    assert words is not None
    scratch.manual_seed(seed)
    assert np.array_equal(
        np.frombuffer(bytes(words), dtype=np.uint32), np.random.RandomState(seed).get_state()[1]
    )


def test_no_words_are_read_from_a_generator_that_is_not_a_torch_cpu_generator():
    class Subclassed(torch.Generator):
        pass

    assert memory.words_view(Subclassed()) is None
    assert memory.words_view(np.random.MT19937(0)) is None  # type: ignore[arg-type]


def test_a_snapshot_put_back_restores_every_generator_with_its_cached_gaussians():
    _with_cached_gaussians(5)
    before = _public()
    snapshot = generators.capture()
    random.random()
    np.random.randn(3)
    torch.rand(4)
    generators.install(snapshot)
    assert _same(_public(), before)
    draws = (random.gauss(0.0, 1.0), float(np.random.randn()), float(torch.randn(())))
    _with_cached_gaussians(5)
    assert draws == (random.gauss(0.0, 1.0), float(np.random.randn()), float(torch.randn(())))


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 0x1234_5678_9ABC_DEF0, 2**63 - 1])
def test_seeding_gives_the_documented_states(seed):
    generators.seed_global(seed)
    low, high = seed & 0xFFFFFFFF, seed >> 32
    # Python: the Mersenne Twister state of init_genrand(low 32 bits), as NumPy seeds it.
    key = np.random.RandomState(low).get_state()[1]
    assert random.getstate() == (3, (*key.tolist(), 624), None)
    reference = np.random.RandomState(high).get_state()
    state = np.random.get_state()
    assert np.array_equal(state[1], reference[1]) and state[2:] == reference[2:]
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(seed).get_state())


@pytest.mark.parametrize("seed", [0, 2**32 - 1, 0x1234_5678_9ABC_DEF0, 2**64 - 1])
@pytest.mark.parametrize(
    "without",
    [("torch_default",), ("torch_words", "torch_state", "torch_default")],
    ids=["torch-manual-seed", "numpy-seeding"],
)
def test_every_way_of_seeding_gives_the_states_of_the_copied_torch_state(
    monkeypatch, seed, without
):
    place = generators.layout()
    assert place.torch_default is not None
    monkeypatch.setattr(generators, "_SEEDERS", [])  # the seeder is made again from the layout
    _with_cached_gaussians(2)
    generators.seed_global(seed)
    copied = _public()
    _with_cached_gaussians(1)
    generators._SEEDERS.clear()
    for name in without:
        monkeypatch.setattr(place, name, None)
    generators.seed_global(seed)
    assert _same(_public(), copied)


def test_seeding_drops_the_cached_gaussians():
    _with_cached_gaussians(9)
    generators.seed_global(77)
    assert random.getstate()[2] is None and np.random.get_state()[3:] == (0, 0.0)
    # torch's cached normal sample too: the state manual_seed leaves, and its draws.
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(77).get_state())
    assert torch.equal(torch.randn(5), torch.randn(5, generator=torch.Generator().manual_seed(77)))


def test_the_public_fallback_gives_the_same_states(monkeypatch):
    generators.seed_global(123456789)
    fast = _public()
    monkeypatch.setattr(generators, "_SEEDERS", [])  # the seeder is made again from the layout
    place = generators.layout()
    monkeypatch.setattr(place, "python", None)
    monkeypatch.setattr(place, "scratch_key", None)
    monkeypatch.setattr(place, "numpy", None)
    monkeypatch.setattr(place, "numpy_bit_generator", place.numpy_state._bit_generator)
    assert place.numpy_key() is None
    generators.seed_global(123456789)
    assert _same(_public(), fast)
    _with_cached_gaussians(3)
    before = _public()
    snapshot = generators.capture()
    assert type(snapshot.python) is tuple and type(snapshot.numpy) is tuple
    random.random()
    np.random.rand()
    generators.install(snapshot)
    assert _same(_public(), before)


def test_a_snapshot_converts_to_the_saved_random_state_and_back_through_pickle():
    _with_cached_gaussians(11)
    expected = random_state()
    snapshot = pickle.loads(pickle.dumps(generators.capture()))
    assert type(snapshot.torch) is bytearray  # get_state()'s bytes, kept until used
    state = generators.state_of(snapshot)
    assert first_difference(state, expected) is None
    random.seed(0)
    np.random.seed(0)
    generators.install(generators.snapshot_of(state))
    restored = random_state()
    restore_random_state(expected)
    assert first_difference(restored, random_state()) is None


@pytest.mark.parametrize("torch_in_place", [True, False], ids=["in-place", "get-set-state"])
def test_the_callers_generators_come_back_with_their_cached_gaussians_after_a_seeded_fetch(
    monkeypatch, torch_in_place
):
    if not torch_in_place:
        monkeypatch.setattr(generators.layout(), "torch_default", None)
    _with_cached_gaussians(21)
    before = _public()

    def fetch() -> float:
        return random.gauss(0.0, 1.0) + float(np.random.randn(3).sum()) + float(torch.randn(()))

    first = CallerGenerators().run(lambda: generators.seed_global(99), fetch)
    assert _same(_public(), before)
    assert CallerGenerators().run(lambda: generators.seed_global(99), fetch) == first


def test_own_generators_carry_on_from_read_to_read_and_leave_the_callers_alone():
    own = OwnGenerators()
    _with_cached_gaussians(4)
    before = _public()
    first = own.run(lambda: (generators.seed_global(7), random.random())[1])
    second = own.run(lambda: (random.random(), float(np.random.randn()), float(torch.rand(()))))
    assert _same(_public(), before)
    generators.seed_global(7)
    assert [first, *second] == [
        random.random(),
        random.random(),
        float(np.random.randn()),
        float(torch.rand(())),
    ]


def test_after_numpys_bit_generator_was_replaced_seeding_draws_from_its_own_and_leaves_the_new_one_unwritten():
    place = generators.layout()
    old = np.random.mtrand._rand._bit_generator
    caller = CallerGenerators()  # bound to the views before the replacement
    try:
        new = np.random.MT19937(5)
        np.random.set_bit_generator(new)
        np.random.randn()  # a cached Gaussian in the new generator's state
        before, new_state = _public(), new.state["state"]
        caller.run(lambda: generators.seed_global(2**40 + 3), lambda: np.random.rand(3))
        assert _same(_public(), before)  # the caller's generator, and its state, come back
        assert np.random.mtrand._rand._bit_generator is new
        generators.seed_global(2**40 + 3)
        reference = np.random.RandomState(2**8).get_state()
        assert np.array_equal(np.random.get_state()[1], reference[1])
        assert np.random.mtrand._rand._bit_generator is place.seeding
        untouched = new.state["state"]
        assert np.array_equal(untouched["key"], new_state["key"])
        assert untouched["pos"] == new_state["pos"]
    finally:
        np.random.set_bit_generator(old)


def test_snapshots_are_the_same_only_when_every_generator_state_is_bit_identical() -> None:
    state = torch.get_rng_state()
    python, numpy, gauss = bytes(range(8)), bytes(range(16)), bytes(16)
    first = generators.Snapshot(python, 0.0, numpy, gauss, state)
    assert generators.same(
        first, generators.Snapshot(python, 0.0, numpy, gauss, bytearray(state.numpy()))
    )
    assert not generators.same(
        first, generators.Snapshot(python, -0.0, numpy, gauss, state)
    )  # 0.0 == -0.0
    changed = state.clone()
    changed[-1] ^= 1
    assert not generators.same(first, generators.Snapshot(python, 0.0, numpy, gauss, changed))
    assert not generators.same(first, generators.Snapshot(python, 0.0, bytes(16), gauss, state))


def test_a_copys_torch_state_kept_in_place_is_saved_and_pickled_as_get_states_tensor():
    own = OwnGenerators()
    _with_cached_gaussians(8)
    caller = torch.get_rng_state()
    own.run(lambda: (generators.seed_global(31), torch.randn(1, dtype=torch.float64)))
    kept = own.after()
    assert type(kept.torch) is bytes  # the generator's memory, copied in place
    assert torch.equal(torch.get_rng_state(), caller)
    generators.seed_global(31)
    torch.randn(1, dtype=torch.float64)  # leaves a cached normal sample in both
    expected = torch.get_rng_state()
    assert torch.equal(generators.state_of(kept)["torch"], expected)
    assert torch.equal(generators._tensor(pickle.loads(pickle.dumps(kept)).torch), expected)
    torch.manual_seed(0)
    generators.install(kept)
    assert torch.equal(torch.get_rng_state(), expected)


@pytest.mark.parametrize(
    "draw",
    [
        lambda: random.random(),
        lambda: random.gauss(0.0, 1.0),  # the second of a pair: only the cached value goes
        lambda: np.random.rand(),
        lambda: np.random.randn(),  # likewise NumPy's cached Gaussian
        lambda: torch.rand(1),
        lambda: torch.randn(1, dtype=torch.float64),  # likewise torch's cached normal sample
        lambda: torch.manual_seed(torch.initial_seed() + 1),  # a reseed, nothing drawn
    ],
    ids=["random", "gauss", "numpy", "numpy-gauss", "torch", "torch-normal", "torch-reseed"],
)
def test_a_worker_sends_its_generators_again_after_any_change_even_of_a_cached_gaussian_alone(
    draw,
):
    from trainer_resume.loaders._iterable import UNCHANGED, _WorkerGenerators

    _with_cached_gaussians(5)
    assert generators.fingerprint() is not None  # the in-place check is what runs here
    streams = _WorkerGenerators()
    assert streams.after() is not UNCHANGED
    assert streams.after() is UNCHANGED
    for _ in range(2):  # the pair's first draw, then its second (a cached value consumed)
        before = _public()
        draw()
        assert not _same(before, _public())
        sent = streams.after()
        assert sent is not UNCHANGED
        assert generators.same(sent, generators.capture())
        assert streams.after() is UNCHANGED
