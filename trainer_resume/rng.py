"""Capture and restore of the main-process random generators.

``random_state`` returns plain data only (tensors, ints, floats, None), so it is
readable by ``torch.load(weights_only=True)``. ``restore_random_state`` validates
the whole state, including a trial load into scratch generators, before touching
any global generator: a rejected state changes nothing.

While a thread is inside ``rng_scope`` the global generators hold the scope's
seeded state; capturing or restoring them from another thread waits until the
scope ends, so no capture is ever caught in the middle of one (a loader fetching
a batch in the main process, for example).
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch

from .errors import UnsupportedResumeConfigurationError
from .state import RandomState, is_int

__all__ = [
    "random_state",
    "restore_random_state",
    "rng_scope",
    "hold_generators",
    "derive_seed",
    "derive_seeds",
    "seed_cpu_generators",
    "validate_random_state",
    "numpy_global_state",
    "RNG_FORMAT",
]

_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DERIVE_INIT = 0x5452_5245_5355_4D45  # "TRRESUME" in ASCII

RNG_FORMAT = "trainer_resume.rng/1"

# Held for the whole of an rng_scope and around every capture and restore (re-entrant:
# the scope's own thread may capture inside it).
_GENERATORS_LOCK = threading.RLock()


def _new_lock_after_fork() -> None:
    # A child forked while another thread held the lock would wait for it forever.
    global _GENERATORS_LOCK
    _GENERATORS_LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def hold_generators() -> threading.RLock:
    """The lock to hold while the global generators hold a temporary state.

    Code that seeds the generators and puts the caller's states back afterwards
    (``rng_scope``, a loader's fetch in the main process) holds it for that time;
    :func:`random_state` and :func:`restore_random_state` take it too, so another
    thread never captures or overwrites a temporary state. Re-entrant.
    """
    return _GENERATORS_LOCK


def _splitmix64(value: int) -> int:
    value = (value + _GOLDEN) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def derive_seed(*values: int) -> int:
    """Mix integers into a 63-bit seed; the same inputs give the same seed everywhere.

    The mix is fixed and independent of the process (no ``hash()``). With
    ``splitmix64(x)`` the standard SplitMix64 step (add ``0x9E3779B97F4A7C15``
    modulo 2**64, then the finaliser with shifts 30/27/31 and multipliers
    ``0xBF58476D1CE4E5B9`` / ``0x94D049BB133111EB``)::

        state = 0x5452524553554D45                     # "TRRESUME"
        for v in values:
            state = splitmix64(state ^ (v mod 2**64))  # negative ints wrap
        seed = splitmix64(state ^ len(values)) & (2**63 - 1)

    The order of the values matters, and the count is mixed in last. The result
    is a valid seed for torch, Python ``random`` and (``seed % 2**32``) NumPy.

    Args:
        *values: The integers to mix (e.g. a base seed and a stream position).

    Returns:
        An int in ``[0, 2**63)``.

    Raises:
        TypeError: a value is not an ``int`` (``bool`` is refused too).
    """
    state = _DERIVE_INIT
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"derive_seed takes ints, got {type(value).__name__}: {value!r}")
        state = _splitmix64(state ^ (value & _MASK64))
    return _splitmix64(state ^ len(values)) & _MASK63


def seed_deriver(first: int, last: int) -> Callable[[int], int]:
    """``lambda value: derive_seed(first, value, last)``, with ``first`` mixed once.

    For seeds derived once per batch from a fixed base and salt: the function takes
    an ``int`` (unchecked) and gives exactly what :func:`derive_seed` gives.

    Raises:
        TypeError: ``first`` or ``last`` is not an ``int``.
    """
    derive_seed(first, 0, last)  # the same checks of first and last
    head = _splitmix64(_DERIVE_INIT ^ (first & _MASK64))
    tail = last & _MASK64

    def derive(value: int) -> int:
        # _splitmix64 three times, written out (it runs once per batch)
        value = ((head ^ (value & _MASK64)) + _GOLDEN) & _MASK64
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = ((value ^ (value >> 31) ^ tail) + _GOLDEN) & _MASK64
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = ((value ^ (value >> 31) ^ 3) + _GOLDEN) & _MASK64
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
        return (value ^ (value >> 31)) & _MASK63

    return derive


def derive_seeds(base: int, first: int, count: int, *, stride: int = 1) -> list[int]:
    """``[derive_seed(base, first + i * stride) for i in range(count)]`` in one NumPy pass.

    The per-sample seeds of a batch (``stride`` is the distance between its samples'
    stream positions: the world size for a sharded stream): the same mix as
    :func:`derive_seed`, vectorised over the positions.
    """
    head = _splitmix64(_DERIVE_INIT ^ (base & _MASK64))
    positions = np.uint64(first & _MASK64) + np.uint64(stride & _MASK64) * np.arange(
        count, dtype=np.uint64
    )
    state = _splitmix64_array(np.uint64(head) ^ positions)
    return (_splitmix64_array(state ^ np.uint64(2)) & np.uint64(_MASK63)).tolist()


def derive_seed_run(first: int, start: int, step: int, count: int, last: int) -> list[int]:
    """``[derive_seed(first, start + i * step, last) for i in range(count)]`` in one NumPy pass.

    The seeds of evenly spaced positions under one base and salt (consecutive batches'
    first positions), computed ahead: what :func:`seed_deriver`'s function gives for each.

    Raises:
        TypeError: ``first`` or ``last`` is not an ``int``.
    """
    derive_seed(first, 0, last)  # the same checks of first and last
    head = _splitmix64(_DERIVE_INIT ^ (first & _MASK64))
    positions = np.uint64(start & _MASK64) + np.uint64(step & _MASK64) * np.arange(
        count, dtype=np.uint64
    )
    state = _splitmix64_array(np.uint64(head) ^ positions)
    state = _splitmix64_array(state ^ np.uint64(last & _MASK64))
    return (_splitmix64_array(state ^ np.uint64(3)) & np.uint64(_MASK63)).tolist()


def _splitmix64_array(value: np.ndarray) -> np.ndarray:
    value = value + np.uint64(_GOLDEN)  # uint64 arithmetic wraps modulo 2**64
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


def seed_cpu_generators(seed: int) -> None:
    """Seed Python ``random``, NumPy's global generator and torch CPU as :func:`rng_scope`
    does, without saving or restoring anything (for code that restores once per batch)."""
    random.seed(seed)
    if type(np.random.mtrand._rand._bit_generator) is not np.random.MT19937:
        # Replaced with another kind (np.random.set_bit_generator): seed an MT19937, as
        # in a process where nothing replaced it.
        np.random.set_bit_generator(np.random.MT19937())
    np.random.seed(seed & _MASK32)
    # torch.default_generator only: torch.manual_seed would reseed CUDA as well.
    torch.default_generator.manual_seed(seed & _MASK64)


@contextmanager
def rng_scope(seed: int) -> Iterator[None]:
    """Seed Python ``random``, NumPy's global generator and torch CPU for the block.

    The caller's generator states come back on exit, also when the block raises.
    CUDA generators are neither seeded nor restored (``torch.manual_seed`` would
    reseed every CUDA device, which is why it is not used).

    Args:
        seed: Any ``int``; Python gets it as is, torch gets it modulo 2**64 (which
            is what ``torch.manual_seed`` does with negative seeds), NumPy modulo 2**32.

    Raises:
        TypeError: ``seed`` is not an ``int`` (``bool`` is refused); nothing changed.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"rng_scope takes an int seed, got {type(seed).__name__}: {seed!r}")
    with _GENERATORS_LOCK:
        python_state = random.getstate()
        bit_generator, numpy_state = np.random.mtrand._rand._bit_generator, numpy_global_state()
        torch_state = torch.get_rng_state()
        try:
            seed_cpu_generators(seed)
            yield
        finally:
            random.setstate(python_state)
            if np.random.mtrand._rand._bit_generator is not bit_generator:  # replaced: put back
                np.random.set_bit_generator(bit_generator)
            np.random.set_state(numpy_state)
            torch.set_rng_state(torch_state)


def numpy_global_state() -> Any:
    """NumPy's global state for ``np.random.set_state``: the legacy tuple of an MT19937, the
    dictionary of another kind (asked for as such: NumPy warns when the legacy form is
    asked of one)."""
    legacy = type(np.random.mtrand._rand._bit_generator) is np.random.MT19937
    return np.random.get_state(legacy=legacy)


def _cuda_index(device: torch.device | str | int) -> int | None:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def random_state(device: torch.device | str | int | None = None) -> RandomState:
    """Capture the main-process generators.

    Args:
        device: When it names a CUDA device (and CUDA is available), that device's
            generator is captured too; ``None`` or a CPU device captures no CUDA state.

    Returns:
        A :class:`RandomState` of Python ``random``, NumPy's global generator, torch
        CPU and optionally one CUDA generator, made of tensors, ints, floats, str and
        ``None`` only (NumPy's key is stored as an int64 tensor, not an ndarray).
    """
    index = _cuda_index(device) if device is not None else None
    with _GENERATORS_LOCK:  # never the seeded state of another thread's rng_scope
        _require_mt19937()
        python = random.getstate()
        numpy_state = np.random.get_state()
        torch_state = torch.get_rng_state()
        cuda = (
            torch.cuda.get_rng_state(index)
            if index is not None and torch.cuda.is_available()
            else None
        )
    return _packed(python, numpy_state, torch_state, cuda, index)


def _require_mt19937() -> None:
    """Refuse a capture while NumPy's global bit generator is not an MT19937: its saved
    form is the MT19937's (``np.random.get_state()``'s legacy tuple)."""
    bit_generator = np.random.mtrand._rand._bit_generator
    if type(bit_generator) is not np.random.MT19937:
        raise UnsupportedResumeConfigurationError(
            f"NumPy's global bit generator is a {type(bit_generator).__name__} "
            "(np.random.set_bit_generator), and the main-process RNG state saves NumPy's "
            "global generator as an MT19937; put an MT19937 back "
            "(np.random.set_bit_generator(np.random.MT19937(seed))) and draw from a "
            "np.random.Generator(np.random.PCG64(...)) of your own, saved with your state"
        )


def _packed(
    python: Any, numpy_state: Any, torch_state: torch.Tensor, cuda: Any, index: int | None
) -> RandomState:
    version, internal, gauss_next = python
    kind, keys, pos, has_gauss, cached_gaussian = numpy_state
    state: RandomState = {
        "format": RNG_FORMAT,
        "python": {
            "version": int(version),
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch_state,
        "cuda": None,
        "cuda_device": None,
    }
    if cuda is not None:
        state["cuda"] = cuda
        state["cuda_device"] = index
    return state


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(f"invalid random state: {what}")


def _int_tensor(value: Any, length: int) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.int64
        and tuple(value.shape) == (length,)
        and bool(((value >= 0) & (value <= _MASK32)).all())
    )


def _python_tuple(python: Any) -> tuple[int, tuple[int, ...], float | None]:
    _require(isinstance(python, dict), "'python' must be a dict")
    _require(
        is_int(python.get("version")) and python["version"] == random.Random.VERSION,
        f"'python.version' must be {random.Random.VERSION}",
    )
    internal = python.get("internal")
    _require(
        _int_tensor(internal, 625),
        "'python.internal' must be an int64 tensor of 625 values in [0, 2**32)",
    )
    _require(int(internal[-1]) <= 624, "'python.internal' position must be at most 624")
    gauss_next = python.get("gauss_next")
    _require(
        gauss_next is None or isinstance(gauss_next, float),
        "'python.gauss_next' must be a float or None",
    )
    result = (python["version"], tuple(internal.tolist()), gauss_next)
    try:
        random.Random().setstate(
            result
        )  # trial on a scratch generator: the global one stays untouched
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid random state: 'python' rejected by random: {error}") from error
    return result


def _numpy_tuple(numpy_state: Any) -> tuple[str, np.ndarray, int, int, float]:
    _require(isinstance(numpy_state, dict), "'numpy' must be a dict")
    _require(numpy_state.get("kind") == "MT19937", "'numpy.kind' must be 'MT19937'")
    keys = numpy_state.get("keys")
    _require(
        _int_tensor(keys, 624), "'numpy.keys' must be an int64 tensor of 624 values in [0, 2**32)"
    )
    pos = numpy_state.get("pos")
    _require(is_int(pos) and 0 <= pos <= 624, "'numpy.pos' must be an int in [0, 624]")
    # NumPy itself accepts any has_gauss; only 0 and 1 are states it can produce.
    _require(
        is_int(numpy_state.get("has_gauss")) and numpy_state["has_gauss"] in (0, 1),
        "'numpy.has_gauss' must be 0 or 1",
    )
    _require(
        isinstance(numpy_state.get("cached_gaussian"), float),
        "'numpy.cached_gaussian' must be a float",
    )
    result = (
        "MT19937",
        keys.cpu().numpy().astype(np.uint32),
        pos,
        numpy_state["has_gauss"],
        numpy_state["cached_gaussian"],
    )
    try:
        np.random.RandomState().set_state(result)
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid random state: 'numpy' rejected by NumPy: {error}") from error
    return result


def _check_byte_tensor(value: Any, what: str) -> None:
    _require(
        isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1,
        f"'{what}' must be a one-dimensional uint8 tensor",
    )


def _generator_state(value: Any, what: str, device: torch.device) -> torch.Tensor:
    _check_byte_tensor(value, what)
    value = value.to("cpu", copy=True)
    try:
        # A right-sized tensor can still hold an invalid engine state; only the
        # generator itself knows, so try it on a scratch generator first.
        torch.Generator(device=device).set_state(value)
    except RuntimeError as error:
        raise ValueError(f"invalid random state: '{what}' rejected by torch: {error}") from error
    return value


class _Checked(NamedTuple):
    python: tuple[int, tuple[int, ...], float | None]
    numpy: tuple[str, np.ndarray, int, int, float]
    torch: torch.Tensor
    cuda: torch.Tensor | None
    cuda_index: int | None


def validate_random_state(
    state: RandomState, device: torch.device | str | int | None = None
) -> None:
    """Check that :func:`restore_random_state` would accept ``state``; changes nothing.

    Raises:
        ValueError, RuntimeError: as :func:`restore_random_state`.
    """
    _check(state, device)


def _check(state: Any, device: torch.device | str | int | None) -> _Checked:
    _require(isinstance(state, dict), f"expected a dict, got {type(state).__name__}")
    _require(
        state.get("format") == RNG_FORMAT, f"format {state.get('format')!r} is not {RNG_FORMAT!r}"
    )
    python = _python_tuple(state.get("python"))
    numpy_state = _numpy_tuple(state.get("numpy"))
    torch_state = _generator_state(state.get("torch"), "torch", torch.device("cpu"))
    cuda = state.get("cuda")
    saved_index = state.get("cuda_device")
    _require(
        saved_index is None or (is_int(saved_index) and saved_index >= 0),
        "'cuda_device' must be None or a device index",
    )
    cuda_state = None
    cuda_index = None
    if cuda is not None:
        _check_byte_tensor(cuda, "cuda")
        _require(
            saved_index is not None, "'cuda_device' must name the device of the saved CUDA state"
        )
        if device is not None:
            cuda_index = _cuda_index(device)
            if cuda_index is None:
                raise ValueError(
                    f"the random state holds a CUDA generator state but device {device!r} is not a "
                    "CUDA device; pass a CUDA device or None (the device it was captured from)"
                )
        else:
            cuda_index = saved_index
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the random state holds a CUDA generator state but CUDA is not available"
            )
        if cuda_index >= torch.cuda.device_count():
            raise RuntimeError(
                f"the random state's CUDA generator is for cuda:{cuda_index}, "
                f"but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        cuda_state = _generator_state(cuda, "cuda", torch.device("cuda", cuda_index))

    return _Checked(python, numpy_state, torch_state, cuda_state, cuda_index)


def restore_random_state(
    state: RandomState, device: torch.device | str | int | None = None
) -> None:
    """Restore generators captured by :func:`random_state`.

    Every part is validated (also by a trial load into scratch generators) before
    any global generator changes, so a rejected state leaves all of them as they were.

    Args:
        state: A state from :func:`random_state` (also after ``torch.save`` /
            ``torch.load(weights_only=True)``).
        device: Where to restore a saved CUDA state: ``None`` means the device it
            was captured from; otherwise a CUDA device. Without a saved CUDA state
            no CUDA generator is changed.

    Raises:
        ValueError: the state is malformed, or it holds a CUDA state and ``device``
            is not a CUDA device (nothing was changed).
        RuntimeError: the state holds a CUDA state but CUDA is not available, or
            the target CUDA device does not exist (nothing was changed).
    """
    checked = _check(state, device)
    with _GENERATORS_LOCK:
        random.setstate(checked.python)
        np.random.set_state(checked.numpy)
        torch.set_rng_state(checked.torch)
        if checked.cuda is not None:
            torch.cuda.set_rng_state(checked.cuda, checked.cuda_index)
