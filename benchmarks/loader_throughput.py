"""Throughput and state_dict() cost: ResumableDataLoader, torch's DataLoader and torchdata's StatefulDataLoader.

All three loaders read the same map-style dataset whose ``__getitem__`` spins for a
fixed CPU time per sample (0 and 200 µs), with ``batch_size=32``, ``num_workers`` 0
and 2, and otherwise default settings (``prefetch_factor=2`` with workers, no pinned
memory, workers not persistent). The order is a fresh shuffle in each:

- ``DataLoader(shuffle=True)``: torch's ``RandomSampler``, one ``torch.randperm`` per epoch;
- ``StatefulDataLoader(shuffle=True)``: torchdata's stateful ``RandomSampler`` (the same
  permutation per epoch, plus a count of yielded indices), and by default a snapshot
  of each worker's state sent with every batch (``snapshot_every_n_steps=1``);
- ``ResumableDataLoader(shuffle=True, resumable=True)``: the same ``RandomSampler``,
  whose epoch is computed (indices only) when the epoch starts; it also seeds Python,
  NumPy and torch once per batch and hands the caller's states back (the price of
  replayable augmentation) and records each delivered batch.

The three permutations differ (each loader draws its own), and no run reaches the end
of the 200,000-sample epoch, so epoch boundaries play no part (the start of the epoch
does: its cost is in the CPU column). Each run times ``--batches`` batches after
``--warmup`` batches (worker start-up excluded); the loaders alternate, in an order
rotated every repeat, so drift in machine load hits all of them. Targets, on the CPU
ratio (DataLoader's CPU time / the loader's): >= 0.97 at 200 µs per sample (0 and 2
workers), >= 0.85 at 0 µs per sample without workers, and at every point at least
StatefulDataLoader's within 0.02; and ResumableDataLoader / DataLoader samples/s
>= 0.97 at 200 µs per sample.

Then the per-batch price of replayable augmentation without workers, on its own:
seeding Python, NumPy and torch CPU for one batch and handing the caller's states
back (``CallerGenerators.run`` around ``seed_batch`` and an empty fetch), the
minimum over repeats of the mean of many calls. Target: about 15 µs per batch.

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
import resource
import time
import timeit
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import busy_wait_cpu, median, print_table, write_json
from trainer_resume.loaders import ResumableDataLoader

SIZE = 200_000
BATCH = 32
WORKER_COUNTS = (0, 2)
TARGET = 0.97
LOADERS = ("torch", "stateful", "resumable")
LABELS = {
    "torch": "DataLoader",
    "stateful": "StatefulDataLoader",
    "resumable": "ResumableDataLoader",
}


class SpinDataset(Dataset):
    """``dataset[i]`` spins ``cost_us`` of CPU time, then returns a small float tensor."""

    def __init__(self, cost_us: float, size: int = SIZE) -> None:
        self.cost_us = cost_us
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        busy_wait_cpu(self.cost_us)
        return torch.full((8,), float(index))


def stateful_loader_class() -> tuple[type | None, str]:
    """torchdata's StatefulDataLoader, or None and why it is not available."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:  # the bench extra is optional
        return None, f"torchdata not importable ({error})"
    return StatefulDataLoader, ""


def make_loader(kind: str, cost_us: float, workers: int = 2) -> DataLoader:
    dataset = SpinDataset(cost_us)
    if kind == "torch":
        return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers)
    if kind == "stateful":
        stateful, why = stateful_loader_class()
        if stateful is None:
            raise RuntimeError(why)
        with (
            warnings.catch_warnings()
        ):  # torchdata warns about its own deprecations on construction
            warnings.simplefilter("ignore")
            return stateful(dataset, batch_size=BATCH, shuffle=True, num_workers=workers)
    return ResumableDataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=workers, resumable=True
    )


def _cpu_seconds() -> float:
    # This process plus its reaped children: the workers, once the loader joined them.
    # getrusage, not os.times: clock ticks (10 ms) are too coarse for a sub-second run.
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _stop_workers(loader: DataLoader, iterator: Any) -> None:
    # Join the workers now, so that their CPU time is reaped and counted: StatefulDataLoader
    # keeps its iterator (for state_dict()), so dropping ours would not end them.
    if isinstance(loader, ResumableDataLoader):
        loader.close()
        return
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()


def measure(
    kind: str, cost_us: float, batches: int, warmup: int, workers: int = 2
) -> tuple[float, float]:
    """Samples per second after warm-up, and CPU µs per sample over the whole run
    (main process and workers, start-up and warm-up included)."""
    cpu_start = _cpu_seconds()
    loader = make_loader(kind, cost_us, workers)
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    _stop_workers(loader, iterator)
    cpu = _cpu_seconds() - cpu_start
    return batches * BATCH / elapsed, cpu / ((batches + warmup) * BATCH) * 1e6


def state_dict_cost(kind: str, workers: int, calls: int, warmup: int) -> tuple[list[float], int]:
    """µs of each state_dict() call, each after one more delivered batch, and the pickled state's size."""
    loader = make_loader(kind, 0.0, workers)
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
    _stop_workers(loader, iterator)
    return times, size


SEEDING_TARGET_US = 15.0  # seeding + hand-back per batch, num_workers=0


def seeding_cost_us(calls: int, repeats: int) -> float:
    """Microseconds per batch to seed the global generators and hand the caller's back."""
    from trainer_resume.loaders._seeding import CallerGenerators, seed_batch

    generators = CallerGenerators()
    seed = 0x1234_5678_9ABC_DEF0

    def one_batch() -> None:
        generators.run(lambda: seed_batch(seed), lambda: None)

    return min(timeit.timeit(one_batch, number=calls) / calls for _ in range(repeats)) * 1e6


def _runs_text(values: list[float]) -> str:
    return " ".join(f"{value:,.0f}" for value in values)


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

    results = []
    for workers in args.workers:
        for cost in args.costs:
            runs: dict[str, list[float]] = {kind: [] for kind in kinds}
            cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
            for repeat in range(repeats):
                shift = repeat % len(kinds)
                for kind in kinds[shift:] + kinds[:shift]:
                    rate, cpu_per_sample = measure(kind, cost, batches, args.warmup, workers)
                    runs[kind].append(rate)
                    cpu[kind].append(cpu_per_sample)
            rates = {kind: median(values) for kind, values in runs.items()}
            cpus = {kind: median(values) for kind, values in cpu.items()}
            entry: dict[str, Any] = {"num_workers": workers, "cost_us": cost}
            for kind in kinds:
                entry[f"{kind}_samples_per_s"] = rates[kind]
                entry[f"{kind}_cpu_us_per_sample"] = cpus[kind]
                if kind != "torch":
                    prefix = (
                        "" if kind == "resumable" else f"{kind}_"
                    )  # "ratio" and "cpu_ratio": the resumable's
                    entry[f"{prefix}ratio"] = rates[kind] / rates["torch"]
                    entry[f"{prefix}cpu_ratio"] = cpus["torch"] / cpus[kind]
            entry["runs"] = runs
            entry["cpu_runs"] = cpu
            results.append(entry)

    rows = []
    for entry in results:
        for kind in kinds:
            prefix = "" if kind == "resumable" else f"{kind}_"
            rows.append(
                [
                    str(entry["num_workers"]),
                    f"{entry['cost_us']:.0f}",
                    LABELS[kind],
                    f"{entry[f'{kind}_samples_per_s']:,.0f}",
                    _runs_text(entry["runs"][kind]),
                    "1.000" if kind == "torch" else f"{entry[f'{prefix}ratio']:.3f}",
                    f"{entry[f'{kind}_cpu_us_per_sample']:.1f}",
                    "1.000" if kind == "torch" else f"{entry[f'{prefix}cpu_ratio']:.3f}",
                ]
            )
    print_table(
        f"Loader throughput: batch_size={BATCH}, {batches} batches per run after {args.warmup} warm-up, "
        f"median of {repeats} (target ResumableDataLoader/DataLoader >= {TARGET} at 200 µs).\n"
        "CPU µs/sample counts the main process and the workers over the whole run; its ratio "
        "(DataLoader's CPU / the loader's) is the throughput ratio to expect when CPU is the bottleneck, "
        "and is not disturbed by other load.",
        [
            "workers",
            "µs/sample",
            "loader",
            "median samples/s",
            "all runs (samples/s)",
            "x DataLoader",
            "CPU µs/sample",
            "CPU ratio",
        ],
        rows,
    )

    seeding_us = seeding_cost_us(calls=2000 if args.quick else 20000, repeats=7)
    print_table(
        "Replayable augmentation without workers, per batch: seed Python, NumPy and torch CPU, "
        "then hand the caller's states back (min of 7 repeats).",
        ["µs per batch", "target µs", "status"],
        [
            [
                f"{seeding_us:.1f}",
                f"{SEEDING_TARGET_US:.0f}",
                "ok" if seeding_us <= SEEDING_TARGET_US else "ABOVE TARGET",
            ]
        ],
    )

    state_costs = []
    for workers in args.workers:
        for kind in (kind for kind in kinds if kind != "torch"):
            times, size = state_dict_cost(kind, workers, state_calls, args.warmup)
            state_costs.append(
                {
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
        ["loader", "workers", "median µs", "p90 µs", "pickled state bytes"],
        [
            [
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
            "state_dict_cost": state_costs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
