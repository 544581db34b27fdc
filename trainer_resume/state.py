"""CPU snapshots of nested state and the schemas of everything trainer-resume saves.

Every saved state is plain data (tensors, ints, floats, bools, str, None, lists,
tuples, dicts) so ``torch.load(weights_only=True)`` reads it. The TypedDicts below
document the keys so an editor shows what a checkpoint holds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, TypedDict

import torch

__all__ = [
    "cpu_state",
    "PythonRandomState",
    "NumpyRandomState",
    "RandomState",
    "SamplerState",
    "BatchSamplerState",
    "LoaderState",
    "PauseCheckpoint",
    "PAUSE_FORMAT",
]

PAUSE_FORMAT = "trainer_resume.pause/1"


def cpu_state(value: Any) -> Any:
    """Return an independent CPU copy of nested tensor state.

    Tensors are detached and copied to CPU (also when already on CPU), so later
    changes to the source never reach the copy. ``dict``, ``OrderedDict`` (with its
    ``_metadata``, which ``Module.load_state_dict`` uses for version handling),
    ``list`` and ``tuple`` are rebuilt; other values are returned as they are. A
    tensor that appears several times (tied weights) is copied once and stays
    shared in the copy.
    """
    return _copy(value, {})


def _copy(value: Any, memo: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        copied = memo.get(id(value))
        if copied is None:
            copied = value.detach().to("cpu", copy=True)
            memo[id(value)] = copied
        return copied
    if isinstance(value, OrderedDict):
        result: Any = OrderedDict((key, _copy(item, memo)) for key, item in value.items())
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            result._metadata = _copy(metadata, memo)
        return result
    if isinstance(value, dict):
        return {key: _copy(item, memo) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item, memo) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy(item, memo) for item in value)
    return value


class PythonRandomState(TypedDict):
    version: int
    internal: torch.Tensor  # int64, 625 values (Mersenne Twister words + position)
    gauss_next: float | None


class NumpyRandomState(TypedDict):
    kind: str
    keys: torch.Tensor  # int64, 624 values
    pos: int
    has_gauss: int
    cached_gaussian: float


class RandomState(TypedDict):
    format: str
    python: PythonRandomState
    numpy: NumpyRandomState
    torch: torch.Tensor  # uint8, torch.get_rng_state()
    cuda: torch.Tensor | None  # uint8, torch.cuda.get_rng_state(cuda_device)
    cuda_device: int | None


class SamplerState(TypedDict):
    """State of a resumable :class:`~trainer_resume.loaders.InfiniteRandomSampler`."""

    format: str
    dataset_size: int
    seed: int
    consumed: int  # samples delivered since the start of the stream
    cycle: int  # consumed // dataset_size
    offset: int  # consumed % dataset_size


class BatchSamplerState(TypedDict):
    """State of a resumable batch sampler from ``build_batch_sampler``."""

    format: str
    settings_digest: str  # digest of target, batch size and balancing options
    seed: int
    cycle: int
    offset: int  # batches delivered within ``cycle``
    consumed: int  # samples delivered since the start of the stream


class LoaderState(TypedDict):
    """State of a resumable :class:`~trainer_resume.loaders.ResumableDataLoader`."""

    format: str
    augmentation_seed: int
    delivered_batches: int
    sampler: SamplerState | BatchSamplerState


class PauseCheckpoint(TypedDict):
    """Layout of a pause file written by ``TrainingResumeMixin.pause``."""

    format: str  # PAUSE_FORMAT
    module_version: str
    config_signature: str
    completed_steps: int
    regular: dict[str, Any] | None  # CPU snapshot of _regular_checkpoint(), or None
    shared_keys: list[str]  # resume objects whose state is regular[name]
    objects: dict[str, Any]  # name -> state_dict (absent for shared keys)
    loaders: dict[str, LoaderState]
    extra: dict[str, Any]
    rng: RandomState
