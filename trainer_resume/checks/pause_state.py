"""Checks of pause checkpoints: before one is written (``to_cpu``, ``check_saveable``) and
after one is loaded, before any trainer state is touched (the other checks)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import CheckpointFormatError, ResumeStateMismatchError
from ..rng import validate_random_state
from ..signature import canonical_config
from ..state import PAUSE_FORMAT, map_tensors
from .weights_only import refused_entry

__all__ = [
    "check_layout",
    "check_names",
    "check_random_state",
    "check_saveable",
    "object_states",
    "optional_entry",
    "to_cpu",
]

# Entries every pause file has; "config", "regular" and "shared_keys" are optional so
# files written without them (older layouts) still load.
_REQUIRED: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("module_version", str),
    ("config_signature", str),
    ("completed_steps", int),
    ("objects", dict),
    ("loaders", dict),
    ("extra", dict),
    ("rng", dict),
)


def to_cpu(value: Any, memo: dict[Any, tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """Move nested tensor state to CPU; CPU tensors are kept, not copied.

    pause() serialises the result while it holds the training lock, so nothing can
    change the live tensors meanwhile; copying them would only double the memory
    and time of a pause. A tensor met twice (tied weights, shared keys) stays one
    tensor.
    """
    return map_tensors(value, _detached_on_cpu, memo)


def _detached_on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach() if tensor.device.type == "cpu" else tensor.detach().to("cpu")


def check_saveable(value: Any, where: str = "checkpoint") -> None:
    """Raise ``TypeError`` naming the first entry a weights-only load would refuse.

    save_checkpoint writes any picklable object, but resume() loads weights-only:
    catching such an entry at pause time beats a pause file that cannot be resumed.
    """
    problem = refused_entry(value, where)
    if problem is not None:
        raise TypeError(
            f"{problem}; pause state must be tensors, numbers, str, None and dicts/lists/tuples of them "
            "(torch.load(weights_only=True) refuses anything else)"
        )


def check_layout(checkpoint: Any, path: str) -> None:
    """Raise ``CheckpointFormatError`` unless ``checkpoint`` has the pause layout."""
    if not isinstance(checkpoint, dict):
        raise CheckpointFormatError(
            f"{path} holds a {type(checkpoint).__name__}, not a pause checkpoint"
        )
    if checkpoint.get("format") != PAUSE_FORMAT:
        raise CheckpointFormatError(
            f"{path}: format {checkpoint.get('format')!r}, expected {PAUSE_FORMAT!r}"
        )
    for key, kind in _REQUIRED:
        value = checkpoint.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointFormatError(f"{path}: entry {key!r} is missing or not a {_name(kind)}")
    if checkpoint["completed_steps"] < 0:
        raise CheckpointFormatError(f"{path}: completed_steps is {checkpoint['completed_steps']}")
    regular = checkpoint.get("regular")
    shared = checkpoint.get("shared_keys", [])
    if regular is not None and not isinstance(regular, dict):
        raise CheckpointFormatError(f"{path}: entry 'regular' is not a dict")
    if not isinstance(shared, (list, tuple)) or not all(isinstance(name, str) for name in shared):
        raise CheckpointFormatError(f"{path}: entry 'shared_keys' is not a list of names")
    config = checkpoint.get("config")
    if config is not None:
        try:
            if not isinstance(config, (dict, list)):
                raise TypeError(f"it is a {type(config).__name__}")
            # Checked now, so that describing a config mismatch later cannot fail.
            canonical_config(config, exclude=())
        except (TypeError, ValueError) as error:
            raise CheckpointFormatError(
                f"{path}: entry 'config' is not a canonical config: {error}"
            ) from error


def optional_entry(checkpoint: Mapping[str, Any], key: str, location: str) -> Mapping[str, Any]:
    """An optional dict entry of a pause file (absent in files of earlier releases: empty).

    Raises:
        CheckpointFormatError: the entry is there and not a dict (321).
    """
    entry = checkpoint.get(key, {})
    if not isinstance(entry, Mapping):
        raise CheckpointFormatError(f"{location}: entry {key!r} is not a dict")
    return entry


def object_states(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """Name -> saved state of every resume object, shared keys read from the regular snapshot."""
    states = dict(checkpoint["objects"])
    regular = checkpoint.get("regular")
    for name in checkpoint.get("shared_keys", []):
        if regular is None or name not in regular:
            raise ResumeStateMismatchError(
                f"shared key {name!r} is not in the file's regular checkpoint"
            )
        states[name] = regular[name]
    return states


def check_names(kind: str, saved: Iterable[str], expected: Iterable[str]) -> None:
    """Raise ``ResumeStateMismatchError`` naming the entries only one side has."""
    saved_set, expected_set = set(saved), set(expected)
    if saved_set == expected_set:
        return
    parts = []
    if expected_set - saved_set:
        parts.append(f"missing from the checkpoint: {sorted(map(str, expected_set - saved_set))}")
    if saved_set - expected_set:
        parts.append(f"not in this trainer: {sorted(map(str, saved_set - expected_set))}")
    raise ResumeStateMismatchError(f"{kind}: " + "; ".join(parts))


def check_random_state(state: Any, path: str, device: int | None) -> None:
    """Refuse an RNG state that ``restore_random_state`` would reject, before restoring begins."""
    try:
        validate_random_state(state, device)
    except ValueError as error:
        raise CheckpointFormatError(f"{path}: rng: {error}") from error
    except RuntimeError as error:  # a CUDA generator state where no such device exists
        raise ResumeStateMismatchError(f"{path}: rng: {error}") from error


def _name(kind: type | tuple[type, ...]) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
