"""Wall time and build calls per epoch: ReuseDataLoader (lifetime 1, 2, 4) against a plain DataLoader.

Every loader runs the same ``build``: a busy-wait of ``--cost-ms`` milliseconds
(CPU-bound preparation, as decoding and augmenting are) followed by a random
3x64x64 float image. The loop only draws batches, so the wall time is the input
pipeline's. Workers are persistent and shared across epochs.

    python -m benchmarks.reuse            # 512 samples, 6 epochs
    python -m benchmarks.reuse --quick    # 64 samples, 3 epochs

Prints a table and writes benchmarks/out/reuse.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from trainer_resume.loaders.reuse import ReuseDataLoader, ReuseKey
from trainer_resume.rng import derive_seed, rng_scope

OUT = Path(__file__).resolve().parent / "out" / "reuse.json"
SEED = 1234
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _prepare(cost_s: float) -> torch.Tensor:
    deadline = time.perf_counter() + cost_s
    while time.perf_counter() < deadline:
        pass
    return torch.rand(3, 64, 64)


class _Counter:
    """Build calls per process in a shared tensor (one row each, so no increment
    races) and the worker pids, whose CPU time the main process reads from /proc."""

    def __init__(self, workers: int) -> None:
        self.counts = torch.zeros(workers + 1, dtype=torch.int64).share_memory_()
        self.pids = torch.zeros(workers, dtype=torch.int64).share_memory_()

    def register(self, worker_id: int) -> None:
        """``worker_init_fn``."""
        self.pids[worker_id] = os.getpid()

    def hit(self) -> None:
        info = get_worker_info()
        self.counts[0 if info is None else info.id + 1] += 1

    def total(self) -> int:
        return int(self.counts.sum())

    def cpu_seconds(self) -> float:
        """CPU time of the main process and of the live workers (Linux /proc; NaN elsewhere)."""
        times = os.times()
        total = times.user + times.system
        for pid in self.pids.tolist():
            if pid:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    return float("nan")
                total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
        return total


class ReuseBuild:
    def __init__(self, cost_s: float, counter: _Counter) -> None:
        self.cost_s = cost_s
        self.counter = counter

    def __call__(self, key: ReuseKey) -> torch.Tensor:
        self.counter.hit()
        return _prepare(self.cost_s)


class PlainDataset(Dataset):
    """The same preparation every epoch: what a DataLoader without reuse does."""

    def __init__(self, size: int, cost_s: float, counter: _Counter) -> None:
        self.size = size
        self.cost_s = cost_s
        self.counter = counter

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.counter.hit()
        seed = derive_seed(SEED, index)
        with rng_scope(seed):
            return _prepare(self.cost_s)


def _measure(loader: Any, counter: _Counter, epochs: int) -> dict[str, list[float] | list[int]]:
    seconds, cpu, builds = [], [], []
    for _ in range(epochs):
        before, cpu_before = counter.total(), counter.cpu_seconds()
        start = time.perf_counter()
        for _batch in loader:
            pass
        seconds.append(time.perf_counter() - start)
        # Persistent workers idle between epochs, so this is the epoch's CPU
        # (epoch 0 includes starting the workers).
        cpu.append(counter.cpu_seconds() - cpu_before)
        builds.append(counter.total() - before)
    return {"seconds": seconds, "cpu_seconds": cpu, "builds": builds}


def run(
    size: int, epochs: int, workers: int, cost_ms: float, batch_size: int
) -> list[dict[str, Any]]:
    cost_s = cost_ms / 1000
    results = []
    counter = _Counter(workers)
    common = {
        "batch_size": batch_size,
        "num_workers": workers,
        "persistent_workers": workers > 0,
        "worker_init_fn": counter.register,
    }
    plain = DataLoader(PlainDataset(size, cost_s, counter), shuffle=True, **common)
    results.append({"loader": "DataLoader", "lifetime": None, **_measure(plain, counter, epochs)})
    del plain
    for lifetime in (1, 2, 4):
        counter = _Counter(workers)
        common["worker_init_fn"] = counter.register
        with tempfile.TemporaryDirectory(prefix="reuse-bench-") as directory:
            loader = ReuseDataLoader(
                ReuseBuild(cost_s, counter),
                size,
                directory,
                lifetime=lifetime,
                seed=SEED,
                shuffle=True,
                **common,
            )
            measured = _measure(loader, counter, epochs)
            del loader  # shut persistent workers down before the directory goes
        results.append({"loader": "ReuseDataLoader", "lifetime": lifetime, **measured})
    return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _table(results: list[dict[str, Any]], epochs: int) -> str:
    rows = [
        [
            "loader",
            "lifetime",
            "epoch 0 wall s",
            f"epochs 1-{epochs - 1} wall s (mean)",
            f"epochs 1-{epochs - 1} CPU s (mean)",
            "total wall s",
            "builds per epoch",
        ],
    ]
    for result in results:
        seconds, cpu, builds = result["seconds"], result["cpu_seconds"], result["builds"]
        rows.append(
            [
                result["loader"],
                "-" if result["lifetime"] is None else str(result["lifetime"]),
                f"{seconds[0]:.3f}",
                f"{_mean(seconds[1:]):.3f}",
                f"{_mean(cpu[1:]):.3f}",
                f"{sum(seconds):.3f}",
                " ".join(str(count) for count in builds),
            ]
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 samples, 3 epochs (a smoke run)")
    parser.add_argument("--size", type=int, default=None, help="samples per epoch (default 512)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default 6)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cost-ms", type=float, default=2.0, help="busy-wait per build")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    size = args.size or (64 if args.quick else 512)
    epochs = args.epochs or (3 if args.quick else 6)

    # More workers than cores is the point of the setting; torch warns about it.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    results = run(size, epochs, args.workers, args.cost_ms, args.batch_size)
    settings = {
        "size": size,
        "epochs": epochs,
        "workers": args.workers,
        "cost_ms": args.cost_ms,
        "batch_size": args.batch_size,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(f"reuse benchmark: {settings}")
    print(_table(results, epochs))
    print(
        "wall: time to draw every batch of the epoch; CPU: user + system time of the main process and\n"
        "the workers during the epoch; builds: calls of build (the rest of the samples were loaded)"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"settings": settings, "results": results}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
