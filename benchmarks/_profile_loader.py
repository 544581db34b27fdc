"""Where a sample's time goes: ResumableDataLoader against DataLoader, in one process.

The map-style dataset of ``benchmarks/_loader_cases.py`` (``dataset[i]`` spins a fixed
CPU time) read with ``num_workers=0``, so everything a worker would do runs here,
where it can be timed and profiled. First plain timing (median of ``--repeats`` runs of
``--batches`` batches, alternating): CPU microseconds per sample of each loader and
the difference, the per-sample cost the resumable loader adds to every worker.
Then one ``cProfile`` run of each with no spin (``--profile-cost-us 0``: the
profiler would otherwise mostly count the spin's clock reads), own time sorted into
categories: the dataset's
own work, seeding and restoring the RNGs around each sample (replayable
augmentation), collate, the sampler, the loader's own bookkeeping, and the rest.

    python -m benchmarks._profile_loader --quick

Then the seeding and hand-back of one batch (``CallerGenerators.run`` around
``seed_batch``) step by step: each step timed on its own (min over repeats of the mean
of many calls), against the whole; "call overhead" is the whole less the steps.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from benchmarks._common import print_table, write_json
from benchmarks._loader_cases import BATCH
from benchmarks._loader_cases import make_loader as make_case_loader
from trainer_resume.loaders import ResumableDataLoader

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
    """The throughput benchmark's map-style loaders (``shuffle=True``), without workers."""
    return make_case_loader("torch" if kind == "DataLoader" else "resumable", cost_us, 0)


def categorise(where: tuple[str, int, str]) -> str:
    """The category of one profile entry ``(file, line, function)``."""
    filename, _, function = where
    path = filename.replace("\\", "/")
    name = Path(path).name
    if name in ("_loader_cases.py", "_common.py") or "thread_time" in function:
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


def seeding_breakdown(calls: int, repeats: int) -> dict[str, float]:
    """CPU µs of each step of seeding one batch and handing the caller's generators back."""
    import torch

    from benchmarks.loader_throughput import per_call_us
    from trainer_resume.loaders._global_generators import layout
    from trainer_resume.loaders._seeding import CallerGenerators
    from trainer_resume.rng import hold_generators

    place = layout()
    python, key, gauss = place.python, place.numpy_key(), place.gauss
    if python is None or key is None or gauss is None:
        return {}  # the public accessors' path: not the one measured here
    generator, lock, scratch = torch.default_generator, hold_generators(), place.scratch_key
    seed = 0x1234_5678_9ABC_DEF0
    python_state, numpy_state, numpy_gauss = bytes(python), bytes(key), bytes(gauss)
    torch_state = generator.get_state()
    generators = CallerGenerators()

    def python_back() -> None:
        bytes(python)
        python[:] = python_state

    def numpy_back() -> None:
        bytes(key)
        bytes(gauss)
        key[:] = numpy_state
        gauss[:] = numpy_gauss

    def seed_python() -> None:
        place.scratch_seed(seed & 0xFFFFFFFF)
        python[4:] = scratch[: len(python) - 4]  # type: ignore[index]

    def seed_numpy() -> None:
        place.numpy_seed(seed >> 32)
        gauss[:] = bytes(16)

    def locked() -> None:
        with lock:
            pass

    steps: dict[str, Callable[[], object]] = {
        "hold and release the generators lock": locked,
        "Python random: take and put back (raw, 2.5 KB)": python_back,
        "NumPy: take and put back (raw, 2.5 KB + Gaussian cache)": numpy_back,
    }
    words, scratch_state, default_state = place.torch_words, place.torch_state, place.torch_default
    if words is not None and scratch_state is not None and default_state is not None:
        # The library's path where the torch generator's layout is proven (_fast_seeder).
        torch_seed, numpy_words = place.torch_scratch.manual_seed, key[: len(words)]

        def torch_back() -> None:
            default_state[:] = bytes(default_state)

        def seed_torch_and_python() -> None:
            torch_seed(seed)
            default_state[:] = scratch_state
            python[4:] = words

        def seed_numpy_words() -> None:
            torch_seed(seed >> 32)
            numpy_words[:] = words
            gauss[:] = bytes(16)

        steps["torch CPU: take and put back (raw, in place, 2.5 KB)"] = torch_back
        steps["seed torch CPU and Python random (a private torch generator seeded, copied)"] = (
            seed_torch_and_python
        )
        steps["seed NumPy (the private torch generator's words, copied)"] = seed_numpy_words
    else:
        steps["torch CPU: get_state + set_state (5 KB tensor)"] = lambda: generator.set_state(
            generator.get_state()
        )
        steps["seed Python random (init_genrand by NumPy, copied)"] = seed_python
        steps["seed NumPy (init_genrand)"] = seed_numpy
        steps["seed torch CPU (manual_seed)"] = lambda: generator.manual_seed(seed)
    timings = {name: per_call_us(step, calls, repeats) for name, step in steps.items()}
    generator.set_state(torch_state)  # the steps seeded the global generators: put them back
    python[:], key[:], gauss[:] = python_state, numpy_state, numpy_gauss
    whole = per_call_us(lambda: generators.run(seed, _nothing), calls, repeats)  # as a fetch
    timings["call overhead (the whole less the steps)"] = whole - sum(timings.values())
    timings["whole: CallerGenerators.run around seed_batch"] = whole
    return timings


def _nothing() -> None:
    pass


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
    seeding = seeding_breakdown(calls=2000 if args.quick else 20000, repeats=7)
    print_table(
        "Seeding one batch and handing the caller's generators back, step by step (CPU µs; each "
        "step timed on its own, min of 7 repeats)",
        ["step", "µs"],
        [[name, f"{value:.2f}"] for name, value in seeding.items()],
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
            "seeding_breakdown_us": seeding,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
