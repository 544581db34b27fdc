"""Write a sharded pause directory: every rank its own shards and state, rank 0 the commit.

The order is the durability argument (see :mod:`.manifest` for the layout):

1. rank 0 creates the pause directory and a fresh generation directory beside the
   committed one, and every rank learns its name;
2. ``torch.distributed.checkpoint`` writes each rank's shards (each file fsynced) and
   rank 0 its ``.metadata``;
3. every rank writes its own ``rank-<r>.ckpt`` through ``save_checkpoint`` and digests
   (and fsyncs) its share of the generation's files;
4. rank 0 fsyncs the generation's directories and replaces ``manifest.ckpt`` with one
   naming the generation and every file's digest: the commit, one atomic rename;
5. only then does rank 0 remove older generations.

A rank killed before step 4 ends leaves the previous manifest, which names the
previous generation, untouched: that pause stays resumable and the partial one is
never read. Each step's failure is announced to every rank before anyone goes on.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from .. import distributed as _distributed
from .._atomic import fsync_directory
from .._module_names import canonical_parameters
from ..durable import save_checkpoint
from ..errors import CheckpointWriteError
from ..state import (
    GRADIENTS_KEY,
    SHARDED_FORMAT,
    PauseCheckpoint,
    ShardedFileEntry,
    ShardedManifest,
    map_tensors,
)
from .detect import ShardedObjects
from .manifest import (
    DCP_DIRECTORY,
    GENERATION,
    MANIFEST_NAME,
    file_entry,
    generation_name,
    rank_file,
)

__all__ = ["dcp_failure", "dcp_state", "host_copy", "retire_pause", "write_pause"]


def dcp_state(objects: Mapping[str, Any], sharded: ShardedObjects) -> dict[str, Any]:
    """The sharded models' and optimizers' state dicts as DCP takes them (DTensors, not gathered).

    The tensors are the live ones (no copy): DCP reads them on save and loads into
    them in place on resume. The sharded parameters' gradients, where present (inside
    a gradient-accumulation window, or with ``zero_grad()`` at a window's start), are
    under ``"gradients"``: model name -> parameter name -> its ``.grad`` (a DTensor
    sharded as the parameter). Every name is canonical, as ``get_model_state_dict``
    names the parameters (no ``_orig_mod.``, ``module.`` or
    ``_checkpoint_wrapped_module.``).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    models: dict[str, Any] = {}
    optimizers: dict[str, Any] = {}
    gradients: dict[str, Any] = {}
    for name, optimizer_names in sharded.models.items():
        model = objects[name]
        if optimizer_names:
            models[name], optimizers[name] = get_state_dict(
                model, [objects[o] for o in optimizer_names]
            )
        else:
            models[name] = get_model_state_dict(model)
        grads = {key: p.grad for key, p in canonical_parameters(model) if p.grad is not None}
        if grads:
            gradients[name] = grads
    state = {"models": models, "optimizers": optimizers}
    if gradients:
        state[GRADIENTS_KEY] = gradients
    return state


def host_copy(state: Any) -> Any:
    """A copy of a :func:`dcp_state` in host memory that later steps cannot change.

    Each DTensor becomes a DTensor over a CPU copy of its local shard (same mesh,
    placements, global shape and stride), each other tensor a CPU copy; aliases stay
    aliases. What a resume point writes in the background while training goes on.
    """
    from torch.distributed.tensor import DTensor

    def copy(tensor: Any) -> Any:
        if isinstance(tensor, DTensor):
            local = tensor.to_local().detach().to("cpu", copy=True)
            return DTensor.from_local(
                local,
                tensor.device_mesh,
                tensor.placements,
                run_check=False,
                shape=tensor.shape,
                stride=tensor.stride(),
            )
        return tensor.detach().to("cpu", copy=True)

    return map_tensors(state, copy, {})


def dcp_failure(exc: BaseException) -> tuple[int | None, BaseException]:
    """The rank and exception behind a DCP failure (``CheckpointException`` holds one per rank).

    DCP gathers every rank's exception and raises them on all ranks alike, so each
    rank names the same first failure. Anything else is returned as it is.
    """
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ == "CheckpointException" and isinstance(failures, dict) and failures:
        rank = min(failures)
        cause = failures[rank]
        return rank, cause[0] if isinstance(cause, tuple) else cause
    return None, exc


def _write_error(target: str, what: str, exc: BaseException) -> CheckpointWriteError:
    rank, cause = dcp_failure(exc)
    if isinstance(cause, CheckpointWriteError) and cause is exc:
        return cause
    on = f" on rank {rank}" if rank is not None else ""
    error = CheckpointWriteError(
        f"{target}: {what} failed{on} ({type(cause).__name__}: {cause}); the previous pause is intact"
    )
    error.__cause__ = exc
    return error


def _new_generation(target: str, completed_steps: int) -> str:
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CheckpointWriteError(
            f"{target} is a file; a sharded pause is a directory: pause to another path "
            "(or remove that file)"
        )
    if not os.path.isdir(target):
        os.makedirs(target)
        fsync_directory(os.path.dirname(target))
    name = generation_name(completed_steps, secrets.token_hex(8))
    os.makedirs(os.path.join(target, name, DCP_DIRECTORY))
    return name


def _share(names: list[str], world: int, rank: int) -> list[str]:
    # Each file is digested (and verified on resume) by one rank: the work is split.
    return [name for index, name in enumerate(sorted(names)) if index % world == rank]


def write_pause(
    path: str | os.PathLike[str],
    checkpoint: PauseCheckpoint,
    objects: Mapping[str, Any],
    sharded: ShardedObjects,
    *,
    key: bytes | None,
    state: Mapping[str, Any] | None = None,
) -> tuple[ShardedManifest, Any]:
    """Every rank: write this rank's part of a sharded pause and take part in its commit.

    Args:
        path: The pause directory (created when missing).
        checkpoint: This rank's pause checkpoint, the sharded objects' states left out.
        objects: The resume objects.
        sharded: Which of them go through DCP.
        key: The trainer's signing key for the rank files and the manifest.
        state: The sharded state to write (a resume point's :func:`host_copy`);
            default: the live objects' :func:`dcp_state`.

    Returns:
        The committed manifest and DCP's index of the shards (``Metadata``), as written.

    Raises:
        CheckpointWriteError: on every rank when any rank's part failed; the previous
            pause at ``path`` is still the committed one.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    target = os.path.abspath(os.fspath(path))
    world, rank = dist.get_world_size(), dist.get_rank()
    action = "pause()"
    generation, error = None, None
    if rank == 0:
        try:
            generation = _new_generation(target, checkpoint["completed_steps"])
        except Exception as exc:  # noqa: BLE001 - announced to every rank by exchange()
            error = _write_error(target, "creating the pause directory", exc)
    generation = _distributed.exchange(generation, action, error)[0]
    directory = os.path.join(target, generation)
    shards = os.path.join(directory, DCP_DIRECTORY)
    try:
        # DCP announces a failure on any rank to every rank itself, as a
        # CheckpointException: a BaseException, which `except Exception` would miss.
        metadata = dcp.save(
            dict(state) if state is not None else dcp_state(objects, sharded),
            storage_writer=dcp.FileSystemWriter(shards, sync_files=True),
            process_group=_distributed.current_group(),
        )
    except (Exception, CheckpointException) as exc:
        raise _write_error(target, "writing the shards", exc) from exc
    names = sorted(
        {f"{DCP_DIRECTORY}/{info.relative_path}" for info in metadata.storage_data.values()}
    )
    names.append(f"{DCP_DIRECTORY}/.metadata")
    entries: dict[str, ShardedFileEntry] = {}
    error = None
    try:
        own = rank_file(rank)
        save_checkpoint(checkpoint, os.path.join(directory, own), key=key)
        entries[own] = file_entry(os.path.join(directory, own))
        for name in _share(names, world, rank):
            entries[name] = file_entry(os.path.join(directory, name))
    except Exception as exc:  # noqa: BLE001 - announced to every rank by exchange()
        error = _write_error(target, f"writing rank {rank}'s files", exc)
    files: dict[str, ShardedFileEntry] = {}
    for part in _distributed.exchange(entries, action, error):
        files.update(part)
    manifest: ShardedManifest = {
        "format": SHARDED_FORMAT,
        "generation": generation,
        "world_size": world,
        "completed_steps": checkpoint["completed_steps"],
        "models": {name: list(optimizers) for name, optimizers in sharded.models.items()},
        "files": dict(sorted(files.items())),
    }

    def commit() -> None:
        fsync_directory(shards)
        fsync_directory(directory)
        save_checkpoint(manifest, os.path.join(target, MANIFEST_NAME), key=key)

    _distributed.commit(commit, target)
    if rank == 0:
        _remove_other_generations(target, generation)
    return manifest, metadata


def retire_pause(target: str) -> bool:
    """Remove the sharded pause in directory ``target`` (its manifest first, then its
    generations) once the run's finished marker there is durable; ``False`` where
    ``target`` holds no sharded pause. A crash part-way leaves the marker, which wins."""
    manifest = os.path.join(target, MANIFEST_NAME)
    if not os.path.isfile(manifest):
        return False
    os.remove(manifest)
    fsync_directory(target)
    _remove_other_generations(target, keep="")
    return True


def _remove_other_generations(target: str, keep: str) -> None:
    # After the commit only: until then the previous generation is the pause.
    removed = False
    for entry in os.listdir(target):
        if entry != keep and GENERATION.fullmatch(entry):
            shutil.rmtree(os.path.join(target, entry), ignore_errors=True)
            removed = True
    if removed:
        try:
            fsync_directory(target)
        except OSError:
            pass  # a removal that is not durable only leaves garbage for the next pause to remove
