"""Open, verify and restore a sharded pause directory.

Nothing is read unverified. ``open_pause`` checks the manifest (``load_checkpoint``:
digest, and signature with a key), then this rank's share of the generation's files
against the manifest's BLAKE3 digests, and loads every rank file (small: loaders,
RNG, extra state); no collective runs, so the caller announces a refusal to every
rank before anything changes. ``ShardedPause.restore`` then loads the shards through
DCP with a storage reader that reads each file whole, checks it against the manifest
again and serves DCP from those verified bytes (DCP's ``.metadata`` is a pickle), and
a load planner that reads DCP's byte entries weights-only.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem

from .. import distributed as _distributed
from .._pause_checks import check_layout, check_names
from ..durable import load_checkpoint
from ..errors import (
    CheckpointFormatError,
    ResumeStateMismatchError,
    UnsafeCheckpointError,
)
from ..state import PauseCheckpoint, ShardedFileEntry, ShardedManifest
from .detect import SHARDED_STATE, sharded_objects
from .manifest import (
    DCP_DIRECTORY,
    MANIFEST_NAME,
    check_manifest,
    rank_file,
    verify_bytes,
    verify_file,
)
from .write import dcp_state

__all__ = ["ShardedPause", "WeightsOnlyLoadPlanner", "open_pause"]


class _VerifiedFileSystem(FileSystem):
    """DCP's file access, reading each file whole and checking it against the manifest first."""

    def __init__(self, root: str, files: Mapping[str, ShardedFileEntry]) -> None:
        super().__init__()
        self._root = root
        self._files = files

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            raise PermissionError(f"a pause is opened read-only, not with mode {mode!r}")
        name = f"{DCP_DIRECTORY}/{os.path.relpath(os.fspath(path), self._root)}"
        entry = self._files.get(name)
        if entry is None:
            raise CheckpointFormatError(f"{path} is not in the pause's manifest")
        with open(path, "rb") as stream:
            data = stream.read()
        verify_bytes(data, entry, os.fspath(path))
        yield io.BytesIO(data)  # the bytes DCP parses are the bytes just verified


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, except that byte entries are read with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:
            raise UnsafeCheckpointError(
                f"DCP byte entry {read_item.dest_index.fqn}: {exc}"
            ) from exc
        # The default planner places the value (it knows the flattened key mapping); it
        # unpickles unrestricted, so it gets the value re-serialized: only what the
        # weights-only load above accepted.
        safe = io.BytesIO()
        torch.save(loaded, safe)
        safe.seek(0)
        super().load_bytes(read_item, safe)


@dataclass(frozen=True)
class ShardedPause:
    """A verified sharded pause, ready to check against a trainer and restore.

    Attributes:
        location: The pause directory, for messages.
        directory: Its committed generation.
        manifest: The verified manifest.
        checkpoint: Rank 0's pause checkpoint, every saved rank's loader, extra and
            RNG state under ``"distributed"`` when several ranks paused.
    """

    location: str
    directory: str
    manifest: ShardedManifest
    checkpoint: PauseCheckpoint

    @property
    def names(self) -> list[str]:
        """Object names restored through DCP."""
        return [
            name
            for model, optimizers in self.manifest["models"].items()
            for name in (model, *optimizers)
        ]

    def check_objects(self, objects: Mapping[str, Any]) -> None:
        """Refuse a trainer whose sharded objects differ from the paused ones.

        Raises:
            ResumeStateMismatchError: a saved model/optimizer is missing, of another
                kind or paired otherwise, or a model sharded now was paused unsharded.
        """
        where = self.location
        for model, optimizer_names in self.manifest["models"].items():
            module = objects.get(model)
            if not isinstance(module, torch.nn.Module):
                raise ResumeStateMismatchError(
                    f"{where}: sharded model {model!r} is not a module of this trainer"
                )
            ids = {id(p) for p in module.parameters()}
            for name in optimizer_names:
                optimizer = objects.get(name)
                if not isinstance(optimizer, torch.optim.Optimizer) or not all(
                    id(p) in ids for group in optimizer.param_groups for p in group["params"]
                ):
                    raise ResumeStateMismatchError(
                        f"{where}: {name!r} is not an optimizer over the parameters of {model!r}"
                    )
        paused = set(self.manifest["models"])
        for model in sharded_objects(objects).models:
            if model not in paused:
                raise ResumeStateMismatchError(
                    f"{where}: {model!r} has DTensor parameters but was paused unsharded"
                )
        self._check_model_shapes(objects)

    def _check_model_shapes(self, objects: Mapping[str, Any]) -> None:
        # DCP would find a differing model only while loading, after the first change.
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        root = os.path.join(self.directory, DCP_DIRECTORY)
        files = _VerifiedFileSystem(root, self.manifest["files"])
        with files.create_stream(os.path.join(root, ".metadata"), "rb") as stream:
            saved = pickle.load(stream).state_dict_metadata  # the verified bytes
        for model in self.manifest["models"]:
            prefix = f"models.{model}."
            tensors = {
                key[len(prefix) :]: entry
                for key, entry in saved.items()
                if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
            }
            live = {
                key: value
                for key, value in objects[model].state_dict().items()
                if isinstance(value, torch.Tensor)
            }
            where = f"{self.location}: sharded model {model!r}"
            check_names(where, tensors, live)
            for key, value in live.items():
                entry = tensors[key]
                if tuple(entry.size) != tuple(value.shape) or entry.properties.dtype != value.dtype:
                    raise ResumeStateMismatchError(
                        f"{where}: {key!r} is {entry.properties.dtype} {tuple(entry.size)} in the "
                        f"pause, {value.dtype} {tuple(value.shape)} in this model"
                    )

    def restore(self, objects: Mapping[str, Any]) -> None:
        """Load the sharded models and optimizers (collective under a process group)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        from .detect import ShardedObjects

        sharded = ShardedObjects({m: list(o) for m, o in self.manifest["models"].items()})
        state = dcp_state(objects, sharded)
        root = os.path.join(self.directory, DCP_DIRECTORY)
        reader = FileSystemReader(root)
        reader.fs = _VerifiedFileSystem(root, self.manifest["files"])
        dcp.load(
            state,
            storage_reader=reader,
            planner=WeightsOnlyLoadPlanner(),
            no_dist=not (dist.is_available() and dist.is_initialized()),
        )
        for name, optimizer_names in sharded.models.items():
            if optimizer_names:
                set_state_dict(
                    objects[name],
                    [objects[o] for o in optimizer_names],
                    model_state_dict=state["models"][name],
                    optim_state_dict=state["optimizers"][name],
                )
            else:
                set_model_state_dict(objects[name], state["models"][name])


def open_pause(path: str | os.PathLike[str], *, key: bytes | None) -> ShardedPause:
    """Verify a sharded pause's manifest and this rank's share of its files; load the rank files.

    Runs no collective: every rank verifies its share and the caller agrees.

    Raises:
        CheckpointFormatError: no committed manifest, or a malformed one or rank file.
        CheckpointCorruptedError: a file is missing or differs from the manifest
            (named).
        CheckpointSignatureError: ``key`` given and the manifest or a rank file is
            not signed with it.
    """
    location = os.path.abspath(os.fspath(path))
    manifest_path = os.path.join(location, MANIFEST_NAME)
    if not os.path.exists(manifest_path):
        raise CheckpointFormatError(
            f"{location} has no {MANIFEST_NAME}: "
            "a sharded pause that did not complete is never resumed"
        )
    manifest = check_manifest(load_checkpoint(manifest_path, key=key), manifest_path)
    directory = os.path.join(location, manifest["generation"])
    world, rank = _distributed.world()
    for index, name in enumerate(sorted(manifest["files"])):
        if index % world == rank:
            verify_file(os.path.join(directory, name), manifest["files"][name])
    ranks = []
    for saved in range(manifest["world_size"]):
        file = os.path.join(directory, rank_file(saved))
        state = load_checkpoint(file, key=key)
        check_layout(state, file)
        if state["completed_steps"] != manifest["completed_steps"]:
            raise CheckpointFormatError(
                f"{file} is at step {state['completed_steps']}, "
                f"the manifest at {manifest['completed_steps']}"
            )
        for name in (n for m, o in manifest["models"].items() for n in (m, *o)):
            if state["objects"].get(name) != SHARDED_STATE:
                raise CheckpointFormatError(
                    f"{file}: object {name!r} is not marked as written through DCP"
                )
        ranks.append(state)
    checkpoint = ranks[0]
    if len(ranks) > 1:
        checkpoint = _distributed.combined_pause(
            ranks[0],
            [{"loaders": s["loaders"], "extra": s["extra"], "rng": s["rng"]} for s in ranks],
        )
    return ShardedPause(location, directory, manifest, checkpoint)
