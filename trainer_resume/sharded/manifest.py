"""The layout of a sharded pause directory and its commit manifest.

::

    <pause>/                    the path given to pause() / resume()
      manifest.ckpt             the commit: a save_checkpoint file (atomic, signed with
                                the trainer's key when one is set) naming the generation
                                and the BLAKE3 digest and size of each of its files
      gen-<steps>-<token>/      one generation: a complete pause
        rank-<r>.ckpt           rank r's loaders, RNG, extra state and unsharded objects
        dcp/.metadata           torch.distributed.checkpoint's index (a pickle)
        dcp/__<r>_<i>.distcp    the shards, written by each rank for its own part

A generation is written beside the committed one; replacing ``manifest.ckpt`` (one
rename) switches to it, and only then are older generations removed. A generation
that no manifest names (a pause killed part-way) is never read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import blake3

from ..errors import CheckpointCorruptedError, CheckpointFormatError
from ..state import SHARDED_FORMAT, ShardedFileEntry, ShardedManifest

__all__ = [
    "DCP_DIRECTORY",
    "MANIFEST_NAME",
    "check_manifest",
    "file_entry",
    "generation_name",
    "is_pause_directory",
    "rank_file",
    "verify_bytes",
    "verify_file",
]

MANIFEST_NAME = "manifest.ckpt"
DCP_DIRECTORY = "dcp"
GENERATION = re.compile(r"gen-\d+-[0-9a-f]{16}")
# A file name inside a generation: no absolute path, no "..", no hidden tricks.
_FILE_NAME = re.compile(r"(rank-\d+\.ckpt|dcp/[A-Za-z0-9_.\-]+)")
_CHUNK = 1 << 20


def is_pause_directory(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory (a sharded pause, committed or not)."""
    return os.path.isdir(path)


def generation_name(completed_steps: int, token: str) -> str:
    """Directory name of a new generation (``token``: 16 hex digits agreed by all ranks)."""
    return f"gen-{completed_steps}-{token}"


def rank_file(rank: int) -> str:
    """Name of rank ``rank``'s state file inside a generation."""
    return f"rank-{rank}.ckpt"


def file_entry(path: str) -> ShardedFileEntry:
    """Digest a written file and fsync it (a no-op cost when its writer synced it already)."""
    hasher = blake3.blake3()
    size = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"size": size, "blake3": hasher.hexdigest()}


def verify_bytes(data: bytes, entry: ShardedFileEntry, where: str) -> None:
    """Raise ``CheckpointCorruptedError`` unless ``data`` has the manifest's size and digest."""
    if len(data) != entry["size"]:
        raise CheckpointCorruptedError(
            f"{where} has {len(data)} bytes, the manifest says {entry['size']}"
        )
    if blake3.blake3(data).hexdigest() != entry["blake3"]:
        raise CheckpointCorruptedError(f"{where}: BLAKE3 digest differs from the manifest")


def verify_file(path: str, entry: ShardedFileEntry) -> None:
    """Check a file against its manifest entry without keeping its bytes.

    Raises:
        CheckpointCorruptedError: missing, another size, or another digest (names ``path``).
    """
    try:
        found = os.stat(path).st_size
    except FileNotFoundError:
        raise CheckpointCorruptedError(f"{path} is missing") from None
    if found != entry["size"]:
        raise CheckpointCorruptedError(
            f"{path} has {found} bytes, the manifest says {entry['size']}"
        )
    hasher = blake3.blake3()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            hasher.update(chunk)
    if hasher.hexdigest() != entry["blake3"]:
        raise CheckpointCorruptedError(f"{path}: BLAKE3 digest differs from the manifest")


def check_manifest(manifest: Any, where: str) -> ShardedManifest:
    """Validate a loaded manifest's layout (names, types, one file per rank, DCP metadata).

    Raises:
        CheckpointFormatError: anything missing or malformed.
    """

    def bad(what: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{where}: {what}")

    if not isinstance(manifest, Mapping) or manifest.get("format") != SHARDED_FORMAT:
        found = manifest.get("format") if isinstance(manifest, Mapping) else type(manifest).__name__
        raise bad(f"format {found!r}, expected {SHARDED_FORMAT!r}")
    generation, world, steps = (
        manifest.get("generation"),
        manifest.get("world_size"),
        manifest.get("completed_steps"),
    )
    if not isinstance(generation, str) or not GENERATION.fullmatch(generation):
        raise bad(f"generation {generation!r} is not a generation directory name")
    for name, value in (("world_size", world), ("completed_steps", steps)):
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < (1 if name == "world_size" else 0)
        ):
            raise bad(f"{name} is {value!r}")
    models, files = manifest.get("models"), manifest.get("files")
    if not isinstance(models, dict) or not all(
        isinstance(m, str) and isinstance(o, list) and all(isinstance(x, str) for x in o)
        for m, o in models.items()
    ):
        raise bad("models is not a mapping of model name to optimizer names")
    if not isinstance(files, dict):
        raise bad("files is not a mapping")
    for name, entry in files.items():
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or ".." in name:
            raise bad(f"file name {name!r} is not a file of a generation")
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get("blake3"), str)
        ):
            raise bad(f"file {name!r} lacks an int size and a str blake3 digest")
    needed = {rank_file(rank) for rank in range(world)} | {f"{DCP_DIRECTORY}/.metadata"}
    if not needed <= set(files):
        raise bad(f"files lack {sorted(needed - set(files))}")
    return manifest  # type: ignore[return-value]
