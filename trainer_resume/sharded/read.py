"""Open, verify and restore a sharded pause directory.

Nothing is read unverified and nothing is unpickled with the full pickler.
``open_pause`` checks the manifest (``load_checkpoint``: digest, and signature with
a key), then this rank's share of the generation's files against the manifest's
BLAKE3 digests, loads every rank file (small: loaders, RNG, extra state) and reads
DCP's ``.metadata`` (verified, through the allowlist of :mod:`._metadata`); no
collective runs, so the caller announces a refusal to every rank before anything
changes.

The restore has two phases, so that a failure while DCP reads (a shard rewritten
after it was verified, a byte entry refused) never leaves some ranks restored:
``ShardedPause.load`` has DCP read every shard into fresh tensors of the live
tensors' shapes and placements (a collective; the live state is not touched, and
every rank learns of a failure on any rank), then ``ShardedPause.apply`` copies
them into the models and optimizers. DCP reads through a storage reader that
reads each file whole, checks it against the manifest again and serves DCP from
those verified bytes, hands DCP the index already read (never DCP's own
``pickle.load``), and a load planner that reads DCP's byte entries weights-only.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem

from .. import distributed as _distributed
from .._module_names import (
    ModuleNames,
    canonical_parameters,
    describe_key_difference,
    match_names,
)
from ..checks.pause_state import check_layout
from ..checks.weights_only import refusal_reason
from ..durable import load_checkpoint
from ..errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    ResumeError,
    ResumeStateMismatchError,
    UnsafeCheckpointError,
)
from ..state import (
    GRADIENTS_KEY,
    RANK_BUFFERS_KEY,
    SHARDED_WINDOW_KEY,
    PauseCheckpoint,
    ShardedFileEntry,
    ShardedManifest,
    map_tensors,
)
from ._metadata import load_metadata, storage_files
from .detect import SHARDED_STATE, ShardedObjects, sharded_objects
from .manifest import (
    DCP_DIRECTORY,
    MANIFEST_NAME,
    check_manifest,
    rank_file,
    verify_bytes,
    verify_file,
)
from .write import dcp_failure, dcp_state

__all__ = ["ShardedPause", "WeightsOnlyLoadPlanner", "open_pause"]

_METADATA = f"{DCP_DIRECTORY}/.metadata"


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
        yield io.BytesIO(_read_verified(os.fspath(path), entry))


def _read_verified(path: str, entry: ShardedFileEntry) -> bytes:
    # The bytes parsed are the bytes just verified: nothing can change them in between.
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        raise CheckpointCorruptedError(f"{path} is missing") from None
    verify_bytes(data, entry, path)
    return data


class _VerifiedReader(FileSystemReader):
    """DCP's file reader over the verified files, handing DCP the index read through the allowlist."""

    def __init__(self, root: str, files: Mapping[str, ShardedFileEntry], metadata: Any) -> None:
        super().__init__(root)
        self.fs = _VerifiedFileSystem(root, files)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        # Replaces FileSystemReader.read_metadata, which would pickle.load the file.
        from torch.distributed.checkpoint.metadata import StorageMeta

        if kwargs.get("rank") is not None:
            raise CheckpointFormatError("a pause has one .metadata, no per-rank ones")
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, except that byte entries are read with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(
                f"DCP byte entry {read_item.dest_index.fqn}: {refusal_reason(exc)}"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - a malformed entry
            raise CheckpointFormatError(
                f"DCP byte entry {read_item.dest_index.fqn}: {type(exc).__name__}: {exc}"
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
        metadata: DCP's index of the shards (``Metadata``), read verified through
            the allowlist.
    """

    location: str
    directory: str
    manifest: ShardedManifest
    checkpoint: PauseCheckpoint
    metadata: Any

    @property
    def names(self) -> list[str]:
        """Object names restored through DCP."""
        return [
            name
            for model, optimizers in self.manifest["models"].items()
            for name in (model, *optimizers)
        ]

    def model_state(self, model: str) -> dict[str, Any]:
        """Sharded model ``model``'s full state dict, read in this process alone (no
        process group): every shard through the verified reader, byte entries
        weights-only. For export; a resume reads through :meth:`load` and :meth:`apply`.

        Raises:
            ValueError: ``model`` is not a sharded model of the pause.
            CheckpointCorruptedError, CheckpointFormatError, UnsafeCheckpointError: as
                :func:`open_pause`, for the shards read now.
        """
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        if model not in self.manifest["models"]:
            raise ValueError(
                f"{self.location} has no sharded model {model!r}; its models: "
                f"{', '.join(map(repr, self.manifest['models']))}"
            )
        prefix = f"models.{model}."
        state: dict[str, Any] = {}
        for fqn, entry in self.metadata.state_dict_metadata.items():
            if not fqn.startswith(prefix):
                continue
            if isinstance(entry, TensorStorageMetadata):
                state[fqn[len(prefix) :]] = torch.empty(entry.size, dtype=entry.properties.dtype)
            else:
                state[fqn[len(prefix) :]] = b""  # a byte entry: its weights-only load replaces it
        wrapped = {"models": {model: state}}
        with warnings.catch_warnings():  # DCP's note that it loads in one process
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            error = self._read_shards(
                wrapped, f"reading sharded model {model!r}", "nothing was written", no_dist=True
            )
        if error is not None:
            raise error
        return wrapped["models"][model]

    def _read_shards(
        self, state: Any, what: str, outcome: str, *, no_dist: bool
    ) -> ResumeError | None:
        """DCP's load of ``state`` through the verified reader, byte entries weights-only:
        the error it raised (on any rank), as a catalogue error, or ``None``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            # DCP reports a failure on any rank to every rank itself (CheckpointException,
            # a BaseException); the caller's exchange covers anything raised outside it.
            dcp.load(
                state,
                storage_reader=_VerifiedReader(
                    os.path.join(self.directory, DCP_DIRECTORY),
                    self.manifest["files"],
                    self.metadata,
                ),
                planner=WeightsOnlyLoadPlanner(),
                no_dist=no_dist,
            )
        except (Exception, CheckpointException) as exc:
            return _read_error(self.location, what, exc, outcome)
        return None

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
        # DCP's names are canonical (get_model_state_dict): the live names are compared
        # as canonical names too, however the model's blocks are compiled or wrapped.
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        saved = self.metadata.state_dict_metadata
        for model in self.manifest["models"]:
            names = {key for key, _ in canonical_parameters(objects[model])}
            gradients = _saved_gradients(saved, model)
            matched = match_names(gradients, names)
            unknown = [key for key in gradients if key not in matched]
            if unknown:
                raise ResumeStateMismatchError(
                    f"{self.location}: sharded model {model!r} has gradients saved for "
                    f"{unknown[:3]}, which are not its parameters"
                )
        for model in self.manifest["models"]:
            prefix = f"models.{model}."
            tensors = {
                key[len(prefix) :]: entry
                for key, entry in saved.items()
                if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
            }
            canonical = ModuleNames(objects[model]).canonical
            live = {
                canonical(key): value
                for key, value in objects[model].state_dict().items()
                if isinstance(value, torch.Tensor)
            }
            where = f"{self.location}: sharded model {model!r}"
            if set(tensors) != set(live):
                difference = describe_key_difference(
                    [key for key in tensors if key not in live],
                    [key for key in live if key not in tensors],
                )
                raise ResumeStateMismatchError(f"{where}: {difference}")
            for key, value in live.items():
                entry = tensors[key]
                if tuple(entry.size) != tuple(value.shape) or entry.properties.dtype != value.dtype:
                    raise ResumeStateMismatchError(
                        f"{where}: {key!r} is {entry.properties.dtype} {tuple(entry.size)} in the "
                        f"pause, {value.dtype} {tuple(value.shape)} in this model"
                    )

    def load(self, objects: Mapping[str, Any]) -> dict[str, Any]:
        """Every rank: read the shards into fresh tensors; nothing live changes (collective).

        The tensors have the live ones' shapes, dtypes, devices and placements, so this
        costs one more copy of this rank's shards of the models and optimizers until
        :meth:`apply` returns. Under a process group every rank calls it, and every
        rank raises when any rank failed.

        Returns:
            The models' and optimizers' states as read, for :meth:`apply`.

        Raises:
            ResumeError: reading failed on some rank: the error raised there (322 for a
                file that differs from the manifest, 328 for a byte entry outside the
                weights-only set...), or ``CheckpointCorruptedError`` for DCP's own
                failures; the live state is untouched on every rank.
        """
        collective = _distributed.is_distributed()
        action = "resume()"
        staged: dict[str, Any] = {}
        error: BaseException | None = None
        try:
            # A fresh optimizer's state is made here by a step with zero gradients, which
            # get_state_dict takes only while every gradient is None: the gradients saved
            # (a pause inside an accumulation window) are read into buffers of their own.
            live = dcp_state(objects, self._sharded())
            live.pop(GRADIENTS_KEY, None)
            gradients = self._saved_gradient_buffers(objects)
            staged = map_tensors(live, torch.empty_like, {})  # aliases (tied weights) stay aliases
            if gradients:
                staged[GRADIENTS_KEY] = gradients
        except Exception as exc:  # noqa: BLE001 - announced to every rank before DCP's collectives
            error = _read_error(self.location, "preparing the shards' tensors", exc)
        if collective:
            _distributed.exchange(None, action, error)
        elif error is not None:
            raise error
        error = self._read_shards(
            staged,
            "reading the shards",
            _NOTHING_RESTORED,
            no_dist=not (dist.is_available() and dist.is_initialized()),
        )
        if collective:
            _distributed.exchange(None, action, error)
        elif error is not None:
            raise error
        return staged

    def apply(self, objects: Mapping[str, Any], staged: Mapping[str, Any]) -> None:
        """Copy the states :meth:`load` read into the sharded models and optimizers.

        The sharded parameters get the gradients the pause held (``None`` where it
        held none), after the optimizers' states: setting those needs no gradient.
        """
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        for name, optimizer_names in self.manifest["models"].items():
            if optimizer_names:
                set_state_dict(
                    objects[name],
                    [objects[o] for o in optimizer_names],
                    model_state_dict=staged["models"][name],
                    optim_state_dict=staged["optimizers"][name],
                )
            else:
                set_model_state_dict(objects[name], staged["models"][name])
        gradients = staged.get(GRADIENTS_KEY, {})
        for name in self.manifest["models"]:
            parameters = canonical_parameters(objects[name])
            read = _by_parameter(gradients.get(name, {}), parameters)
            for key, param in parameters:
                param.grad = read.get(key)

    def _saved_gradient_buffers(self, objects: Mapping[str, Any]) -> dict[str, Any]:
        # A buffer of each parameter's layout (a DTensor sharded as it) for each gradient saved.
        # Keyed as saved: DCP reads each gradient by its saved name.
        saved = self.metadata.state_dict_metadata
        buffers: dict[str, Any] = {}
        for model in self.manifest["models"]:
            parameters = dict(canonical_parameters(objects[model]))
            for key, name in match_names(_saved_gradients(saved, model), parameters).items():
                param = parameters[name]
                buffers.setdefault(model, {})[key] = torch.empty_like(param.detach())
        return buffers

    def _sharded(self) -> ShardedObjects:
        return ShardedObjects({m: list(o) for m, o in self.manifest["models"].items()})


def _by_parameter(
    read: Mapping[str, Any], parameters: list[tuple[str, torch.nn.Parameter]]
) -> dict[str, Any]:
    """Gradients read under their saved names, keyed by the canonical parameter names (a pause
    of an earlier release saved them under the wrappers' names)."""
    names = {key for key, _ in parameters}
    return {name: read[key] for key, name in match_names(read, names).items()}


def _saved_gradients(metadata: Mapping[str, Any], model: str) -> list[str]:
    # DCP flattens nested keys with dots: "gradients.<model>.<parameter name>".
    prefix = f"{GRADIENTS_KEY}.{model}."
    return [key[len(prefix) :] for key in metadata if key.startswith(prefix)]


_NOTHING_RESTORED = "nothing was restored"


def _read_error(
    location: str, what: str, exc: BaseException, outcome: str = _NOTHING_RESTORED
) -> ResumeError:
    """A failure while the shards were read, as a catalogue error naming the rank it
    happened on, and ``outcome`` (what the failure left as it was)."""
    rank, cause = dcp_failure(exc)
    on = f" on rank {rank}" if rank is not None else ""
    if isinstance(cause, ResumeError):
        error: ResumeError = type(cause)(
            f"{location}: {what} failed{on}: {cause.detail or cause.message}; {outcome}"
        )
    else:
        error = CheckpointCorruptedError(
            f"{location}: {what} failed{on} ({type(cause).__name__}: {cause}); {outcome}"
        )
    error.__cause__ = exc
    return error


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
        try:
            state = load_checkpoint(file, key=key)
        except FileNotFoundError:  # verified by another rank, gone since
            raise CheckpointCorruptedError(f"{file} is missing") from None
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
            [
                {
                    key: s[key]
                    for key in ("loaders", "extra", "rng", GRADIENTS_KEY, RANK_BUFFERS_KEY)
                    if key in s
                }
                for s in ranks
            ],
            [_distributed.config_of(s) for s in ranks],
        )
    if any(state.get(SHARDED_WINDOW_KEY) for state in ranks):  # any rank's marks them all
        checkpoint = checkpoint.copy()
        checkpoint[SHARDED_WINDOW_KEY] = True
    return ShardedPause(
        location, directory, manifest, checkpoint, _read_metadata(directory, manifest)
    )


def _read_metadata(directory: str, manifest: ShardedManifest) -> Any:
    """DCP's index, verified and read through the allowlist; every file it names is in the manifest."""
    path = os.path.join(directory, _METADATA)
    metadata = load_metadata(_read_verified(path, manifest["files"][_METADATA]), path)
    for name in sorted(storage_files(metadata)):
        if f"{DCP_DIRECTORY}/{name}" not in manifest["files"]:
            raise CheckpointCorruptedError(
                f"{path} names {DCP_DIRECTORY}/{name}, which the manifest does not list"
            )
    return metadata
