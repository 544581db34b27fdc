"""How the checkpoint code calls ``torch.save`` and ``torch.load``.

Writing skips torch's per-record CRC-32 (the checkpoint's own digest covers every
byte, and torch reads such archives). Loading is weights-only, from verified bytes
in memory (tensor records read ahead into their own storages, or a sealed copy of
the whole payload), and every way a payload can fail to load becomes a catalogue
error.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..checks.weights_only import refusal_reason
from ..errors import CheckpointFormatError, UnsafeCheckpointError
from ._direct_copy import DirectCopy
from ._sealed_copy import SealedCopy

__all__ = [
    "MAX_NESTING",
    "check_nesting",
    "crc32_skipped",
    "load_payload",
    "load_read_ahead",
    "read_ahead_supported",
]

# Deeper nesting than this is refused on save and on load: code that walks a
# state recursively (Python's recursion limit is 1000 frames) must not fail on a
# file that passed verification. Real checkpoints nest a handful of levels.
MAX_NESTING = 200

# Words of torch's weights-only refusals that mean "needs objects outside the safe
# set" (as opposed to a malformed pickle).
_UNSAFE_WORDS = ("GLOBAL", "allowlisted", "unrecognized function", "must be imported")

_crc_per_thread: bool | None = None


def _serialization_config() -> Any:
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch before 2.5 has no such switch
        return None
    return config if hasattr(config.save, "compute_crc32") else None


def _config_is_per_thread(config: Any) -> bool:
    """Whether a value set in one thread stays invisible to the others (a ContextVar)."""
    global _crc_per_thread
    if _crc_per_thread is None:
        seen: list[bool] = []

        def probe() -> None:
            before = config.save.compute_crc32
            config.save.compute_crc32 = not before
            seen.append(before)

        main_value = config.save.compute_crc32
        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        changed_here = config.save.compute_crc32 != main_value
        if changed_here:  # a global switch: undo the probe's change
            config.save.compute_crc32 = main_value
        _crc_per_thread = not changed_here
    return _crc_per_thread


@contextlib.contextmanager
def crc32_skipped() -> Iterator[None]:
    """Let ``torch.save`` in this thread skip its per-record CRC-32; restored on exit.

    torch keeps the switch per thread (a ContextVar) in recent versions; with an
    older, process-wide switch nothing is changed, so other threads' saves are
    never affected.
    """
    config = _serialization_config()
    if config is None or not _config_is_per_thread(config):
        yield
        return
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


def check_nesting(obj: Any, where: str, *, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` if containers in ``obj`` nest deeper than :data:`MAX_NESTING`.

    Iterative, so any depth is measured without recursion.
    """
    stack: list[tuple[Any, int]] = [(obj, 0)]
    seen: set[int] = set()
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth >= MAX_NESTING:
            raise error(f"{where} nests containers deeper than {MAX_NESTING} levels")
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend((child, depth + 1) for child in children)


def read_ahead_supported() -> bool:
    """Whether this torch can unpickle with storages read ahead (see :func:`load_read_ahead`).

    Asked at every load (tens of microseconds, next to a load): the answer follows whatever
    ``torch.serialization._load`` is at that moment.
    """
    load = getattr(torch.serialization, "_load", None)
    if not callable(load) or not hasattr(os, "preadv"):
        return False
    if not hasattr(torch._C, "PyTorchFileReader"):
        return False
    try:
        parameters = list(inspect.signature(load).parameters)
    except (TypeError, ValueError):
        return False
    return parameters[:4] == ["zip_file", "map_location", "pickle_module", "pickle_file"]


def load_read_ahead(copy: DirectCopy, prefix: str, map_location: Any, where: str) -> Any:
    """Unpickle the verified payload in ``copy``, weights-only, with its storages read ahead.

    This is ``torch.load(weights_only=True)`` of a zip archive (the same unpickler
    and storage handling: ``torch.serialization._load``), with one difference: a
    tensor record is not read from the archive into a new storage, the storage
    ``copy`` already read it into is used. Each storage is its own allocation, as
    with ``torch.load``; nothing of ``copy`` stays alive but the storages the
    loaded object uses. Peak memory: the storages plus the bytes between them.
    ``torch.serialization._load`` is private to torch: :func:`read_ahead_supported`
    checks its signature before every load, and without it loads take the
    whole-copy path (:func:`load_payload`, public ``torch.load`` only).

    Raises:
        CheckpointFormatError, UnsafeCheckpointError: As :func:`load_payload`.
    """
    from torch import _weights_only_unpickler

    def load() -> Any:
        archive = _ReadAheadArchive(torch._C.PyTorchFileReader(copy.reader()), copy, prefix)
        try:
            return torch.serialization._load(  # type: ignore[attr-defined]
                archive, map_location, _weights_only_unpickler, "data.pkl", encoding="utf-8"
            )
        except pickle.UnpicklingError as exc:  # worded as torch.load words it
            advice = getattr(torch.serialization, "_get_wo_message", None)
            if advice is None:
                raise
            raise pickle.UnpicklingError(advice(str(exc))) from None

    obj = _unpickled(load, where)
    check_nesting(obj, where, error=CheckpointFormatError)
    return obj


class _ReadAheadArchive:
    """torch's zip reader, but tensor records come from storages already read."""

    def __init__(self, archive: Any, copy: DirectCopy, prefix: str) -> None:
        self._archive, self._copy, self._prefix = archive, copy, prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._archive, name)

    def get_storage_from_record(self, name: str, nbytes: int, storage_type: Any) -> Any:
        found = self._copy.storage(self._prefix + name, nbytes)
        if found is None:  # a record longer than its tensor: read its first bytes
            return self._archive.get_storage_from_record(name, nbytes, storage_type)
        return found


def load_payload(copy: SealedCopy, map_location: Any, where: str) -> Any:
    """``torch.load`` the verified payload in ``copy``, weights-only.

    From a sealed ``memfd`` the payload is loaded with ``mmap=True`` (its records are
    not copied: torch's file reader is several times slower on such a file than on
    a regular one), and then every CPU tensor is moved, in place, to a storage of
    ordinary memory (one copy per storage, so aliases stay aliases and tensors keep
    their identity and type): nothing the caller keeps (an optimizer adopts its
    loaded state as is) holds on to the copy, which is released when the caller
    closes it. Peak memory: the copy and the loaded tensors, about 2x the payload.

    Raises:
        CheckpointFormatError: The payload is no readable torch archive, a malformed
            pickle, or nested too deeply (321).
        UnsafeCheckpointError: It needs objects outside the weights-only set (328).
    """
    mapped = copy.path is not None
    source: Any = copy.path if mapped else copy.reader()
    if mapped:
        copy.unmap()  # verified and checked: torch's mapping is the only one from here
    obj = _unpickled(
        lambda: torch.load(source, map_location=map_location, weights_only=True, mmap=mapped),
        where,
    )
    check_nesting(obj, where, error=CheckpointFormatError)
    if mapped:
        _into_own_memory(obj)
    return obj


def _unpickled(load: Callable[[], Any], where: str) -> Any:
    """``load()``, with every way it can fail on a bad payload turned into our error."""
    try:
        return load()
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if any(word in text for word in _UNSAFE_WORDS):
            raise UnsafeCheckpointError(f"{where}: {refusal_reason(exc)}") from exc
        raise CheckpointFormatError(f"{where}: the payload's pickle is malformed") from exc
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        # torch's zip reader, a truncated pickle, a record that does not exist...:
        # the digest matched, so the file was written this way, not damaged later.
        raise CheckpointFormatError(
            f"{where}: the payload is not a readable torch.save archive "
            f"({type(exc).__name__}: {_first_line(str(exc))})"
        ) from exc


def _into_own_memory(obj: Any) -> None:
    """Give every CPU tensor in ``obj`` a storage of its own memory, in place.

    Tensors mapped from the payload copy would keep the whole copy mapped for as long
    as any of them lives. Each storage is copied once and every tensor viewing it is
    pointed at the copy with ``set_`` (same offset, size and stride), so identity,
    subclass (``Parameter``), ``requires_grad`` and aliasing are kept. Tensors of
    other layouts (sparse, quantized) are rare in a state and keep their mapping.
    """
    # storage address -> (that storage, its copy): holding the original keeps its
    # address from being reused by a copy made later in the walk
    copies: dict[int, tuple[Any, Any]] = {}
    seen: set[int] = set()
    stack = [obj]
    with torch.no_grad():
        while stack:
            value = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" or value.layout != torch.strided:
                    continue
                if value.is_quantized:
                    continue
                storage = value.untyped_storage()
                entry = copies.get(storage._cdata)
                if entry is None:
                    entry = copies[storage._cdata] = (storage, storage.clone())
                value.set_(entry[1], value.storage_offset(), value.size(), value.stride())
            elif isinstance(value, dict):
                stack.extend(value.values())
                metadata = getattr(value, "_metadata", None)
                if metadata is not None:
                    stack.append(metadata)
            elif isinstance(value, (list, tuple, set, frozenset)):
                stack.extend(value)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""
