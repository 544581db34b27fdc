"""Main-process RNG capture/restore, rng_scope and derive_seed."""

from __future__ import annotations

import copy
import io
import random
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.rng import (
    derive_seed,
    derive_seed_run,
    derive_seeds,
    random_state,
    restore_random_state,
    rng_scope,
    seed_deriver,
    validate_random_state,
)


def _draws() -> tuple[list[float], list[float], torch.Tensor]:
    # gauss/standard_normal exercise the cached second normal of Python and NumPy.
    python = [random.random(), random.gauss(0.0, 1.0), random.random()]
    numpy = [
        float(np.random.standard_normal()),
        float(np.random.rand()),
        float(np.random.standard_normal()),
    ]
    return python, numpy, torch.rand(5)


def _assert_same_draws(first, second) -> None:
    assert first[0] == second[0]
    assert first[1] == second[1]
    assert torch.equal(first[2], second[2])


def _global_states() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _assert_globals_equal(before: tuple, after: tuple) -> None:
    assert before[0] == after[0]
    numpy_before, numpy_after = before[1], after[1]
    assert numpy_before[0] == numpy_after[0]
    assert np.array_equal(numpy_before[1], numpy_after[1])
    assert numpy_before[2:] == numpy_after[2:]
    assert torch.equal(before[2], after[2])


def _contains_only_safe_types(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _contains_only_safe_types(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_contains_only_safe_types(v) for v in value)
    return value is None or isinstance(value, (torch.Tensor, int, float, str))


# --- capture and restore ----------------------------------------------------------


def test_restore_reproduces_the_next_draws_of_python_numpy_and_torch():
    random.gauss(0.0, 1.0)  # leave a cached normal in both generators
    np.random.standard_normal()
    state = random_state()
    expected = _draws()
    _draws()
    restore_random_state(state)
    _assert_same_draws(_draws(), expected)


def test_state_round_trips_torch_save_and_weights_only_load():
    state = random_state()
    expected = _draws()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_random_state(loaded)
    _assert_same_draws(_draws(), expected)


def test_state_holds_no_ndarray_or_other_unsafe_value():
    state = random_state()
    assert _contains_only_safe_types(state)
    assert state["cuda"] is None and state["cuda_device"] is None


def test_cpu_device_captures_no_cuda_state():
    assert random_state(device="cpu")["cuda"] is None


def _set(path: str, value) -> Callable[[dict], None]:
    def mutate(state: dict) -> None:
        *parents, last = path.split(".")
        target = state
        for part in parents:
            target = target[part]
        target[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict], None]:
    def mutate(state: dict) -> None:
        *parents, last = path.split(".")
        target = state
        for part in parents:
            target = target[part]
        del target[last]

    return mutate


def _set_python_position(value: int) -> Callable[[dict], None]:
    def mutate(state: dict) -> None:
        state["python"]["internal"][-1] = value

    return mutate


def _invalid_torch_engine(state: dict) -> None:
    # Right dtype and size, but the Mersenne Twister bookkeeping is invalid: only the
    # torch generator itself can tell, after Python and NumPy would have been restored.
    state["torch"] = torch.zeros_like(state["torch"])


MALFORMED = {
    "format": _set("format", "trainer_resume.rng/0"),
    "format missing": _delete("format"),
    "python missing": _delete("python"),
    "python not a dict": _set("python", [3]),
    "python.version 2": _set("python.version", 2),
    "python.version bool": _set("python.version", True),
    "python.version missing": _delete("python.version"),
    "python.internal int32": _set("python.internal", torch.zeros(625, dtype=torch.int32)),
    "python.internal short": _set("python.internal", torch.zeros(624, dtype=torch.int64)),
    "python.internal list": _set("python.internal", [0] * 625),
    "python.internal word too large": _set(
        "python.internal", torch.full((625,), 1 << 32, dtype=torch.int64)
    ),
    "python.internal negative": _set("python.internal", torch.full((625,), -1, dtype=torch.int64)),
    "python position 625": _set_python_position(625),
    "python.gauss_next str": _set("python.gauss_next", "0.5"),
    "numpy missing": _delete("numpy"),
    "numpy.kind": _set("numpy.kind", "PCG64"),
    "numpy.keys float": _set("numpy.keys", torch.zeros(624, dtype=torch.float64)),
    "numpy.keys short": _set("numpy.keys", torch.zeros(623, dtype=torch.int64)),
    "numpy.keys ndarray": _set("numpy.keys", np.zeros(624, dtype=np.int64)),
    "numpy.keys too large": _set("numpy.keys", torch.full((624,), 1 << 32, dtype=torch.int64)),
    "numpy.pos 625": _set("numpy.pos", 625),
    "numpy.pos negative": _set("numpy.pos", -1),
    "numpy.pos str": _set("numpy.pos", "3"),
    "numpy.has_gauss 2": _set("numpy.has_gauss", 2),
    "numpy.has_gauss missing": _delete("numpy.has_gauss"),
    "numpy.has_gauss tensor": _set("numpy.has_gauss", torch.tensor([0, 1])),
    "python.version tensor": _set("python.version", torch.tensor([3, 3])),
    "numpy.cached_gaussian str": _set("numpy.cached_gaussian", "0.0"),
    "torch missing": _delete("torch"),
    "torch int64": _set("torch", torch.zeros(5056, dtype=torch.int64)),
    "torch short": _set("torch", torch.zeros(100, dtype=torch.uint8)),
    "torch invalid engine": _invalid_torch_engine,
    "cuda without device": _set("cuda", torch.zeros(16, dtype=torch.uint8)),
    "cuda_device negative": _set("cuda_device", -1),
    "cuda_device str": _set("cuda_device", "0"),
    "cuda float": _set("cuda", torch.zeros(16)),
    "cuda float with device": lambda state: state.update(cuda=torch.zeros(16), cuda_device=0),
}


@pytest.mark.parametrize("mutate", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_state_raises_before_any_generator_changes(mutate):
    state = copy.deepcopy(random_state())
    mutate(state)
    _draws()  # the generators now differ from the saved state, so a partial restore would show
    before = _global_states()
    with pytest.raises(ValueError, match="invalid random state"):
        restore_random_state(state)
    _assert_globals_equal(before, _global_states())


def test_non_dict_state_raises_value_error():
    with pytest.raises(ValueError, match="invalid random state"):
        restore_random_state([1, 2, 3])  # type: ignore[arg-type]


def test_cuda_state_for_a_missing_device_raises_before_any_generator_changes():
    state = random_state()
    state["cuda"] = torch.zeros(16, dtype=torch.uint8)
    state["cuda_device"] = 10_000
    _draws()
    before = _global_states()
    with pytest.raises(RuntimeError, match="CUDA"):
        restore_random_state(state)
    _assert_globals_equal(before, _global_states())


def test_cuda_state_restored_to_a_cpu_device_is_refused():
    state = random_state()
    state["cuda"] = torch.zeros(16, dtype=torch.uint8)
    state["cuda_device"] = 0
    _draws()
    before = _global_states()
    with pytest.raises(ValueError, match="not a CUDA device"):
        restore_random_state(state, device="cpu")
    _assert_globals_equal(before, _global_states())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generator_is_captured_and_restored():
    state = random_state(device="cuda:0")
    assert state["cuda_device"] == 0
    expected = torch.rand(4, device="cuda:0")
    torch.rand(4, device="cuda:0")
    restore_random_state(state)
    assert torch.equal(torch.rand(4, device="cuda:0"), expected)


# --- rng_scope --------------------------------------------------------------------


def test_rng_scope_restores_the_callers_generators_on_exit():
    state = random_state()
    expected = _draws()
    restore_random_state(state)
    with rng_scope(123):
        _draws()
    _assert_same_draws(_draws(), expected)


def test_rng_scope_restores_the_callers_generators_on_exception():
    state = random_state()
    expected = _draws()
    restore_random_state(state)
    with pytest.raises(KeyError):
        with rng_scope(123):
            _draws()
            raise KeyError("augmentation failed")
    _assert_same_draws(_draws(), expected)


def test_rng_scope_gives_the_same_draws_for_the_same_seed():
    with rng_scope(2024):
        first = _draws()
    _draws()
    with rng_scope(2024):
        second = _draws()
    with rng_scope(2025):
        other = _draws()
    _assert_same_draws(first, second)
    assert first[0] != other[0] and first[1] != other[1] and not torch.equal(first[2], other[2])


def test_rng_scope_seeds_like_the_documented_per_library_seeding():
    seed = (1 << 40) + 17
    with rng_scope(seed):
        scoped = _draws()
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    _assert_same_draws(scoped, _draws())


@pytest.mark.parametrize("seed", [-5, 0, (1 << 64) - 1, (1 << 64) + 3])
def test_rng_scope_accepts_any_int_seed(seed):
    with rng_scope(seed):
        first = _draws()
    with rng_scope(seed):
        second = _draws()
    _assert_same_draws(first, second)


@pytest.mark.parametrize("seed", [1.0, "1", True, None, np.int64(1)])
def test_rng_scope_refuses_a_non_int_seed_without_changing_anything(seed):
    before = _global_states()
    with pytest.raises(TypeError):
        with rng_scope(seed):  # type: ignore[arg-type]
            pass
    _assert_globals_equal(before, _global_states())


def test_rng_scope_does_not_touch_cuda(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("rng_scope touched a CUDA generator")

    for name in (
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "set_rng_state",
        "set_rng_state_all",
    ):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    # The patch is live: a plain torch.manual_seed reseeds CUDA and trips it.
    with pytest.raises(AssertionError, match="touched a CUDA generator"):
        torch.manual_seed(0)
    with rng_scope(7):
        torch.rand(3)
    with pytest.raises(ValueError):
        with rng_scope(8):
            raise ValueError


# --- derive_seed ------------------------------------------------------------------

_M64 = 1 << 64


def _reference_splitmix64(z: int) -> int:
    # SplitMix64 as published by Vigna (increment, then the finaliser).
    z = (z + 0x9E3779B97F4A7C15) % _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _M64
    return z ^ (z >> 31)


def _reference_derive_seed(*values: int) -> int:
    state = int.from_bytes(b"TRRESUME", "big")
    for value in values:
        state = _reference_splitmix64(state ^ (value % _M64))
    return _reference_splitmix64(state ^ len(values)) % (1 << 63)


def test_reference_splitmix64_matches_the_published_first_output():
    assert _reference_splitmix64(0) == 0xE220A8397B1DCDAF


# Frozen: changing any of these changes every augmentation of every resumed run.
FROZEN_SEEDS = {
    (): 4353401350298291639,
    (0,): 474663856627665615,
    (1,): 6834382092740807184,
    (0, 0): 2455078869921090188,
    (1, 2): 1339607527560877806,
    (2, 1): 7619557723572613939,
    (42, 7): 3951344599706691176,
    (-1,): 3159920082543636646,
    (123456789, 1 << 40, 3): 2208977312994007864,
}


@pytest.mark.parametrize("values", list(FROZEN_SEEDS), ids=str)
def test_derive_seed_matches_frozen_vectors(values):
    assert derive_seed(*values) == FROZEN_SEEDS[values]
    assert _reference_derive_seed(*values) == FROZEN_SEEDS[values]


def test_derive_seed_matches_the_documented_algorithm():
    generator = random.Random(5)
    for count in range(5):
        for _ in range(40):
            values = tuple(generator.randrange(-(1 << 70), 1 << 70) for _ in range(count))
            assert derive_seed(*values) == _reference_derive_seed(*values)


def test_seed_deriver_gives_what_derive_seed_gives_for_its_base_and_salt():
    generator = random.Random(11)
    for _ in range(20):
        first, last = (generator.randrange(-(1 << 70), 1 << 70) for _ in range(2))
        derive = seed_deriver(first, last)
        for _ in range(20):
            value = generator.randrange(-(1 << 70), 1 << 70)
            assert derive(value) == _reference_derive_seed(first, value, last)


def test_seed_deriver_refuses_a_base_or_salt_that_is_not_an_int():
    with pytest.raises(TypeError, match="ints"):
        seed_deriver(1.5, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ints"):
        seed_deriver(1, True)


def test_derive_seed_is_order_and_count_sensitive():
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(0) != derive_seed(0, 0)
    assert derive_seed(5, 0) != derive_seed(5)


def test_derive_seed_wraps_negative_values_modulo_2_64():
    assert derive_seed(-1) == derive_seed(_M64 - 1)
    assert derive_seed(3, -2) == derive_seed(3, _M64 - 2)


def test_derive_seed_stays_in_63_bits():
    seeds = [derive_seed(base, position) for base in range(8) for position in range(256)]
    assert all(0 <= seed < (1 << 63) for seed in seeds)
    assert max(seeds) >= 1 << 62  # the top kept bit is used, not masked away
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("bad", [True, False, 1.0, "1", None, np.int64(1), torch.tensor(1)])
def test_derive_seed_refuses_non_int_values(bad):
    with pytest.raises(TypeError):
        derive_seed(1, bad)


@pytest.mark.parametrize("base", [0, 1, 123456789123, (1 << 62) + 5, (1 << 63) - 1])
@pytest.mark.parametrize("first", [0, 7, 10**12, (1 << 63) - 40])
def test_derive_seeds_equals_derive_seed_of_each_position(base, first):
    assert derive_seeds(base, first, 33) == [
        derive_seed(base, position) for position in range(first, first + 33)
    ]


@pytest.mark.parametrize("stride", [2, 3, 7])
def test_derive_seeds_with_a_stride_equals_derive_seed_of_every_strided_position(stride):
    first = (1 << 63) - 5
    expected = [derive_seed(11, first + offset * stride) for offset in range(9)]
    assert derive_seeds(11, first, 9, stride=stride) == expected


@pytest.mark.parametrize("first", [0, 123456789123, (1 << 63) - 1, -5])
@pytest.mark.parametrize("start, step", [(0, 1), (96, 32), ((1 << 64) - 64, 32), (-3, 7)])
def test_derive_seed_run_equals_derive_seed_of_every_position_of_the_run(first, start, step):
    last = 0x636F_6C6C_6174_65
    expected = [derive_seed(first, start + offset * step, last) for offset in range(40)]
    assert derive_seed_run(first, start, step, 40, last) == expected


def test_derive_seed_run_refuses_a_base_or_salt_that_is_not_an_int():
    with pytest.raises(TypeError):
        derive_seed_run(1.5, 0, 1, 4, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        derive_seed_run(1, 0, 1, 4, True)


def test_validate_random_state_accepts_a_captured_state_and_changes_nothing():
    state = random_state()
    before = _global_states()
    validate_random_state(state)
    _assert_globals_equal(before, _global_states())


def test_validate_random_state_refuses_what_restore_refuses():
    state = random_state()
    state["numpy"]["pos"] = 625
    with pytest.raises(ValueError):
        validate_random_state(state)


def test_rng_scope_draws_numpys_mt19937_stream_and_gives_a_replaced_bit_generator_back():
    kept = np.random.get_bit_generator()
    kept_state = kept.state
    try:
        with rng_scope(5):
            expected = np.random.rand(3)
        caller = np.random.PCG64(3)
        np.random.set_bit_generator(caller)
        before = caller.state
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no NumPy warning about the legacy form
            with rng_scope(5):
                drawn = np.random.rand(3)
        assert np.array_equal(drawn, expected)
        assert np.random.get_bit_generator() is caller and caller.state == before
    finally:
        kept.state = kept_state
        np.random.set_bit_generator(kept)


def test_capturing_while_numpys_global_generator_is_not_an_mt19937_is_refused_naming_the_fix():
    kept = np.random.get_bit_generator()
    try:
        np.random.set_bit_generator(np.random.PCG64(3))
        with pytest.raises(UnsupportedResumeConfigurationError, match="is a PCG64") as caught:
            random_state()
        assert "np.random.set_bit_generator(np.random.MT19937(seed))" in str(caught.value)
    finally:
        np.random.set_bit_generator(kept)
    assert random_state()["numpy"]["kind"] == "MT19937"
