"""What ``trainer-resume inspect`` says about a file: one plain-data summary per kind.

The summary is the JSON that ``inspect --json`` prints and the source of the text
report. Every kind of file :func:`~trainer_resume.checkpoint_files.read_checkpoint_file`
reads is described: pause files of the mixin (one process or several), Lightning
pause files and checkpoints (ours, verified, or plain), finished markers, other
``save_checkpoint`` files and plain ``torch.save`` files. Keys common to all kinds:

- ``path``, ``file_bytes``, ``kind``, ``description``;
- ``verified`` and ``integrity`` (the verified header), or ``not_verified``;
- ``steps``: the counters the file holds (``completed_steps``, Lightning's
  ``global_step``, a plain file's ``global_step`` / ``step`` / ``epoch``...), and
  ``epoch`` when known;
- ``rng``: ``{"saved": false}`` or what was saved, for how many processes;
- ``config_signature`` (or ``None``).

An object whose state is a module's ``state_dict`` (of a pause file, or a Lightning
file's ``state_dict``) also has ``keys`` (their number) and ``first_keys`` (the first
:data:`FIRST_KEYS`, in the file's order): the names a ``load_state_dict`` will need.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._module_names import is_module_state
from ..checkpoint_files import (
    CHECKPOINT,
    FINISHED,
    LIGHTNING,
    LIGHTNING_PAUSE,
    PAUSE,
    SAFETENSORS,
    TORCH,
    CheckpointFile,
    kind_of,
    tensor_totals,
)
from ..checkpoint_files.lightning import PAUSE_KEY
from ..errors import CheckpointCorruptedError, CheckpointFormatError, SkippedCheckpointWarning
from ..finished import finished_marker_path, is_finished_marker_name
from ..resume_points.files import candidates, point_name
from ..resume_points.sharded_points import committed_sharded, is_sharded_point
from ..state import (
    BATCH_SAMPLER_FORMAT,
    DALI_ITERATOR_FORMAT,
    EPOCH_SAMPLER_FORMAT,
    ITERABLE_DATASET_FORMAT,
    RANK_BUFFERS_KEY,
    RANK_CONFIG_KEY,
    SAMPLER_FORMAT,
    SHARDED_FORMAT,
    STATEFUL_SAMPLER_FORMAT,
)
from ..storage import paths

__all__ = [
    "FIRST_KEYS",
    "NOT_VERIFIED",
    "SHARDED_MANIFEST",
    "describe_directory",
    "describe_file",
    "loader_position",
    "loader_positions",
    "manifest_summary",
    "module_keys",
    "module_modes",
    "pause_summary",
    "rng_summary",
]

NOT_VERIFIED = "not verified: no trainer-resume header"
FIRST_KEYS = 3  # a module's first keys an object's description lists

DIRECTORY = "directory"
SHARDED_MANIFEST = "sharded manifest"
_DESCRIPTIONS = {
    PAUSE: "pause file (TrainingResumeMixin)",
    LIGHTNING_PAUSE: "Lightning pause file (ResumeCallback)",
    LIGHTNING: "Lightning checkpoint",
    FINISHED: "finished marker (the run completed; nothing to resume)",
    CHECKPOINT: "checkpoint (save_checkpoint)",
    TORCH: "torch.save file",
    SAFETENSORS: "safetensors file",
}
# Counters a plain training checkpoint commonly holds at its top level.
_PLAIN_COUNTERS = ("global_step", "step", "steps", "iteration", "epoch")
_SHOWN_VALUE = 40  # scalar entries up to this many characters are shown with their value


def describe_file(file: CheckpointFile, *, signature_verified: bool) -> dict[str, Any]:
    """The summary of a read file (see the module docstring)."""
    summary: dict[str, Any] = {
        "path": file.path,
        "file_bytes": file.file_bytes,
        "kind": file.kind,
        "description": _DESCRIPTIONS[file.kind],
        "verified": file.verified,
    }
    if file.header is not None:
        summary["integrity"] = {
            "file_format_version": file.header.format_version,
            "payload_bytes": file.header.payload_length,
            "digest_algorithm": file.header.algorithm,
            "digest": file.header.digest,
            "signed": file.header.signed,
            "signature_verified": signature_verified,
        }
    else:
        summary["not_verified"] = NOT_VERIFIED
    content = file.content
    if file.kind == PAUSE:
        summary.update(pause_summary(content))
        steps = content.get("completed_steps")
        if isinstance(steps, int) and paths.basename(file.path) == point_name(steps):
            summary["description"] = "resume point (TrainingResumeMixin)"
    elif file.kind in (LIGHTNING, LIGHTNING_PAUSE):
        summary.update(_lightning(content))
        steps = summary["steps"]["global_step"]
        if isinstance(steps, int) and paths.basename(file.path) == point_name(steps):
            summary["description"] = "Lightning resume point"
    elif file.kind == SAFETENSORS:
        summary.update(_safetensors(content))
    elif file.kind == FINISHED:
        summary.update(
            steps={"completed_steps": content.get("completed_steps")},
            epoch=None,
            finished_at=content.get("finished_at"),
            rng={"saved": False},
            config_signature=None,
        )
    elif isinstance(content, Mapping) and content.get("format") == SHARDED_FORMAT:
        summary.update(manifest_summary(content))
    else:
        summary.update(_entries(content))
    return summary


# ---------------------------------------------------------------------- pause files


def pause_summary(content: Mapping[str, Any]) -> dict[str, Any]:
    """Steps, objects, loaders, RNG and extra keys of a mixin pause checkpoint."""
    distributed = (
        content.get("distributed") if isinstance(content.get("distributed"), Mapping) else {}
    )
    ranks = distributed.get("ranks") if isinstance(distributed.get("ranks"), list) else []
    regular = content.get("regular") or {}
    shared = list(content.get("shared_keys") or [])
    objects = dict(content.get("objects") or {})
    classes = _mapping(content.get("object_classes"))
    modes = _mapping(content.get("module_modes"))
    seen: set[int] = set()
    described: dict[str, Any] = {}
    for name in [*objects, *(n for n in shared if n not in objects)]:
        state = regular.get(name) if name in shared else objects[name]
        count, size = tensor_totals(state, seen)
        described[str(name)] = {
            "tensors": count,
            "bytes": size,
            "shared": name in shared,
            **module_keys(state),
            **({"class": str(classes[name])} if name in classes else {}),
            **module_modes(modes.get(name)),
        }
    summary: dict[str, Any] = {
        "format": content.get("format"),
        "module_version": content.get("module_version"),
        "config_signature": content.get("config_signature"),
        "completed_steps": content.get("completed_steps"),
        "steps": {"completed_steps": content.get("completed_steps")},
        "epoch": None,
        "world_size": distributed.get("world_size", 1),
        "objects": described,
    }
    if regular:
        rest = {k: v for k, v in regular.items() if k not in shared}
        count, size = tensor_totals(rest, seen)
        summary["regular_checkpoint"] = {
            "keys": [str(k) for k in regular],
            "unshared_keys": [str(k) for k in rest],
            "tensors": count,
            "bytes": size,
        }
    # Every rank saved the same global cursor; rank 0's loaders are the file's top level.
    summary["loaders"] = loader_positions(content.get("loaders"), summary["world_size"])
    rank_rng = [rank.get("rng") for rank in ranks if isinstance(rank, Mapping)]
    summary["rng"] = rng_summary(content.get("rng"), processes=len(rank_rng) or 1)
    summary["extra"] = [str(k) for k in (content.get("extra") or {})]
    buffers = _mapping(content.get(RANK_BUFFERS_KEY))
    if buffers:
        summary["rank_buffers"] = {
            str(model): len(_mapping(entry)) for model, entry in buffers.items()
        }
    # Where the ranks signed different configs (a value per rank), each rank's own.
    signed = [_mapping(rank.get(RANK_CONFIG_KEY)) for rank in ranks if isinstance(rank, Mapping)]
    if any(signed):
        summary["rank_config_signatures"] = [
            config.get("config_signature") if config else content.get("config_signature")
            for config in signed
        ]
    if "config" in content:
        summary["config"] = content["config"]
    return summary


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def module_modes(entry: Any) -> dict[str, Any]:
    """``eval``, ``frozen`` and ``untracked`` of a module's saved modes (its submodules in
    eval mode, its parameters with ``requires_grad=False``, its normalization layers with
    ``track_running_stats=False``); nothing where none were saved."""
    if not isinstance(entry, Mapping):
        return {}
    return {
        "eval": [str(path) for path in entry.get("eval") or ()],
        "frozen": [str(key) for key in entry.get("frozen") or ()],
        "untracked": [str(path) for path in entry.get("untracked") or ()],
    }


def module_keys(state: Any) -> dict[str, Any]:
    """``keys`` and ``first_keys`` of a module's ``state_dict``; nothing for other states."""
    if not is_module_state(state):
        return {}
    return {"keys": len(state), "first_keys": [str(key) for key in list(state)[:FIRST_KEYS]]}


def loader_positions(loaders: Any, world_size: int) -> dict[str, Any]:
    """:func:`loader_position` of each loader of a pause written by ``world_size`` processes."""
    if not isinstance(loaders, Mapping):
        return {}
    return {str(name): loader_position(state, world_size) for name, state in loaders.items()}


def loader_position(state: Any, world_size: int | None = None) -> dict[str, Any]:
    """Consumed samples, cycle, offset (with its unit), delivered batches and ranks of a loader
    (of a DALI iterator: its epoch, batches and the size of each pipeline's DALI checkpoint).

    A ``ShardedBatchSampler`` keeps no rank count in its state (a state loads with any):
    its stream is sharded over the processes that wrote the pause, ``world_size``."""
    position: dict[str, Any] = {}
    if not isinstance(state, Mapping):
        return position
    if state.get("format") == DALI_ITERATOR_FORMAT:
        return _dali_position(state)
    inner = state.get("sampler") if isinstance(state.get("sampler"), Mapping) else state
    for key in ("consumed", "cycle", "epoch", "offset", "num_replicas"):
        if key in inner:
            position[key] = inner[key]
    settings = inner.get("settings")
    if isinstance(settings, Mapping) and settings.get("batch_sampler") == "ShardedBatchSampler":
        position.pop("num_replicas", None)
        if world_size is not None:
            position["num_replicas"] = world_size
    elif (
        "num_replicas" not in position
        and isinstance(settings, Mapping)
        and "num_replicas" in settings
    ):
        position["num_replicas"] = settings["num_replicas"]
    sampler_format = inner.get("format")
    if sampler_format in (
        BATCH_SAMPLER_FORMAT,
        EPOCH_SAMPLER_FORMAT,
        STATEFUL_SAMPLER_FORMAT,
        ITERABLE_DATASET_FORMAT,
    ):
        position["offset_unit"] = "batches"  # batches delivered within the cycle, epoch or pass
    elif sampler_format == SAMPLER_FORMAT:
        position["offset_unit"] = "samples"
    if "delivered_batches" in state:
        position["delivered_batches"] = state["delivered_batches"]
    if sampler_format is not None:
        position["sampler_format"] = sampler_format
    return position


def _dali_position(state: Mapping[str, Any]) -> dict[str, Any]:
    checkpoints = state.get("checkpoints") if isinstance(state.get("checkpoints"), list) else []
    return {
        "epoch": state.get("epoch"),
        "offset": state.get("delivered_batches"),
        "offset_unit": "batches",
        "delivered_batches": state.get("delivered_batches"),
        "num_replicas": state.get("world_size", 1),
        "sampler_format": DALI_ITERATOR_FORMAT,
        "dali": {
            "version": state.get("dali_version"),
            "pipelines": len(checkpoints),
            "checkpoint_bytes": [
                c.numel() * c.element_size() if isinstance(c, torch.Tensor) else None
                for c in checkpoints
            ],
            "pending_reset": state.get("pending_reset"),
        },
    }


def manifest_summary(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of a sharded pause's manifest (a lone ``manifest.ckpt`` is described by these)."""
    files = manifest.get("files") if isinstance(manifest.get("files"), Mapping) else {}
    return {
        "kind": SHARDED_MANIFEST,
        "description": "sharded-pause manifest (the commit record of a sharded pause directory)",
        "format": manifest.get("format"),
        "generation": manifest.get("generation"),
        "completed_steps": manifest.get("completed_steps"),
        "steps": {"completed_steps": manifest.get("completed_steps")},
        "epoch": None,
        "world_size": manifest.get("world_size"),
        "sharded_models": manifest.get("models"),
        "files": dict(files),
        "files_bytes": sum(e.get("size", 0) for e in files.values() if isinstance(e, Mapping)),
        "rng": {"saved": False},
        "config_signature": None,
    }


# ---------------------------------------------------------------------- RNG


def _fingerprint(value: Any) -> str:
    hasher = hashlib.sha256()

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            hasher.update(
                item.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(item, Mapping):
            for key in sorted(item, key=str):
                hasher.update(str(key).encode())
                feed(item[key])
        elif isinstance(item, (list, tuple)):
            for element in item:
                feed(element)
        else:
            hasher.update(repr(item).encode())

    feed(value)
    return hasher.hexdigest()[:16]


def rng_summary(rng: Any, *, processes: int = 1) -> dict[str, Any]:
    """What a saved main-process RNG state holds (``{"saved": False}`` when there is none)."""
    if not isinstance(rng, Mapping):
        return {"saved": False}
    summary: dict[str, Any] = {
        "saved": True,
        "processes": processes,
        "fingerprint": _fingerprint(rng),
    }
    python = rng.get("python")
    if isinstance(python, Mapping) and isinstance(python.get("internal"), torch.Tensor):
        summary["python"] = f"Mersenne Twister, position {int(python['internal'][-1])}"
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, Mapping):
        summary["numpy"] = f"{numpy_state.get('kind')}, position {numpy_state.get('pos')}"
    torch_state = rng.get("torch")
    if isinstance(torch_state, torch.Tensor):
        summary["torch"] = (
            f"CPU generator, {torch_state.numel()} bytes, fingerprint {_fingerprint(torch_state)}"
        )
    cuda = rng.get("cuda")
    summary["cuda"] = (
        f"device {rng.get('cuda_device')}, {cuda.numel()} bytes"
        if isinstance(cuda, torch.Tensor)
        else "not saved"
    )
    return summary


# ---------------------------------------------------------------------- Lightning


def _lightning(content: Mapping[str, Any]) -> dict[str, Any]:
    entry = content.get(PAUSE_KEY) if isinstance(content.get(PAUSE_KEY), Mapping) else {}
    objects: dict[str, Any] = {}
    count, size = tensor_totals(content.get("state_dict"))
    objects["state_dict"] = {
        "tensors": count,
        "bytes": size,
        "shared": False,
        **module_keys(content.get("state_dict")),
        # A pause file's: the LightningModule's modes, saved under "module".
        **module_modes(_mapping(entry.get("module_modes")).get("module")),
    }
    for key, label in (("optimizer_states", "optimizer"), ("lr_schedulers", "lr_scheduler")):
        for number, state in enumerate(content.get(key) or []):
            count, size = tensor_totals(state)
            objects[f"{label} {number}"] = {"tensors": count, "bytes": size, "shared": False}
    fit_loop = (content.get("loops") or {}).get("fit_loop") or {}
    loader_states = (fit_loop.get("state_dict") or {}).get("combined_loader") or []
    rng_states = entry.get("rng") if isinstance(entry.get("rng"), list) else []
    summary: dict[str, Any] = {
        "lightning_version": content.get("pytorch-lightning_version"),
        "steps": {"global_step": _number(content.get("global_step"))},
        "epoch": _number(content.get("epoch")),
        "world_size": entry.get("world_size", 1) if entry else None,
        "config_signature": entry.get("config_signature") if entry else None,
        "objects": objects,
        "loaders": {
            f"train {number}": loader_position(s) for number, s in enumerate(loader_states)
        },
        "rng": rng_summary(rng_states[0] if rng_states else None, processes=len(rng_states) or 1),
        "callbacks": [str(name) for name in (content.get("callbacks") or {})],
        "hyper_parameters": [str(name) for name in (content.get("hyper_parameters") or {})],
    }
    if entry and "config" in entry:
        summary["config"] = entry["config"]
    return summary


# ---------------------------------------------------------------------- other files


def _number(value: Any) -> Any:
    """An int (or float) counter, also when stored as a 0-d tensor; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def _safetensors(header: Mapping[str, Any]) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, Mapping):
            continue
        start, end = (info.get("data_offsets") or [0, 0])[:2]
        entries[str(name)] = {
            "type": "Tensor",
            "dtype": info.get("dtype"),
            "shape": info.get("shape"),
            "tensors": 1,
            "bytes": end - start,
        }
    return {
        "steps": {},
        "epoch": None,
        "entries": entries,
        "metadata": header.get("__metadata__") or {},
        "rng": {"saved": False},
        "config_signature": None,
    }


def _entries(content: Any) -> dict[str, Any]:
    items = content.items() if isinstance(content, Mapping) else [("(value)", content)]
    entries: dict[str, Any] = {}
    found: dict[str, Any] = {}
    for name, value in items:
        count, size = tensor_totals(value)
        entry: dict[str, Any] = {"type": type(value).__name__, "tensors": count, "bytes": size}
        number = _number(value)
        if isinstance(number, (bool, int, float, str)) and len(repr(number)) <= _SHOWN_VALUE:
            entry["value"] = number
        entries[str(name)] = entry
        if (
            name in _PLAIN_COUNTERS
            and isinstance(number, (int, float))
            and not isinstance(number, bool)
        ):
            found[str(name)] = number
    steps = {name: found[name] for name in _PLAIN_COUNTERS if name in found}
    return {
        "steps": steps,
        "epoch": steps.get("epoch"),
        "entries": entries,
        "rng": {"saved": False},
        "config_signature": None,
    }


# ---------------------------------------------------------------------- directories


def _pause_steps(content: Any) -> int:
    """The step a mixin or Lightning pause file (or point) was written at."""
    kind = kind_of(content)
    steps = content.get("completed_steps") if kind == PAUSE else None
    if kind == LIGHTNING_PAUSE:
        steps = _number(content.get("global_step"))
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise CheckpointFormatError("neither a pause file nor a Lightning pause file")
    return steps


def describe_directory(
    path: str,
    *,
    key: bytes | None = None,
    read: Callable[[str], CheckpointFile],
    read_sharded: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """A resume-point directory: its points, pause files, finished marker, and its newest
    valid file described in full (``read`` verifies and loads one file). The points of a
    sharded model are directories: ``read_sharded`` verifies and describes one.

    Read-only: unlike ``resume_latest`` it removes no temp file and refuses nothing.

    Raises:
        CheckpointFormatError: the directory holds none of these (321).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedCheckpointWarning)
        found = candidates(path, key=key, steps_of=_pause_steps)
    skipped = [str(w.message) for w in caught if issubclass(w.category, SkippedCheckpointWarning)]
    marker = _finished_marker(path)
    if not found and not paths.is_url(path):
        sharded = committed_sharded(path, key=key)
        if sharded:
            return _sharded_directory(path, sharded, marker, read_sharded)
    if not found and marker is None:
        raise CheckpointFormatError(
            f"{path} is a directory without resume points, pause files or a finished marker"
        )
    summary: dict[str, Any] = {
        "path": path,
        "kind": DIRECTORY,
        "description": "resume-point directory",
        "points": [
            {"file": paths.basename(c.path), "completed_steps": c.completed_steps}
            for c in found
            if c.is_point
        ],
        "pause_files": [
            {"file": paths.basename(c.path), "completed_steps": c.completed_steps}
            for c in found
            if not c.is_point
        ],
        "finished": paths.basename(marker) if marker is not None else None,
        "newest": None,
    }
    for candidate in found:  # newest first; the first one a resume would take, as it takes it
        try:
            file = read(candidate.path)
            steps = _pause_steps(file.content) if candidate.is_point else None
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            skipped.append(f"skipped {candidate.path}: {error}")
            continue
        if steps is not None and steps != candidate.completed_steps:
            skipped.append(
                f"skipped {candidate.path}: it holds step {steps}, its name says "
                f"{candidate.completed_steps} (copied or renamed)"
            )
            continue
        summary["newest"] = describe_file(file, signature_verified=key is not None)
        break
    summary["skipped"] = skipped
    return summary


def _finished_marker(path: str) -> str | None:
    """The directory's finished marker (``run.finished``), else a finished marker of a
    pause file in it (``pause.ckpt.finished``: a ``ResumeCallback`` or ``pause_to`` file)."""
    marker = finished_marker_path(path)
    if paths.is_file(marker):
        return marker
    for name in paths.list_names(path):
        if is_finished_marker_name(name) and paths.is_file(paths.join(path, name)):
            return paths.join(path, name)
    return None


def _sharded_directory(
    path: str,
    sharded: list[tuple[int, str]],
    marker: str | None,
    read_sharded: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """The points and pause directories of a sharded model, newest first, and the one
    ``resume_latest`` takes (the newest committed one that verifies) described in full."""

    def entry(steps: int, where: str) -> dict[str, Any]:
        return {"file": paths.basename(where), "completed_steps": steps}

    summary: dict[str, Any] = {
        "path": path,
        "kind": DIRECTORY,
        "description": "resume-point directory (sharded model)",
        "points": [entry(s, p) for s, p in sharded if is_sharded_point(p)],
        "pause_files": [entry(s, p) for s, p in sharded if not is_sharded_point(p)],
        "finished": paths.basename(marker) if marker is not None else None,
        "newest": None,
    }
    skipped: list[str] = []
    for _, where in sharded:  # newest first, a pause before a point of its step
        try:
            summary["newest"] = read_sharded(where)
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            skipped.append(f"skipped {where}: {error}")
            continue
        break
    summary["skipped"] = skipped
    return summary
