"""Throughput of ResumableDataLoader against torch's DataLoader with equivalent settings.

Both loaders read the same map-style dataset whose ``__getitem__`` spins for a fixed
CPU time per sample (0 and 200 µs), with ``num_workers=2``, ``batch_size=32`` and a
shuffled order (torch: ``shuffle=True``; resumable: a resumable
``InfiniteRandomSampler``). The resumable loader also seeds Python, NumPy and torch
before every sample and collate (the price of replayable augmentation) and records
each delivered batch. Each run times ``--batches`` batches after ``--warmup`` batches
(worker start-up excluded); torch and resumable runs alternate so drift in machine
load hits both. Target: resumable / torch >= 0.97 at 200 µs per sample.

    python benchmarks/loader_throughput.py            # full run
    python benchmarks/loader_throughput.py --quick    # short run

Prints a table and writes benchmarks/out/loader_throughput.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import busy_wait_cpu, median, print_table, write_json  # noqa: E402

from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader  # noqa: E402

SIZE = 200_000
BATCH = 32
WORKERS = 2
TARGET = 0.97


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


def make_loader(kind: str, cost_us: float) -> DataLoader:
    dataset = SpinDataset(cost_us)
    if kind == "torch":
        return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS)
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    return ResumableDataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, resumable=True)


def _cpu_seconds() -> float:
    # This process plus its reaped children: the workers, once the loader joined them.
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def measure(kind: str, cost_us: float, batches: int, warmup: int) -> tuple[float, float]:
    """Samples per second after warm-up, and CPU µs per sample over the whole run
    (main process and workers, start-up and warm-up included)."""
    cpu_start = _cpu_seconds()
    loader = make_loader(kind, cost_us)
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    del iterator  # torch's iterator joins its workers when dropped
    if isinstance(loader, ResumableDataLoader):
        loader.close()
    cpu = _cpu_seconds() - cpu_start
    return batches * BATCH / elapsed, cpu / ((batches + warmup) * BATCH) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--costs", type=float, nargs="+", default=[0.0, 200.0], help="µs per sample")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    batches = args.batches or (100 if args.quick else 400)

    results = []
    for cost in args.costs:
        runs: dict[str, list[float]] = {"torch": [], "resumable": []}
        cpu: dict[str, list[float]] = {"torch": [], "resumable": []}
        for _ in range(repeats):
            for kind in ("torch", "resumable"):
                rate, cpu_per_sample = measure(kind, cost, batches, args.warmup)
                runs[kind].append(rate)
                cpu[kind].append(cpu_per_sample)
        torch_median, ours_median = median(runs["torch"]), median(runs["resumable"])
        results.append(
            {
                "cost_us": cost,
                "torch_samples_per_s": torch_median,
                "resumable_samples_per_s": ours_median,
                "ratio": ours_median / torch_median,
                "runs": runs,
                "torch_cpu_us_per_sample": median(cpu["torch"]),
                "resumable_cpu_us_per_sample": median(cpu["resumable"]),
                "cpu_ratio": median(cpu["torch"]) / median(cpu["resumable"]),
                "cpu_runs": cpu,
            }
        )

    rows = []
    for result in results:
        for kind in ("torch", "resumable"):
            rows.append(
                [
                    f"{result['cost_us']:.0f}",
                    kind,
                    f"{result[f'{kind}_samples_per_s']:,.0f}",
                    " ".join(f"{value:,.0f}" for value in result["runs"][kind]),
                    f"{result['ratio']:.3f}" if kind == "resumable" else "",
                    f"{result[f'{kind}_cpu_us_per_sample']:.1f}",
                    f"{result['cpu_ratio']:.3f}" if kind == "resumable" else "",
                ]
            )
    print_table(
        f"Loader throughput: num_workers={WORKERS}, batch_size={BATCH}, {batches} batches per run after "
        f"{args.warmup} warm-up, median of {repeats} (target ratio >= {TARGET} at 200 µs).\n"
        "CPU µs/sample counts the main process and the workers over the whole run; its ratio is the "
        "throughput ratio to expect when CPU is the bottleneck, and is not disturbed by other load.",
        [
            "µs/sample",
            "loader",
            "median samples/s",
            "all runs (samples/s)",
            "resumable/torch",
            "CPU µs/sample",
            "CPU ratio",
        ],
        rows,
    )
    path = write_json(
        "loader_throughput",
        {
            "settings": {
                "num_workers": WORKERS,
                "batch_size": BATCH,
                "batches": batches,
                "warmup": args.warmup,
                "repeats": repeats,
                "dataset_size": SIZE,
            },
            "target_ratio_at_200us": TARGET,
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
