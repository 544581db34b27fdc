"""Where a sample's time goes: ResumableDataLoader against DataLoader, in one process.

The dataset of ``benchmarks/loader_throughput.py`` (``dataset[i]`` spins a fixed CPU
time) read with ``num_workers=0``, so everything a worker would do runs here, where
it can be timed and profiled. First plain timing (median of ``--repeats`` runs of
``--batches`` batches, alternating): CPU microseconds per sample of each loader and
the difference, the per-sample cost the resumable loader adds to every worker.
Then one ``cProfile`` run of each with no spin (``--profile-cost-us 0``: the
profiler would otherwise mostly count the spin's clock reads), own time sorted into
categories: the dataset's
own work, seeding and restoring the RNGs around each sample (replayable
augmentation), collate, the sampler, the loader's own bookkeeping, and the rest.

    python -m benchmarks._profile_loader --quick

Prints the split and writes benchmarks/out/profile_loader.json (read by ``python -m
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

from torch.utils.data import DataLoader

from benchmarks._common import print_table, write_json
from benchmarks.loader_throughput import BATCH, SpinDataset
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

CATEGORIES = (
    "dataset",
    "RNG seeding and restoring",
    "collate",
    "sampler",
    "loader bookkeeping",
    "other",
)
LOADERS = ("DataLoader", "ResumableDataLoader")


def make_loader(kind: str, cost_us: float) -> DataLoader:
    dataset = SpinDataset(cost_us)
    if kind == "DataLoader":
        return DataLoader(dataset, batch_size=BATCH, shuffle=True)
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    return ResumableDataLoader(dataset, batch_size=BATCH, sampler=sampler, resumable=True)


def categorise(where: tuple[str, int, str]) -> str:
    """The category of one profile entry ``(file, line, function)``."""
    filename, _, function = where
    path = filename.replace("\\", "/")
    name = Path(path).name
    if name in ("loader_throughput.py", "_common.py") or "thread_time" in function:
        return "dataset"
    if (
        name == "rng.py"
        or function
        in ("_reseed", "sample_seeds", "collate_seed", "_splitmix64", "_splitmix64_array")
        or any(
            part in function
            for part in (
                "seed",
                "getstate",
                "setstate",
                "set_state",
                "get_state",
                "get_rng_state",
                "set_rng_state",
            )
        )
    ):
        return "RNG seeding and restoring"
    if "collate" in path or "collate" in function:
        return "collate"
    if (
        "sampler" in path
        or name in ("_cycles.py", "_batching.py", "keyed_permutation.py")
        or "randperm" in function
    ):
        return "sampler"
    if "/trainer_resume/" in path:
        return "loader bookkeeping"
    return "other"


def run_batches(loader: DataLoader, batches: int) -> None:
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    del iterator
    if isinstance(loader, ResumableDataLoader):
        loader.close()


def cpu_us_per_sample(kind: str, cost_us: float, batches: int) -> float:
    loader = make_loader(kind, cost_us)
    run_batches(loader, 2)  # first batch: permutation and iterator set-up
    start = time.process_time()
    run_batches(loader, batches)
    return (time.process_time() - start) / (batches * BATCH) * 1e6


def profile(kind: str, cost_us: float, batches: int) -> dict[str, Any]:
    loader = make_loader(kind, cost_us)
    run_batches(loader, 2)
    profiler = cProfile.Profile()
    profiler.enable()
    run_batches(loader, batches)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    samples = batches * BATCH
    categories = dict.fromkeys(CATEGORIES, 0.0)
    top = []
    for where, (_, calls, own, cumulative, _) in stats.items():
        categories[categorise(where)] += own / samples * 1e6
        top.append(
            {
                "function": _describe(where),
                "category": categorise(where),
                "calls": calls,
                "own_us_per_sample": own / samples * 1e6,
                "cumulative_us_per_sample": cumulative / samples * 1e6,
            }
        )
    top.sort(key=lambda entry: entry["own_us_per_sample"], reverse=True)
    return {"categories_us_per_sample": categories, "top": top[:12]}


def _describe(where: tuple[str, int, str]) -> str:
    filename, line, function = where
    if filename == "~":
        return re.sub(r" at 0x[0-9a-f]+", "", function)  # no addresses: they differ on every run
    parts = Path(filename).parts
    for anchor in ("trainer_resume", "torch", "numpy"):
        if anchor in parts:
            return f"{'/'.join(parts[parts.index(anchor) :])}:{line}({function})"
    return f"{Path(filename).name}:{line}({function})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    parser.add_argument(
        "--cost-us", type=float, default=200.0, help="CPU µs per sample (default 200)"
    )
    parser.add_argument(
        "--profile-cost-us", type=float, default=0.0, help="spin per sample while profiling"
    )
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    batches = args.batches or (30 if args.quick else 100)
    repeats = args.repeats or (3 if args.quick else 7)

    timed: dict[str, list[float]] = {kind: [] for kind in LOADERS}
    for repeat in range(repeats):
        for kind in LOADERS if repeat % 2 == 0 else reversed(LOADERS):
            timed[kind].append(cpu_us_per_sample(kind, args.cost_us, batches))
    medians = {kind: statistics.median(values) for kind, values in timed.items()}
    profiles = {kind: profile(kind, args.profile_cost_us, batches) for kind in LOADERS}

    print_table(
        f"CPU per sample in one process (num_workers=0), {args.cost_us:.0f} µs spin per sample, batch_size={BATCH}, "
        f"{batches} batches, median of {repeats}",
        ["loader", "CPU µs/sample", "all runs", "throughput ratio if CPU-bound"],
        [
            [
                kind,
                f"{medians[kind]:.1f}",
                " ".join(f"{value:.1f}" for value in timed[kind]),
                f"{medians['DataLoader'] / medians[kind]:.3f}",
            ]
            for kind in LOADERS
        ],
    )
    per_sample = {kind: profiles[kind]["categories_us_per_sample"] for kind in LOADERS}
    print_table(
        f"cProfile own time per sample by category, {args.profile_cost_us:.0f} µs spin (µs; the profiler inflates "
        "Python-level code)",
        ["category", *LOADERS, "difference"],
        [
            [
                category,
                *(f"{per_sample[kind][category]:.1f}" for kind in LOADERS),
                f"{per_sample['ResumableDataLoader'][category] - per_sample['DataLoader'][category]:+.1f}",
            ]
            for category in CATEGORIES
        ],
    )
    path = write_json(
        "profile_loader",
        {
            "cost_us": args.cost_us,
            "profile_cost_us": args.profile_cost_us,
            "batch_size": BATCH,
            "batches": batches,
            "repeats": repeats,
            "cpu_us_per_sample": timed,
            "median_cpu_us_per_sample": medians,
            "categories": list(CATEGORIES),
            "profiles": profiles,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
