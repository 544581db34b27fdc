"""What ``trainer-resume inspect`` says about a sharded (FSDP2/DCP) pause directory.

The directory is opened by :func:`~trainer_resume.sharded.read.open_pause`, the reader a
resume uses: the manifest's digest (and signature with a key) is verified, then every
file of the committed generation against the manifest's BLAKE3 digest, and only then
are the rank files loaded weights-only. The shards themselves are not loaded: their
digests are all inspect needs.
"""

from __future__ import annotations

import os
from typing import Any

from ..checkpoint_files import read_checkpoint_file
from ..sharded.manifest import GENERATION, MANIFEST_NAME
from .describe import (
    FIRST_KEYS,
    SHARDED_MANIFEST,
    describe_file,
    loader_positions,
    manifest_summary,
    pause_summary,
)

__all__ = ["SHARDED_DIRECTORY", "SHARDED_MANIFEST", "describe_sharded", "is_sharded_pause"]

SHARDED_DIRECTORY = "sharded pause"


def is_sharded_pause(path: str) -> bool:
    """True for a directory holding a sharded pause's manifest or one of its generations."""
    if not os.path.isdir(path):
        return False
    return any(entry == MANIFEST_NAME or GENERATION.fullmatch(entry) for entry in os.listdir(path))


def describe_sharded(path: str, *, key: bytes | None) -> dict[str, Any]:
    """Verify a sharded pause directory as a resume would, and describe it.

    Raises:
        CheckpointFormatError: no committed manifest, or a malformed manifest or rank file (321).
        CheckpointCorruptedError: a file is missing or differs from its digest (322).
        CheckpointSignatureError: ``key`` given and a file is not signed with it (339).
        UnsafeCheckpointError: a rank file holds objects outside the weights-only set (328).
    """
    from ..sharded.read import open_pause  # imports torch.distributed.checkpoint

    pause = open_pause(path, key=key)
    manifest_file = read_checkpoint_file(os.path.join(pause.location, MANIFEST_NAME), key=key)
    header = describe_file(manifest_file, signature_verified=key is not None)
    summary: dict[str, Any] = {"path": path, "file_bytes": 0}
    summary.update(manifest_summary(pause.manifest))
    summary.update(
        kind=SHARDED_DIRECTORY,
        description="sharded pause directory (FSDP2/DCP)",
        verified=True,
        integrity=header["integrity"],
        manifest_format=summary.pop("format"),
        files_verified="every file matches its BLAKE3 digest in the manifest",
    )
    summary["file_bytes"] = summary["files_bytes"] + manifest_file.file_bytes
    described = pause_summary(pause.checkpoint)
    sharded = {n for m, o in pause.manifest["models"].items() for n in (m, *o)}
    for name in sharded:
        if name in described["objects"]:
            # Its tensors are in the DCP shards, whose digests were checked but not loaded.
            entry = described["objects"][name]
            entry.update(tensors=None, bytes=None, shared=False)
            for key in ("keys", "first_keys"):  # the plain entry's; DCP's index gives them
                entry.pop(key, None)
    for name in pause.manifest["models"]:
        # A model's names are in DCP's index (canonical, as get_model_state_dict gives them).
        prefix = f"models.{name}."
        keys = [
            key[len(prefix) :]
            for key in pause.metadata.state_dict_metadata
            if key.startswith(prefix)
        ]
        if name in described["objects"] and keys:
            described["objects"][name].update(keys=len(keys), first_keys=keys[:FIRST_KEYS])
    summary.update(described)
    summary["world_size"] = pause.manifest["world_size"]
    summary["loaders"] = loader_positions(pause.checkpoint.get("loaders"), summary["world_size"])
    return summary
