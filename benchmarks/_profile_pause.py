"""Where the time of ``pause()`` goes, against ``torch.save`` + fsync of the same state.

Builds the state of ``benchmarks/checkpointing.py`` (MLP + AdamW after one step),
then runs each writer under ``cProfile`` (``--runs`` times, alternating; the fastest
run of each is kept) and sorts every function's own time (``tottime``) into a few
categories: fsync of the file, fsync of the directory, the rename, serializing and
writing, the BLAKE3 digest (``pause()`` hashes large records on a helper thread while
they are written, which cProfile does not see: the main thread's wait for it counts
here, with the small records hashed on the main thread), collecting the state, and the
rest. The categories partition the profiled time. cProfile slows Python-level
code down, so the absolute times run above the plain benchmark; the split is the point.

    python -m benchmarks._profile_pause --quick     # ~10M parameters
    python -m benchmarks._profile_pause             # ~100M parameters

Prints the split and writes benchmarks/out/profile_pause.json (read by ``python -m
benchmarks`` for the notes of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_json
from benchmarks.checkpointing import SIZES, build_model, tensor_bytes

CATEGORIES = (
    "fsync (file)",
    "fsync (directory)",
    "rename (os.replace)",
    "serialize + write",
    "BLAKE3 digest",
    "collecting state",
    "other",
)
_STATE_FUNCTIONS = {
    "state_dict",
    "to_cpu",
    "check_saveable",
    "random_state",
    "pause_checkpoint",
    "cpu_state",
}


def categorise(where: tuple[str, int, str], caller_names: set[str]) -> str:
    """The category of one profile entry ``(file, line, function)``.

    Serializing and writing share a category: when torch.save writes to a plain
    file, its C++ writer calls ``write`` without a profiler event, so the write time
    of ``torch.save`` + fsync lands inside ``write_record``; only pause()'s Python
    sink shows ``os.write`` separately.
    """
    filename, _, function = where
    if "fsync" in function:
        return (
            "fsync (directory)"
            if any("directory" in name for name in caller_names)
            else "fsync (file)"
        )
    if "posix.replace" in function:
        return "rename (os.replace)"
    if "blake3" in function:
        return "BLAKE3 digest"
    if "acquire" in function and "lock" in function:
        # The main thread waits for the helper thread that hashes large records.
        return "BLAKE3 digest"
    if "write" in function and ("posix" in function or "method" in function):
        return "serialize + write"
    if function in _STATE_FUNCTIONS:
        return "collecting state"
    normalised = filename.replace("\\", "/")
    if "/torch/" in normalised and ("/nn/" in normalised or "/optim/" in normalised):
        return "collecting state"
    if "/torch/" in normalised or "Pickler" in function or "write_record" in function:
        return "serialize + write"
    return "other"


def profile(action: Callable[[], Any]) -> dict[str, Any]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    action()
    profiler.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    categories = dict.fromkeys(CATEGORIES, 0.0)
    top = []
    for where, (_, calls, own, cumulative, callers) in stats.items():
        caller_names = {caller[2] for caller in callers}
        if "fsync" in where[2] and callers:
            # Split the builtin's time by caller: the file's fsync and the directory's.
            for caller, caller_stats in callers.items():
                categories[categorise(where, {caller[2]})] += caller_stats[2]
        else:
            categories[categorise(where, caller_names)] += own
        top.append(
            {
                "function": _describe(where),
                "category": "fsync" if "fsync" in where[2] else categorise(where, caller_names),
                "calls": calls,
                "tottime_s": own,
                "cumtime_s": cumulative,
            }
        )
    top.sort(key=lambda entry: entry["tottime_s"], reverse=True)
    return {
        "wall_s": total,
        "profiled_s": sum(categories.values()),
        "categories": categories,
        "top": top[:12],
    }


def _describe(where: tuple[str, int, str]) -> str:
    filename, line, function = where
    if filename == "~":
        return re.sub(r" at 0x[0-9a-f]+", "", function)  # no addresses: they differ on every run
    parts = Path(filename).parts
    for anchor in ("trainer_resume", "torch", "concurrent", "threading.py"):
        if anchor in parts:
            return f"{'/'.join(parts[parts.index(anchor) :])}:{line}({function})"
    return f"{Path(filename).name}:{line}({function})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~10M parameters instead of ~100M")
    parser.add_argument("--size", choices=sorted(SIZES), default=None)
    parser.add_argument(
        "--runs", type=int, default=3, help="profiled runs per writer; the fastest is kept"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the files are written (default: a temp dir)"
    )
    args = parser.parse_args(argv)

    from benchmarks.pause import BenchTrainer, torch_save_fsync

    label = args.size or ("10M" if args.quick else "100M")
    width, layers = SIZES[label]
    model, optimizer = build_model(width, layers)
    state_bytes = tensor_bytes(model.state_dict(), optimizer.state_dict())
    trainer = BenchTrainer(model, optimizer, shared=False)
    runs: dict[str, list[dict[str, Any]]] = {"pause()": [], "torch.save + fsync": []}
    with tempfile.TemporaryDirectory(prefix=".profile-pause-", dir=args.dir or Path.cwd()) as name:
        directory = Path(name)
        for run in range(args.runs):
            order = list(runs) if run % 2 == 0 else list(reversed(runs))
            for writer in order:
                if writer == "pause()":
                    runs[writer].append(profile(lambda: trainer.pause(directory / "pause.ckpt")))
                    trainer.resume(directory / "pause.ckpt")  # unpause for the next run
                else:
                    runs[writer].append(
                        profile(lambda: torch_save_fsync(model, optimizer, directory / "torch.pt"))
                    )
    fastest = {
        writer: min(measured, key=lambda item: item["wall_s"]) for writer, measured in runs.items()
    }

    rows = []
    for category in CATEGORIES:
        ours = fastest["pause()"]["categories"][category]
        theirs = fastest["torch.save + fsync"]["categories"][category]
        rows.append([category, f"{ours:.3f}", f"{theirs:.3f}", f"{ours - theirs:+.3f}"])
    rows.append(
        [
            "total (profiled)",
            f"{fastest['pause()']['profiled_s']:.3f}",
            f"{fastest['torch.save + fsync']['profiled_s']:.3f}",
            f"{fastest['pause()']['profiled_s'] - fastest['torch.save + fsync']['profiled_s']:+.3f}",
        ]
    )
    print_table(
        f"Where the time goes (cProfile, own time per category, fastest of {args.runs}): "
        f"{layers * (width * width + width) / 1e6:.1f}M parameters + AdamW, {state_bytes / (1 << 20):.1f} MiB",
        ["category", "pause() s", "torch.save + fsync s", "difference s"],
        rows,
    )
    print_table(
        "pause(): functions with the most own time",
        ["function", "category", "calls", "own s", "cumulative s"],
        [
            [
                e["function"],
                e["category"],
                e["calls"],
                f"{e['tottime_s']:.3f}",
                f"{e['cumtime_s']:.3f}",
            ]
            for e in fastest["pause()"]["top"][:8]
        ],
    )
    path = write_json(
        "profile_pause",
        {
            "size": label,
            "parameters": layers * (width * width + width),
            "state_bytes": state_bytes,
            "runs": args.runs,
            "categories": list(CATEGORIES),
            "writers": fastest,
            "all_wall_s": {
                writer: [item["wall_s"] for item in measured] for writer, measured in runs.items()
            },
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
