"""Where the time to the first batch after ``load_state_dict`` goes, by stream position.

The loader and positions of ``benchmarks/loader_resume.py`` (4,000,000 samples,
``batch_size=32``, positions 0, 1e6 and 1e8), split in two:

* in one process (``num_workers=0``): ``load_state_dict`` + the first batch, median of
  ``--repeats``, and one ``cProfile`` run per position (the functions with the most
  own time, and the share of ``torch.randperm``: the one permutation of the position's
  cycle that closed-form resuming costs);
* the fixed cost the worker runs add: a fresh ``num_workers=2`` loader's first batch
  with no state loaded at all (worker start-up), median of ``--repeats``.

    python -m benchmarks._profile_resume --quick

Prints the split and writes benchmarks/out/profile_resume.json (read by ``python -m
benchmarks`` for the notes of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_json
from benchmarks.loader_resume import BATCH, POSITIONS, WORKERS, IndexDataset, resumable_state
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader


def make_loader(workers: int) -> ResumableDataLoader:
    dataset = IndexDataset()
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    return ResumableDataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, resumable=True
    )


def first_batch_seconds(
    state: dict[str, Any] | None, workers: int, profiler: cProfile.Profile | None = None
) -> float:
    loader = make_loader(workers)
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - start
    loader.close()
    return elapsed


def _describe(where: tuple[str, int, str]) -> str:
    filename, line, function = where
    if filename == "~":
        return re.sub(r" at 0x[0-9a-f]+", "", function)
    parts = Path(filename).parts
    for anchor in ("trainer_resume", "torch"):
        if anchor in parts:
            return f"{'/'.join(parts[parts.index(anchor) :])}:{line}({function})"
    return f"{Path(filename).name}:{line}({function})"


def profile_position(state: dict[str, Any]) -> dict[str, Any]:
    profiler = cProfile.Profile()
    wall = first_batch_seconds(state, 0, profiler)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values())
    permutation = sum(entry[2] for where, entry in stats.items() if "randperm" in where[2])
    top = sorted(
        (
            {"function": _describe(where), "calls": entry[1], "tottime_s": entry[2]}
            for where, entry in stats.items()
        ),
        key=lambda item: item["tottime_s"],
        reverse=True,
    )
    return {"wall_s": wall, "profiled_s": total, "randperm_s": permutation, "top": top[:6]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)

    states = {position: resumable_state(position) for position in POSITIONS}
    in_process: dict[int, list[float]] = {position: [] for position in POSITIONS}
    startup: list[float] = []
    for _ in range(repeats):
        for position in POSITIONS:
            in_process[position].append(first_batch_seconds(states[position], 0))
        startup.append(first_batch_seconds(None, WORKERS))
    profiles = {position: profile_position(states[position]) for position in POSITIONS}
    medians = {position: statistics.median(times) for position, times in in_process.items()}

    print_table(
        f"First batch after load_state_dict in one process (num_workers=0), median of {repeats} (ms); "
        f"max/min {max(medians.values()) / min(medians.values()):.2f}",
        [
            "position",
            "median ms",
            "all runs",
            "cProfile: randperm share",
            "top function (own time)",
        ],
        [
            [
                f"{position:,}",
                f"{medians[position] * 1e3:.1f}",
                " ".join(f"{t * 1e3:.1f}" for t in in_process[position]),
                f"{profiles[position]['randperm_s'] / profiles[position]['profiled_s']:.0%}",
                f"{profiles[position]['top'][0]['function']} {profiles[position]['top'][0]['tottime_s'] * 1e3:.1f} ms",
            ]
            for position in POSITIONS
        ],
    )
    print_table(
        f"Fixed cost of the workers: a fresh num_workers={WORKERS} loader's first batch, no state loaded",
        ["median ms", "all runs"],
        [[f"{statistics.median(startup) * 1e3:.1f}", " ".join(f"{t * 1e3:.1f}" for t in startup)]],
    )
    path = write_json(
        "profile_resume",
        {
            "repeats": repeats,
            "num_workers_for_startup": WORKERS,
            "in_process_seconds": {str(position): times for position, times in in_process.items()},
            "worker_startup_seconds": startup,
            "profiles": {str(position): profile for position, profile in profiles.items()},
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
