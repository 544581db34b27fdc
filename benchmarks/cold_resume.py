"""Cold resumes and the disk's bandwidth: resume() and pause() against plain reads and writes.

* **Small, cold** (~10M parameters + AdamW): ``resume()`` of a pause file evicted from the
  page cache against ``torch.load(weights_only=True)`` + ``load_state_dict`` of a
  ``torch.save`` file of the same state, evicted the same way (written, fsync'd, then
  ``posix_fadvise(DONTNEED)``); the two alternate in each round, medians over rounds.
* **Large** (~100M parameters + AdamW, gradients kept: about 1.7 GB): ``pause()``'s write
  bandwidth (file bytes / seconds) against plain 16 MiB writes of as many bytes followed
  by fsync, and ``resume()``'s read bandwidth from the evicted pause file against plain
  16 MiB reads of the evicted plain file, in the same run (alternating each round,
  an even number of rounds: which write goes first matters on some disks).

    python -m benchmarks.cold_resume --quick

Prints the tables and writes benchmarks/out/cold_resume.json (read by ``python -m
benchmarks`` for the targets in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import print_table, write_json
from benchmarks.checkpointing import SIZES, build_model
from benchmarks.pause import BenchTrainer, torch_save_fsync

CHUNK = 16 << 20  # the plain reads' and writes' size
SMALL_TARGET = 1.10  # resume() / (torch.load + load_state_dict), both cold, medians
BANDWIDTH_TARGET = 0.90  # pause() and resume() bandwidth / the plain writes' and reads'


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (written back first)."""
    files = [path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]
    for item in files:
        descriptor = os.open(item, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def file_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def timed(action: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def plain_write(path: Path, size: int) -> None:
    """``size`` bytes in 16 MiB writes, then fsync (the disk's write bandwidth)."""
    block = os.urandom(CHUNK)
    with open(path, "wb", buffering=0) as file:
        left = size
        while left > 0:
            left -= file.write(block[: min(CHUNK, left)])
        os.fsync(file.fileno())


def plain_read(path: Path) -> None:
    """The whole file in 16 MiB reads (the disk's read bandwidth, when it is evicted)."""
    buffer = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as file:
        while file.readinto(buffer):
            pass


def _trainer(label: str, gradients: bool) -> BenchTrainer:
    model, optimizer = build_model(*SIZES[label])
    if gradients:  # the gradients of a step in progress, saved by the pause
        width = SIZES[label][0]
        model(torch.randn(2, width)).square().mean().backward()
    return BenchTrainer(model, optimizer, shared=False)


def small_cold(directory: Path, rounds: int) -> dict[str, Any]:
    trainer = _trainer("10M", gradients=False)
    model, optimizer = trainer.model, trainer.optimizer
    pause_path, torch_path = directory / "small.pause", directory / "small.pt"

    def torch_load() -> None:
        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    loads = {"resume()": lambda: trainer.resume(pause_path), "torch.load": torch_load}
    times: dict[str, list[float]] = {name: [] for name in loads}
    for number in range(rounds):
        trainer.pause(pause_path)
        torch_save_fsync(model, optimizer, torch_path)
        names = list(loads) if number % 2 == 0 else list(reversed(loads))
        for name in names:
            evict(pause_path)
            evict(torch_path)
            times[name].append(timed(loads[name]))
    ratios = [ours / theirs for ours, theirs in zip(times["resume()"], times["torch.load"])]
    return {
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "pause_file_bytes": file_bytes(pause_path),
        "torch_file_bytes": file_bytes(torch_path),
        "seconds": times,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
    }


def large_bandwidth(directory: Path, rounds: int) -> dict[str, Any]:
    trainer = _trainer("100M", gradients=True)
    pause_path, plain_path = directory / "large.pause", directory / "large.bin"
    result: dict[str, list[float]] = {
        "pause_write": [],
        "plain_write": [],
        "resume_read": [],
        "plain_read": [],
    }
    written = [0]  # the pause file's size, for the plain writes
    for number in range(rounds):
        for path in (pause_path, plain_path):
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        os.sync()
        writes: list[tuple[str, Callable[[], object]]] = [
            ("pause_write", lambda: trainer.pause(pause_path)),
            ("plain_write", lambda: plain_write(plain_path, written[0])),
        ]
        if number % 2:  # the first round writes the pause first: it gives the size
            writes.reverse()
        for name, action in writes:
            seconds = timed(action)
            if name == "pause_write":
                written[0] = file_bytes(pause_path)
            result[name].append(seconds)
        reads: list[tuple[str, Callable[[], object]]] = [
            ("resume_read", lambda: trainer.resume(pause_path)),
            ("plain_read", lambda: plain_read(plain_path)),
        ]
        if number % 2:
            reads.reverse()
        for name, action in reads:
            evict(pause_path)
            evict(plain_path)
            result[name].append(timed(action))
    size = written[0]
    bandwidth = {name: [size / seconds for seconds in values] for name, values in result.items()}
    write_ratios = [
        ours / theirs for ours, theirs in zip(bandwidth["pause_write"], bandwidth["plain_write"])
    ]
    read_ratios = [
        ours / theirs for ours, theirs in zip(bandwidth["resume_read"], bandwidth["plain_read"])
    ]
    return {
        "parameters": sum(parameter.numel() for parameter in trainer.model.parameters()),
        "file_bytes": size,
        "seconds": result,
        "bytes_per_s": bandwidth,
        "write_ratios": write_ratios,
        "read_ratios": read_ratios,
        "median_write_ratio": statistics.median(write_ratios),
        "median_read_ratio": statistics.median(read_ratios),
    }


def _spread(values: list[float], digits: int = 3) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the small state")
    parser.add_argument("--large-rounds", type=int, default=None, help="rounds of the large")
    parser.add_argument("--skip-large", action="store_true", help="only the small state")
    parser.add_argument("--directory", type=Path, default=None, help="where files are written")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 9)
    # An even number of large rounds, so that each order of the two writes counts alike
    # (on this machine the first of a round's two writes was the faster in 5 of 6
    # rounds, by up to 2.6x), and a median of more than two.
    large_rounds = args.large_rounds or (4 if args.quick else 6)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.directory) as name:
        directory = Path(name)
        small = small_cold(directory, rounds)
        large = None if args.skip_large else large_bandwidth(directory, large_rounds)
    print_table(
        f"Cold resume, {small['parameters'] / 1e6:.1f}M parameters + AdamW "
        f"({small['pause_file_bytes'] / (1 << 20):.1f} MiB pause file), files evicted from the "
        f"page cache, {rounds} rounds",
        ["method", "median s", "min-max s"],
        [
            [name, f"{statistics.median(values):.4f}", _spread(values, 4)]
            for name, values in small["seconds"].items()
        ]
        + [
            [
                "ratio resume() / torch.load + load_state_dict",
                f"{small['median_ratio']:.3f}",
                _spread(small["ratios"]),
            ]
        ],
    )
    if large is not None:
        print_table(
            f"Bandwidth, {large['parameters'] / 1e6:.1f}M parameters + AdamW + gradients "
            f"({large['file_bytes'] / (1 << 30):.2f} GiB), {large_rounds} rounds",
            ["what", "median MiB/s", "min-max MiB/s"],
            [
                [
                    name,
                    f"{statistics.median(values) / (1 << 20):.0f}",
                    _spread([value / (1 << 20) for value in values], 0),
                ]
                for name, values in large["bytes_per_s"].items()
            ]
            + [
                [
                    "ratio pause() / plain writes",
                    f"{large['median_write_ratio']:.3f}",
                    _spread(large["write_ratios"]),
                ],
                [
                    "ratio resume() / plain reads",
                    f"{large['median_read_ratio']:.3f}",
                    _spread(large["read_ratios"]),
                ],
            ],
        )
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    path = write_json(
        "cold_resume",
        {
            "small": small,
            "large": large,
            "small_target": SMALL_TARGET,
            "bandwidth_target": BANDWIDTH_TARGET,
            "chunk_bytes": CHUNK,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
