"""Capture and restore of the main-process random generators.

``random_state`` returns plain data only (tensors, ints, floats, None, tuples),
so it is readable by ``torch.load(weights_only=True)``. ``restore_random_state``
validates the whole state before touching any generator.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from .state import RandomState

__all__ = ["random_state", "restore_random_state", "rng_scope", "derive_seed"]

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DERIVE_INIT = 0x5452_5245_5355_4D45  # "TRRESUME"

RNG_FORMAT = "trainer_resume.rng/1"


def _splitmix64(value: int) -> int:
    value = (value + _GOLDEN) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def derive_seed(*values: int) -> int:
    """Mix integers into a 63-bit seed; the same inputs give the same seed everywhere.

    The mix is fixed and independent of the process (no ``hash()``): starting from
    a constant, each value (taken modulo 2**64) is xored into the running state,
    which then goes through the SplitMix64 finaliser; the result keeps 63 bits so it
    is a valid seed for torch, Python and (reduced) NumPy alike. The order of the
    values matters.

    Raises:
        TypeError: a value is not an ``int`` (``bool`` is refused too).
    """
    state = _DERIVE_INIT
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"derive_seed takes ints, got {type(value).__name__}: {value!r}")
        state = _splitmix64(state ^ (value & _MASK64))
    return _splitmix64(state ^ len(values)) & _MASK63


def _seed_all_cpu(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    # torch.default_generator only: torch.manual_seed would reseed CUDA as well.
    torch.default_generator.manual_seed(seed)


@contextmanager
def rng_scope(seed: int) -> Iterator[None]:
    """Seed Python, NumPy (global) and torch CPU for the block, then restore them.

    The caller's generator states come back on exit, also when the block raises.
    CUDA generators are not touched.
    """
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    try:
        _seed_all_cpu(seed)
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)


def _cuda_index(device: torch.device | str | int | None) -> int | None:
    if device is None:
        return None
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def random_state(device: torch.device | str | int | None = None) -> RandomState:
    """Capture Python ``random``, NumPy's global generator, torch CPU and, for a CUDA
    ``device``, that device's generator.

    Returns:
        A :class:`RandomState` made of tensors, ints, floats and ``None`` only.
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
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
        "torch": torch.get_rng_state(),
        "cuda": None,
        "cuda_device": None,
    }
    index = _cuda_index(device)
    if index is not None and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(index)
        state["cuda_device"] = index
    return state


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(f"invalid random state: {what}")


def _validate(state: Any) -> None:
    _require(isinstance(state, dict), "expected a dict")
    _require(state.get("format") == RNG_FORMAT, f"format {state.get('format')!r} is not {RNG_FORMAT!r}")
    python = state.get("python")
    _require(isinstance(python, dict), "missing 'python'")
    internal = python.get("internal")
    _require(
        isinstance(internal, torch.Tensor) and internal.dtype == torch.int64 and internal.shape == (625,),
        "'python.internal' must be an int64 tensor of 625 values",
    )
    _require(isinstance(python.get("version"), int), "'python.version' must be an int")
    _require(
        python.get("gauss_next") is None or isinstance(python.get("gauss_next"), float),
        "'python.gauss_next' must be a float or None",
    )
    _require(bool(((internal >= 0) & (internal < (1 << 32))).all()), "'python.internal' out of range")
    numpy_state = state.get("numpy")
    _require(isinstance(numpy_state, dict), "missing 'numpy'")
    keys = numpy_state.get("keys")
    _require(numpy_state.get("kind") == "MT19937", "'numpy.kind' must be 'MT19937'")
    _require(
        isinstance(keys, torch.Tensor) and keys.dtype == torch.int64 and keys.shape == (624,),
        "'numpy.keys' must be an int64 tensor of 624 values",
    )
    _require(bool(((keys >= 0) & (keys < (1 << 32))).all()), "'numpy.keys' out of range")
    _require(isinstance(numpy_state.get("pos"), int) and 0 <= numpy_state["pos"] <= 624, "'numpy.pos' out of range")
    _require(isinstance(numpy_state.get("has_gauss"), int), "'numpy.has_gauss' must be an int")
    _require(isinstance(numpy_state.get("cached_gaussian"), float), "'numpy.cached_gaussian' must be a float")
    torch_state = state.get("torch")
    expected = torch.get_rng_state()
    _require(
        isinstance(torch_state, torch.Tensor)
        and torch_state.dtype == torch.uint8
        and torch_state.shape == expected.shape,
        "'torch' must be a uint8 tensor shaped like torch.get_rng_state()",
    )
    cuda = state.get("cuda")
    _require(
        cuda is None or (isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8),
        "'cuda' must be None or a uint8 tensor",
    )
    _require(
        cuda is None or isinstance(state.get("cuda_device"), int),
        "'cuda_device' must name the device of the saved CUDA state",
    )


def restore_random_state(state: RandomState, device: torch.device | str | int | None = None) -> None:
    """Restore generators captured by :func:`random_state`.

    The whole state is validated first; nothing changes when it is rejected. The
    CUDA state is restored to ``device`` (default: the device it was saved from)
    when it was captured and CUDA is available.

    Raises:
        ValueError: the state is malformed (nothing was changed).
        RuntimeError: the state holds a CUDA generator but CUDA is not available.
    """
    _validate(state)
    cuda_index = None
    if state["cuda"] is not None:
        if not torch.cuda.is_available():
            raise RuntimeError("the random state holds a CUDA generator but CUDA is not available")
        cuda_index = _cuda_index(device) if device is not None else state["cuda_device"]
    python = state["python"]
    numpy_state = state["numpy"]
    random.setstate((python["version"], tuple(int(v) for v in python["internal"].tolist()), python["gauss_next"]))
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"].clone())
    if cuda_index is not None:
        torch.cuda.set_rng_state(state["cuda"].clone(), cuda_index)
