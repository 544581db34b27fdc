"""``trainer-resume inspect``: read any checkpoint file safely and say what it holds.

trainer-resume's files are verified (marker, length, digest, and the signature
with ``--key-file``) before anything is unpickled; plain ``torch.save`` files
(Lightning's own checkpoints, state dicts) are described too, marked as not
verified, and read weights-only. ``--json`` prints the summary of
:mod:`~trainer_resume.cli.describe`; the text report shows the same content.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..checkpoint_files import read_checkpoint_file
from ..durable import validate_key
from ..storage import paths
from ._common import EXIT_OK, UsageError, format_bytes, format_table, read_key_file
from .describe import SHARDED_MANIFEST, describe_directory, describe_file
from .describe_sharded import SHARDED_DIRECTORY, describe_sharded, is_sharded_pause

__all__ = ["run_inspect", "summarize"]


def summarize(path: str, *, key: bytes | None = None) -> dict[str, Any]:
    """Verify (when it is ours) and load ``path`` weights-only, and describe it; a
    resume-point directory is described with its newest valid file, a sharded pause
    directory after every file is checked against its manifest.

    Raises:
        FileNotFoundError, ResumeError: as ``read_checkpoint_file`` (321, 322, 328, 339).
    """
    path = paths.location(path)
    if is_sharded_pause(path):
        return describe_sharded(path, key=key)
    if paths.is_dir(path):
        return describe_directory(
            path,
            key=key,
            read=lambda p: read_checkpoint_file(p, key=key),
            read_sharded=lambda p: describe_sharded(p, key=key),
        )
    return describe_file(read_checkpoint_file(path, key=key), signature_verified=key is not None)


def _integrity_lines(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    integrity = summary.get("integrity")
    if integrity is None:
        return [("integrity", summary["not_verified"])]
    if integrity["signature_verified"]:
        signature = "verified with the key file"
    else:
        signature = "signed, not checked (no --key-file)" if integrity["signed"] else "not signed"
    return [
        (
            "integrity",
            (
                f"ok: marker, length and {integrity['digest_algorithm']} digest "
                f"{integrity['digest'][:16]}... verified"
            ),
        ),
        ("signature", signature),
        ("file format", f"version {integrity['file_format_version']}"),
    ]


def _steps_text(steps: dict[str, Any]) -> str:
    known = {name: value for name, value in steps.items() if value is not None}
    return ", ".join(f"{name} {value}" for name, value in known.items()) or "none saved"


def _header_lines(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    where = "directory" if summary["kind"] == SHARDED_DIRECTORY else "file"
    lines: list[tuple[str, Any]] = [
        (where, f"{summary['path']}, {format_bytes(summary['file_bytes'])}"),
        ("kind", summary["description"]),
        *_integrity_lines(summary),
    ]
    if summary["kind"] in (SHARDED_DIRECTORY, SHARDED_MANIFEST):
        lines.extend(_sharded_lines(summary))
    if "format" in summary and summary["kind"] != SHARDED_MANIFEST:
        lines.append(("pause format", summary["format"]))
    if "module_version" in summary:
        lines.append(("module version", summary["module_version"]))
    if "lightning_version" in summary:
        lines.append(("lightning version", summary["lightning_version"]))
    lines.append(("steps", _steps_text(summary["steps"])))
    if summary.get("epoch") is not None:
        lines.append(("epoch", summary["epoch"]))
    if "finished_at" in summary:
        lines.append(("finished at", summary["finished_at"]))
    if summary.get("world_size") is not None:
        lines.append(("processes", summary["world_size"]))
    per_rank = summary.get("rank_config_signatures")
    if per_rank:
        signatures = ", ".join(
            f"rank {rank} {signature}" for rank, signature in enumerate(per_rank)
        )
        lines.append(
            ("config signatures", f"one per rank (the ranks' configs differ): {signatures}")
        )
    elif "objects" in summary or summary.get("config_signature"):
        lines.append(("config signature", summary.get("config_signature") or "none saved"))
    return lines


def _sharded_lines(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    files = f"{len(summary['files'])} files, {format_bytes(summary['files_bytes'])}"
    checked = summary.get("files_verified", "not checked: the manifest alone was given")
    models = ", ".join(
        f"{model} ({', '.join(optimizers)})" if optimizers else model
        for model, optimizers in (summary["sharded_models"] or {}).items()
    )
    return [
        ("manifest format", summary.get("manifest_format", summary.get("format"))),
        ("generation", summary["generation"]),
        ("files", f"{files}; {checked}"),
        ("sharded", models or "none"),
    ]


def _cycle(position: dict[str, Any]) -> str:
    if "epoch" in position:
        return f"epoch {position['epoch']}"
    return str(position.get("cycle", "?"))


def _offset(position: dict[str, Any]) -> str:
    if "offset" not in position:
        return "?"
    unit = position.get("offset_unit")
    return f"{position['offset']} {unit}" if unit else str(position["offset"])


def _print_loaders(loaders: dict[str, Any], out: TextIO) -> None:
    if not loaders:
        print("\nloaders: none saved", file=out)
        return
    rows = [
        (
            name,
            p.get("consumed", "?"),
            _cycle(p),
            _offset(p),
            p.get("delivered_batches", "?"),
            p.get("num_replicas", 1),
        )
        for name, p in loaders.items()
    ]
    header = (
        "loader",
        "consumed samples",
        "cycle/epoch",
        "offset",
        "delivered batches",
        "ranks",
    )
    print("\n" + format_table(header, rows, indent=""), file=out)
    for name, position in loaders.items():
        dali = position.get("dali")
        if dali is not None:
            sizes = ", ".join(
                "?" if n is None else format_bytes(n) for n in dali["checkpoint_bytes"]
            )
            reset = "; DALI's reset() is due before the next batch" if dali["pending_reset"] else ""
            print(
                f"{name}: DALI {dali['version']}, {dali['pipelines']} pipeline(s), "
                f"checkpoints {sizes}{reset}",
                file=out,
            )


def _print_rng(rng: dict[str, Any], out: TextIO) -> None:
    if not rng.get("saved"):
        print("\nrng: not saved", file=out)
        return
    processes = rng.get("processes", 1)
    print(
        f"\nrng (main process{'' if processes == 1 else f' of each of {processes} ranks; rank 0'})",
        file=out,
    )
    for name in ("python", "numpy", "torch", "cuda", "fingerprint"):
        if name in rng:
            print(f"  {name.ljust(11)}  {rng[name]}", file=out)


def _print_objects(summary: dict[str, Any], out: TextIO) -> None:
    entries = summary["objects"]
    rows = [
        (
            name,
            "in DCP shards" if e["tensors"] is None else e["tensors"],
            "" if e["bytes"] is None else format_bytes(e["bytes"]),
            e.get("class", ""),
            "yes" if e["shared"] else "",
        )
        for name, e in entries.items()
    ]
    header = ("object", "tensors", "bytes", "class", "shared with regular checkpoint")
    kept = [True, True, True]
    kept.append(any("class" in e for e in entries.values()))
    kept.append(any(e["shared"] for e in entries.values()))
    rows = [tuple(cell for cell, keep in zip(row, kept) if keep) for row in rows]
    header = tuple(title for title, keep in zip(header, kept) if keep)
    print("\n" + format_table(header, rows, indent=""), file=out)
    regular = summary.get("regular_checkpoint")
    if regular and regular["unshared_keys"]:
        print(
            f"regular checkpoint also holds: {', '.join(regular['unshared_keys'])} "
            f"({regular['tensors']} tensors, {format_bytes(regular['bytes'])})",
            file=out,
        )
    modules = [(name, e) for name, e in summary["objects"].items() if "keys" in e]
    if modules:
        print("\nmodule keys", file=out)
        for name, e in modules:
            first = ", ".join(repr(key) for key in e["first_keys"])
            more = e["keys"] - len(e["first_keys"])
            print(
                f"  {name}: {e['keys']} keys: {first}{f' and {more} more' if more else ''}",
                file=out,
            )
    moded = [(name, e) for name, e in entries.items() if "eval" in e]
    if moded:
        print("\nmodule modes (what state_dict() leaves out)", file=out)
        for name, e in moded:
            print(f"  {name}: {_modes(e['eval'], e['frozen'], e['untracked'])}", file=out)
    buffers = summary.get("rank_buffers")
    if buffers:
        listed = ", ".join(f"{model} {count}" for model, count in buffers.items())
        print(f"\nsharded models' own buffers per process: {listed}", file=out)


def _modes(evaluating: list[str], frozen: list[str], untracked: list[str]) -> str:
    if not evaluating and not frozen and not untracked:
        return "every submodule in training mode, no parameter frozen"
    parts = []
    if evaluating:
        names = ", ".join("(the module itself)" if path == "" else path for path in evaluating)
        parts.append(f"in eval mode: {names}")
    if frozen:
        parts.append(f"frozen (requires_grad=False): {', '.join(frozen)}")
    if untracked:
        parts.append(f"no running statistics (track_running_stats=False): {', '.join(untracked)}")
    return "; ".join(parts)


def _entry_type(entry: dict[str, Any]) -> str:
    if "dtype" in entry:  # a safetensors tensor
        return f"{entry['dtype']} {entry['shape']}".replace(" ", "")
    return entry["type"]


def _print_text(summary: dict[str, Any], out: TextIO) -> None:
    lines = _header_lines(summary)
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}", file=out)
    if "entries" in summary:
        rows = [
            (name, _entry_type(e), e["tensors"], format_bytes(e["bytes"]), e.get("value", ""))
            for name, e in summary["entries"].items()
        ]
        header = ("entry", "type", "tensors", "bytes", "value")
        print("\n" + format_table(header, rows, indent=""), file=out)
        return
    if "objects" not in summary:  # a finished marker
        return
    _print_objects(summary, out)
    _print_loaders(summary["loaders"], out)
    _print_rng(summary["rng"], out)
    if "extra" in summary:
        print(f"\nextra state keys: {', '.join(summary['extra']) or 'none'}", file=out)
    if "callbacks" in summary:
        # Lightning's callback state keys carry their arguments: "ModelCheckpoint{'monitor': ...}".
        names = [name.split("{", 1)[0] for name in summary["callbacks"]]
        print(f"\ncallbacks: {', '.join(names) or 'none'}", file=out)
        print(f"hyper-parameters: {', '.join(summary['hyper_parameters']) or 'none'}", file=out)
    if "config" in summary:
        print("saved config: yes (printed by --json)", file=out)


def _print_directory(summary: dict[str, Any], out: TextIO) -> None:
    def listing(files: list[dict[str, Any]]) -> str:
        return ", ".join(f"{f['file']} (step {f['completed_steps']})" for f in files) or "none"

    newest = summary["newest"]
    lines = [
        ("directory", summary["path"]),
        ("kind", summary["description"]),
        ("resume points", listing(summary["points"])),
        ("pause files", listing(summary["pause_files"])),
        (
            "finished",
            f"yes ({summary['finished']}): nothing to resume" if summary["finished"] else "no",
        ),
        ("newest valid", paths.basename(newest["path"]) + ", below" if newest else "none"),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}", file=out)
    for line in summary["skipped"]:
        print(f"  {line}", file=out)
    if newest is not None:
        print(file=out)
        _print_text(newest, out)


def run_inspect(path: str, *, as_json: bool, key_file: str | None, out: TextIO) -> int:
    """Print the summary of ``path``; errors propagate to the command line's handler."""
    key = None
    if key_file is not None:
        try:
            key = validate_key(read_key_file(key_file))
        except ValueError as error:
            raise UsageError(f"the key file {key_file}: {error}") from error
    summary = summarize(path, key=key)
    if as_json:
        print(json.dumps(summary, indent=2, default=str), file=out)
    elif summary["kind"] == "directory":
        _print_directory(summary, out)
    else:
        _print_text(summary, out)
    return EXIT_OK
