"""``trainer-resume export``: a verified file's weights (or whole state) for other tools."""

from __future__ import annotations

import os
from typing import TextIO

from ..export import export_checkpoint
from ..resume_points.files import point_steps
from ._common import EXIT_OK, UsageError, format_bytes, read_key_file

__all__ = ["run_export"]

_SAFETENSORS_SUFFIX = ".safetensors"


def run_export(
    path: str,
    target: str,
    *,
    format: str | None,
    what: str,
    object: str | None,
    key_file: str | None,
    out: TextIO,
) -> int:
    """Export ``path`` to ``target`` and print one line saying what was written.

    ``format=None`` picks safetensors for a ``.safetensors`` target, else torch.

    Raises:
        UsageError: the options cannot be applied to this file (no single model,
            an unknown object, safetensors without the package...).
    """
    key = read_key_file(key_file) if key_file is not None else None
    if format is None:
        format = "safetensors" if target.endswith(_SAFETENSORS_SUFFIX) else "torch"
    try:
        result = export_checkpoint(
            path,
            target,
            format=format,  # type: ignore[arg-type]
            what=what,  # type: ignore[arg-type]
            object=object,
            key=key,
        )
    except (ValueError, TypeError, ImportError) as error:
        raise UsageError(str(error)) from error
    content = "the whole state" if what == "all" else "model weights"
    if result.what == "all" and result.kind in ("lightning", "lightning pause"):
        content = "a plain Lightning checkpoint"
    source = "" if result.source == "(whole file)" else f" from {result.source!r}"
    kind = "torch.save" if result.format == "torch" else "safetensors"
    read = result.kind if result.kind == "sharded pause" else f"{result.kind} file"
    if point_steps(path) is not None:  # a resume point is a pause file by its format
        read = "Lightning resume point" if result.kind.startswith("lightning") else "resume point"
    print(
        f"wrote {os.fspath(result.out)}: {content}{source} of the {read}, "
        f"{result.tensors} tensors, {format_bytes(result.tensor_bytes)}, as a {kind} file "
        f"of {format_bytes(result.file_bytes)}",
        file=out,
    )
    return EXIT_OK
