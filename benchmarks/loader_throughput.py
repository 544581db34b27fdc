"""Throughput, CPU cost and state_dict() cost of ResumableDataLoader, DataLoader and StatefulDataLoader.

The three loaders read the datasets of ``benchmarks/_loader_cases.py`` (items that spin
0 or 200 µs of CPU time each): a map-style dataset read in a fresh shuffle
(``shuffle=True``: torch's ``RandomSampler``, one ``torch.randperm`` per epoch; the
resumable loader computes the same epoch, indices only, when it starts), and an
``IterableDataset`` that is its own iterator, split over the workers, whose
``state_dict()`` returns a small fresh dict. ``batch_size=32``, ``num_workers`` 0 and 2,
otherwise default settings (``prefetch_factor=2`` with workers, no pinned memory,
workers not persistent). StatefulDataLoader sends a snapshot of each worker's state
with every batch (``snapshot_every_n_steps=1``); ResumableDataLoader seeds Python,
NumPy and torch once per map-style batch and hands the caller's states back (an
iterable copy's own generators are swapped in and out instead), and records each
delivered batch.

No run reaches the end of the 200,000-item epoch, so epoch boundaries play no part
(the start of the epoch does: its cost is in the CPU column). Each run times
``--batches`` batches after ``--warmup`` batches (worker start-up excluded from the
rate, included in the CPU time). The loaders alternate within each repeat, in an order
rotated every repeat, so they are measured side by side: the CPU ratio (DataLoader's CPU
time / the loader's) is taken within each repeat, and its median and spread (min and
max over the repeats) are reported. Targets, on the CPU ratio: map-style, >= 0.97 at
200 µs per sample (0 and 2 workers) and >= 0.90 at 0 µs without workers; iterable, >=
0.90 at 0 µs; at every point at least StatefulDataLoader's within 0.02; and map-style
ResumableDataLoader / DataLoader samples/s >= 0.97 at 200 µs per sample.

Then the per-batch price of replayable augmentation without workers, on its own:
seeding Python, NumPy and torch CPU for one batch and handing the caller's states
back (``CallerGenerators.run`` around ``seed_batch`` and an empty fetch), the minimum
over repeats of the mean of many calls, in CPU time (target <= 8 µs, 5 µs as a stretch); and for an
iterable dataset's copy read in the main process, swapping its generators in and out
around an empty read.

Then state_dict() cost: for ResumableDataLoader and StatefulDataLoader, mid-stream
(each call follows one more delivered batch, 0 µs per sample), the median of
``--state-calls`` individually timed calls, and the size of the pickled state.
With workers, StatefulDataLoader's state_dict() returns the snapshot that came with
the last batch (the snapshot's cost is paid per batch, inside the throughput table);
without workers it builds the state on each call. torch's DataLoader has no
state_dict(). StatefulDataLoader is left out, with a printed note, when torchdata is
not importable.

    python -m benchmarks.loader_throughput            # full run
    python -m benchmarks.loader_throughput --quick    # short run

Prints the tables and writes benchmarks/out/loader_throughput.json.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from benchmarks._common import median, print_table, write_json
from benchmarks._loader_cases import (
    BATCH,
    DATASETS,
    LABELS,
    LOADERS,
    SIZE,
    SpinDataset,
    cpu_seconds,
    make_loader,
    stateful_loader_class,
    stop_workers,
)

__all__ = ["BATCH", "SpinDataset", "main", "measure", "per_call_us", "seeding_cost_us"]

WORKER_COUNTS = (0, 2)
TARGET = 0.97
SEEDING_TARGET_US = 8.0  # seeding + hand-back per batch, num_workers=0
SEEDING_STRETCH_US = 5.0


def measure(
    kind: str, cost_us: float, batches: int, warmup: int, workers: int = 2, dataset: str = "map"
) -> tuple[float, float]:
    """Samples per second after warm-up, and CPU µs per sample over the whole run
    (main process and workers, start-up and warm-up included)."""
    cpu_start = cpu_seconds()
    loader = make_loader(kind, cost_us, workers, dataset)
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    stop_workers(loader, iterator)
    cpu = cpu_seconds() - cpu_start
    return batches * BATCH / elapsed, cpu / ((batches + warmup) * BATCH) * 1e6


def state_dict_cost(
    kind: str, workers: int, calls: int, warmup: int, dataset: str = "map"
) -> tuple[list[float], int]:
    """µs of each state_dict() call, each after one more delivered batch, and the pickled state's size."""
    loader = make_loader(kind, 0.0, workers, dataset)
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    state_dict: Callable[[], Any] = loader.state_dict  # type: ignore[attr-defined]
    times = []
    for _ in range(calls):
        next(iterator)
        start = time.perf_counter_ns()
        state = state_dict()
        times.append((time.perf_counter_ns() - start) / 1e3)
    size = len(pickle.dumps(state))
    stop_workers(loader, iterator)
    return times, size


def per_call_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    """CPU µs per call: the minimum over ``repeats`` of the mean of ``calls`` calls (CPU time, so
    that other work on a shared machine does not count)."""
    timer = timeit.Timer(call, timer=time.process_time)
    return min(timer.timeit(number=calls) / calls for _ in range(repeats)) * 1e6


def seeding_cost_us(calls: int, repeats: int) -> float:
    """Microseconds per batch to seed the global generators and hand the caller's back."""
    from trainer_resume.loaders._seeding import CallerGenerators

    generators = CallerGenerators()
    seed = 0x1234_5678_9ABC_DEF0  # run() seeds the batch from its int seed, as a fetch does
    return per_call_us(lambda: generators.run(seed, lambda: None), calls, repeats)


def swap_cost_us(calls: int, repeats: int) -> float:
    """Microseconds per read to put an iterable copy's generators in place and take them back."""
    from trainer_resume.loaders._seeding import OwnGenerators

    own = OwnGenerators()
    own.run(lambda: None)
    return per_call_us(lambda: own.run(lambda: None), calls, repeats)


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def run_point(
    kinds: list[str],
    dataset: str,
    workers: int,
    cost: float,
    repeats: int,
    batches: int,
    warmup: int,
) -> dict[str, Any]:
    """One setting: every loader once per repeat, side by side; medians and paired ratios."""
    runs: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    for repeat in range(repeats):
        shift = repeat % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            rate, cpu_per_sample = measure(kind, cost, batches, warmup, workers, dataset)
            runs[kind].append(rate)
            cpu[kind].append(cpu_per_sample)
    entry: dict[str, Any] = {"dataset": dataset, "num_workers": workers, "cost_us": cost}
    for kind in kinds:
        entry[f"{kind}_samples_per_s"] = median(runs[kind])
        entry[f"{kind}_cpu_us_per_sample"] = median(cpu[kind])
        if kind != "torch":
            prefix = "" if kind == "resumable" else f"{kind}_"  # "cpu_ratio": the resumable's
            ratios = [theirs / ours for theirs, ours in zip(cpu["torch"], cpu[kind])]
            entry[f"{prefix}ratio"] = entry[f"{kind}_samples_per_s"] / entry["torch_samples_per_s"]
            entry[f"{prefix}cpu_ratio"] = statistics.median(ratios)
            entry[f"{prefix}cpu_ratio_runs"] = ratios
    entry["runs"] = runs
    entry["cpu_runs"] = cpu
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer batches, repeats and state_dict() calls"
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--costs", type=float, nargs="+", default=[0.0, 200.0], help="µs per sample"
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=list(WORKER_COUNTS), help="num_workers settings"
    )
    parser.add_argument(
        "--datasets", nargs="+", choices=DATASETS, default=list(DATASETS), help="dataset kinds"
    )
    parser.add_argument(
        "--state-calls", type=int, default=None, help="timed state_dict() calls per loader"
    )
    parser.add_argument(
        "--no-stateful", action="store_true", help="leave out torchdata's StatefulDataLoader"
    )
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 9)
    batches = args.batches or (100 if args.quick else 400)
    state_calls = args.state_calls or (300 if args.quick else 2000)

    stateful, why = stateful_loader_class()
    if args.no_stateful:
        stateful, why = None, "not run (--no-stateful)"
    kinds = [kind for kind in LOADERS if kind != "stateful" or stateful is not None]
    if stateful is None:
        print(f"note: StatefulDataLoader left out: {why}\n")

    results = [
        run_point(kinds, dataset, workers, cost, repeats, batches, args.warmup)
        for dataset in args.datasets
        for workers in args.workers
        for cost in args.costs
    ]
    rows = []
    for entry in results:
        for kind in kinds:
            prefix = "" if kind == "resumable" else f"{kind}_"
            torch = kind == "torch"
            rows.append(
                [
                    entry["dataset"],
                    str(entry["num_workers"]),
                    f"{entry['cost_us']:.0f}",
                    LABELS[kind],
                    f"{entry[f'{kind}_samples_per_s']:,.0f}",
                    "1.000" if torch else f"{entry[f'{prefix}ratio']:.3f}",
                    f"{entry[f'{kind}_cpu_us_per_sample']:.2f}",
                    "1.000" if torch else f"{entry[f'{prefix}cpu_ratio']:.3f}",
                    "" if torch else _spread(entry[f"{prefix}cpu_ratio_runs"]),
                ]
            )
    print_table(
        f"Loader throughput: batch_size={BATCH}, {batches} batches per run after {args.warmup} warm-up, "
        f"{repeats} repeats, loaders side by side in each (target ResumableDataLoader/DataLoader >= {TARGET} "
        "at 200 µs, map-style).\n"
        "CPU µs/sample counts the main process and the workers over the whole run; the CPU ratio "
        "(DataLoader's CPU / the loader's, within each repeat: median, and min-max over the repeats) is the "
        "throughput ratio to expect when CPU is the bottleneck.",
        [
            "dataset",
            "workers",
            "µs/sample",
            "loader",
            "median samples/s",
            "x DataLoader",
            "CPU µs/sample",
            "CPU ratio",
            "CPU ratio min-max",
        ],
        rows,
    )

    calls = 2000 if args.quick else 20000
    seeding_us = seeding_cost_us(calls=calls, repeats=7)
    swap_us = swap_cost_us(calls=calls, repeats=7)
    print_table(
        "Replayable augmentation without workers, per batch (min of 7 repeats): seed Python, NumPy and "
        "torch CPU, then hand the caller's states back (map-style); an iterable copy's generators "
        "swapped in and out around a read.",
        ["what", "µs per batch", "target µs", "stretch µs", "status"],
        [
            [
                "seed + hand-back",
                f"{seeding_us:.1f}",
                f"{SEEDING_TARGET_US:.0f}",
                f"{SEEDING_STRETCH_US:.0f}",
                ("ok" if seeding_us <= SEEDING_TARGET_US else "ABOVE TARGET")
                + ("" if seeding_us <= SEEDING_STRETCH_US else ", above stretch"),
            ],
            ["iterable copy's generators", f"{swap_us:.1f}", "", "", ""],
        ],
    )

    state_costs = []
    for dataset in args.datasets:
        for workers in args.workers:
            for kind in (kind for kind in kinds if kind != "torch"):
                times, size = state_dict_cost(kind, workers, state_calls, args.warmup, dataset)
                state_costs.append(
                    {
                        "dataset": dataset,
                        "loader": LABELS[kind],
                        "num_workers": workers,
                        "median_us": median(times),
                        "p90_us": sorted(times)[int(0.9 * (len(times) - 1))],
                        "calls": len(times),
                        "pickled_bytes": size,
                    }
                )
    print_table(
        f"state_dict() cost per call, mid-stream: one call after each of {state_calls} batches "
        f"(after {args.warmup} warm-up), 0 µs/sample, µs per call.",
        ["dataset", "loader", "workers", "median µs", "p90 µs", "pickled state bytes"],
        [
            [
                c["dataset"],
                c["loader"],
                str(c["num_workers"]),
                f"{c['median_us']:.1f}",
                f"{c['p90_us']:.1f}",
                f"{c['pickled_bytes']:,}",
            ]
            for c in state_costs
        ],
    )

    path = write_json(
        "loader_throughput",
        {
            "settings": {
                "num_workers": list(args.workers),
                "datasets": list(args.datasets),
                "batch_size": BATCH,
                "batches": batches,
                "warmup": args.warmup,
                "repeats": repeats,
                "dataset_size": SIZE,
                "state_calls": state_calls,
            },
            "loaders": {kind: LABELS[kind] for kind in kinds},
            "stateful_dataloader_skipped": None if stateful is not None else why,
            "target_ratio_at_200us": TARGET,
            "results": results,
            "seeding_us_per_batch": seeding_us,
            "seeding_target_us": SEEDING_TARGET_US,
            "seeding_stretch_us": SEEDING_STRETCH_US,
            "iterable_generator_swap_us_per_batch": swap_us,
            "state_dict_cost": state_costs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
