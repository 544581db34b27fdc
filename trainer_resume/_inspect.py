"""``trainer-resume inspect``: verify a checkpoint file and summarise what it holds."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, TextIO

import torch

from ._cli_table import format_bytes, format_table
from .cli import UsageError
from .durable import load_checkpoint, read_checkpoint_header, validate_key
from .state import PAUSE_FORMAT

__all__ = ["InspectUsageError", "run_inspect", "summarize"]


class InspectUsageError(UsageError):
    """An option of ``inspect`` cannot be used (e.g. an empty key file)."""


def _tensors(value: Any, seen: set[int]) -> tuple[int, int]:
    """Count and bytes of the distinct tensors in nested state."""
    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            return 0, 0
        seen.add(id(value))
        return 1, value.numel() * value.element_size()
    items: Any = ()
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    count = size = 0
    for item in items:
        c, s = _tensors(item, seen)
        count, size = count + c, size + s
    return count, size


def _position(state: Any) -> dict[str, Any]:
    """consumed / cycle / offset of a loader state (kept by its sampler or batch sampler)."""
    found: dict[str, Any] = {}
    if isinstance(state, Mapping):
        for key in ("consumed", "cycle", "offset", "num_replicas"):
            if key in state:
                found[key] = state[key]
        if len(found) < 3:
            for key in ("sampler", "batch_sampler"):
                inner = _position(state.get(key))
                if inner:
                    found = {**inner, **found}
                    break
    return found


def _fingerprint(value: Any) -> str:
    hasher = hashlib.sha256()

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            hasher.update(item.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
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


def _rng_summary(rng: Any) -> dict[str, Any]:
    if not isinstance(rng, Mapping):
        return {}
    summary: dict[str, Any] = {"fingerprint": _fingerprint(rng)}
    python = rng.get("python")
    if isinstance(python, Mapping) and isinstance(python.get("internal"), torch.Tensor):
        summary["python"] = f"Mersenne Twister, position {int(python['internal'][-1])}"
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, Mapping):
        summary["numpy"] = f"{numpy_state.get('kind')}, position {numpy_state.get('pos')}"
    torch_state = rng.get("torch")
    if isinstance(torch_state, torch.Tensor):
        summary["torch"] = f"CPU generator, {torch_state.numel()} bytes, fingerprint {_fingerprint(torch_state)}"
    cuda = rng.get("cuda")
    summary["cuda"] = (
        f"device {rng.get('cuda_device')}, {cuda.numel()} bytes" if isinstance(cuda, torch.Tensor) else "not saved"
    )
    return summary


def summarize(path: str, *, key: bytes | None = None) -> dict[str, Any]:
    """Verify ``path`` (and its signature with ``key``), load it weights-only and describe it.

    Raises:
        FileNotFoundError, ResumeError: as ``load_checkpoint`` (321, 322, 328, 339).
    """
    header = read_checkpoint_header(path, key=key)
    content = load_checkpoint(path, key=key)
    summary: dict[str, Any] = {
        "path": path,
        "file_bytes": os.path.getsize(path),
        "file_format_version": header.format_version,
        "payload_bytes": header.payload_length,
        "digest": header.digest,
        "digest_algorithm": header.algorithm,
        "signed": header.signed,
        "signature_verified": key is not None,
    }
    if not (isinstance(content, Mapping) and content.get("format") == PAUSE_FORMAT):
        summary["kind"] = "checkpoint"
        entries = content.items() if isinstance(content, Mapping) else [("(value)", content)]
        summary["entries"] = {
            str(name): dict(zip(("tensors", "bytes"), _tensors(value, set()))) for name, value in entries
        }
        return summary
    regular = content.get("regular") or {}
    shared = list(content.get("shared_keys") or [])
    objects = dict(content.get("objects") or {})
    summary.update(
        kind="pause",
        format=content.get("format"),
        module_version=content.get("module_version"),
        config_signature=content.get("config_signature"),
        completed_steps=content.get("completed_steps"),
        world_size=(content.get("distributed") or {}).get("world_size", 1),
    )
    seen: set[int] = set()
    summary["objects"] = {}
    for name in [*objects, *(n for n in shared if n not in objects)]:
        count, size = _tensors(regular.get(name) if name in shared else objects[name], seen)
        summary["objects"][str(name)] = {"tensors": count, "bytes": size, "shared": name in shared}
    if regular:
        rest = {k: v for k, v in regular.items() if k not in shared}
        count, size = _tensors(rest, seen)
        summary["regular_checkpoint"] = {
            "keys": [str(k) for k in regular],
            "unshared_keys": [str(k) for k in rest],
            "tensors": count,
            "bytes": size,
        }
    summary["loaders"] = {}
    for name, state in (content.get("loaders") or {}).items():
        position = _position(state)
        if isinstance(state, Mapping) and "delivered_batches" in state:
            position["delivered_batches"] = state["delivered_batches"]
        summary["loaders"][str(name)] = position
    summary["rng"] = _rng_summary(content.get("rng"))
    summary["extra"] = [str(k) for k in (content.get("extra") or {})]
    if "config" in content:
        summary["config"] = content["config"]
    return summary


def _print_text(summary: dict[str, Any], out: TextIO) -> None:
    signature = (
        "verified with the key file"
        if summary["signature_verified"]
        else ("signed, not checked (no --key-file)" if summary["signed"] else "not signed")
    )
    lines = [
        ("file", f"{summary['path']}, {format_bytes(summary['file_bytes'])}"),
        (
            "integrity",
            (
                f"ok: marker, length and {summary['digest_algorithm']} "
                f"{summary['digest'][:16]}... verified"
            ),
        ),
        ("signature", signature),
        ("file format", f"version {summary['file_format_version']}"),
    ]
    if summary["kind"] != "pause":
        lines.append(("content", "not a pause checkpoint; entries below"))
    else:
        lines += [
            ("pause format", summary["format"]),
            ("module version", summary["module_version"]),
            ("config signature", summary["config_signature"]),
            ("completed steps", summary["completed_steps"]),
            ("processes", summary["world_size"]),
        ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}", file=out)
    if summary["kind"] != "pause":
        rows = [(name, e["tensors"], format_bytes(e["bytes"])) for name, e in summary["entries"].items()]
        print("\n" + format_table(("entry", "tensors", "bytes"), rows, indent=""), file=out)
        return
    rows = [
        (name, e["tensors"], format_bytes(e["bytes"]), "yes" if e["shared"] else "")
        for name, e in summary["objects"].items()
    ]
    print(
        "\n" + format_table(("object", "tensors", "bytes", "shared with regular checkpoint"), rows, indent=""), file=out
    )
    regular = summary.get("regular_checkpoint")
    if regular and regular["unshared_keys"]:
        print(
            f"regular checkpoint also holds: {', '.join(regular['unshared_keys'])} "
            f"({regular['tensors']} tensors, {format_bytes(regular['bytes'])})",
            file=out,
        )
    if summary["loaders"]:
        rows = [
            (
                name,
                p.get("consumed", "?"),
                p.get("cycle", "?"),
                p.get("offset", "?"),
                p.get("delivered_batches", "?"),
                p.get("num_replicas", 1),
            )
            for name, p in summary["loaders"].items()
        ]
        header = ("loader", "consumed", "cycle", "offset", "delivered batches", "ranks")
        print(
            "\n" + format_table(header, rows, indent=""),
            file=out,
        )
    else:
        print("\nloaders: none", file=out)
    rng = summary["rng"]
    print("\nrng", file=out)
    for name in ("python", "numpy", "torch", "cuda", "fingerprint"):
        if name in rng:
            print(f"  {name.ljust(11)}  {rng[name]}", file=out)
    print(f"\nextra state keys: {', '.join(summary['extra']) or 'none'}", file=out)
    if "config" in summary:
        print("saved config: yes (printed by --json)", file=out)


def run_inspect(path: str, *, as_json: bool, key_file: str | None, out: TextIO) -> int:
    """Print the summary of ``path``; errors propagate to the command line's handler."""
    key = None
    if key_file is not None:
        with open(key_file, "rb") as handle:
            key = handle.read()
        try:
            key = validate_key(key)
        except (TypeError, ValueError) as error:
            raise InspectUsageError(f"the key file {key_file}: {error}") from error
    summary = summarize(path, key=key)
    if as_json:
        print(json.dumps(summary, indent=2, default=str), file=out)
    else:
        _print_text(summary, out)
    return 0
