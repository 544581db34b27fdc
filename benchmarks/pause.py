"""What a pause costs: blocking time, file size with shared keys, and @training_step overhead.

1. ``pause()`` blocking time against ``state_dict()`` + ``torch.save`` + flush + fsync
   of the same state (model and AdamW state) for a ~100M-parameter model (``--quick``:
   ~10M). Target: ratio <= 0.95. ``save_checkpoint`` of the same state is timed too,
   which separates the durable write's cost (temp file, BLAKE3, fsync of file and
   directory, rename) from the mixin's. After one warm-up round the writers take
   turns in rotating order, each after ``os.sync()``; the median is reported.
2. The pause file size when the regular checkpoint shares the model and optimizer
   states with the resume objects, against the same pause state laid out with
   separate copies.
3. ``@training_step`` and ``@serialized_training`` overhead per call, in microseconds,
   against a plain method call.

Prints a table and writes JSON to ``benchmarks/out/pause.json``.

    python -m benchmarks.pause            # ~100M parameters (about 1.2 GB per file)
    python -m benchmarks.pause --quick    # ~10M parameters
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer_resume.durable import save_checkpoint
from trainer_resume.mixin import TrainingResumeMixin, serialized_training, training_step
from trainer_resume.state import cpu_state

PAUSE_TARGET = 0.95  # pause() / (torch.save + fsync), medians


def build_model(width: int, layers: int) -> nn.Sequential:
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


class BenchTrainer(TrainingResumeMixin):
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, shared: bool) -> None:
        self.model = model
        self.optimizer = optimizer
        self.shared = shared
        self.captured: dict[str, Any] | None = None
        self._initialize_training_resume({"benchmark": "pause"}, version="1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {}

    def _regular_checkpoint(self):
        if not self.shared:
            return None
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _resume_shared_keys(self):
        return ("model", "optimizer") if self.shared else ()

    def _save_pause_checkpoint(self, checkpoint, path):
        if self.captured is None:
            self.captured = checkpoint
        super()._save_pause_checkpoint(checkpoint, path)

    @training_step
    def step(self) -> None:
        return None

    @serialized_training
    def serialized(self) -> None:
        return None

    def plain(self) -> None:
        return None


def torch_save_fsync(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with open(path, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def durable_save(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def measure_blocking(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, repeats: int
) -> dict[str, Any]:
    paths = {
        "baseline": directory / "baseline.pt",
        "durable": directory / "durable.ckpt",
        "pause": directory / "pause.ckpt",
    }
    writers = {
        "baseline": functools.partial(torch_save_fsync, model, optimizer, paths["baseline"]),
        "durable": functools.partial(durable_save, model, optimizer, paths["durable"]),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    order = list(paths)
    for repeat in range(repeats + 1):  # round 0 warms up (first writes of a process are slow)
        for name in (
            order[repeat % 3 :] + order[: repeat % 3]
        ):  # rotate: no writer always goes first
            paths[name].unlink(
                missing_ok=True
            )  # every run writes a new file, none overwrites in place
            os.sync()  # start each write with no other dirty data queued for the disk
            time.sleep(0.5)
            if name == "pause":
                # A fresh trainer per run: pause() leaves its trainer paused, and a resume()
                # between runs would fill memory and the page cache with a 1.2 GB read.
                elapsed = timed(
                    functools.partial(
                        BenchTrainer(model, optimizer, shared=False).pause, paths["pause"]
                    )
                )
            else:
                elapsed = timed(writers[name])
            if repeat:
                times[name].append(elapsed)
    BenchTrainer(model, optimizer, shared=False).resume(
        paths["pause"]
    )  # the file is a good pause file
    baseline, durable, pause = times["baseline"], times["durable"], times["pause"]
    baseline_path, pause_path = paths["baseline"], paths["pause"]
    return {
        "torch_save_fsync_s": baseline,
        "save_checkpoint_s": durable,
        "pause_s": pause,
        "torch_save_fsync_median_s": statistics.median(baseline),
        "save_checkpoint_median_s": statistics.median(durable),
        "pause_median_s": statistics.median(pause),
        "ratio": statistics.median(pause) / statistics.median(baseline),
        "pause_vs_save_checkpoint_ratio": statistics.median(pause) / statistics.median(durable),
        "baseline_bytes": baseline_path.stat().st_size,
        "pause_bytes": pause_path.stat().st_size,
    }


def measure_sizes(trainer: BenchTrainer, directory: Path) -> dict[str, Any]:
    shared_path, separate_path = directory / "shared.ckpt", directory / "separate.ckpt"
    trainer.captured = None
    trainer.pause(shared_path)
    trainer.resume(shared_path)
    checkpoint = dict(trainer.captured)  # type: ignore[arg-type]
    trainer.captured = None
    checkpoint["objects"] = cpu_state(checkpoint["objects"])  # each object with its own copy
    checkpoint["shared_keys"] = []
    save_checkpoint(checkpoint, separate_path)
    del checkpoint
    shared, separate = shared_path.stat().st_size, separate_path.stat().st_size
    shared_path.unlink()
    separate_path.unlink()
    return {"shared_bytes": shared, "separate_bytes": separate, "ratio": shared / separate}


def measure_overhead(trainer: BenchTrainer, number: int) -> dict[str, float]:
    def per_call(method) -> float:
        return min(timeit.repeat(method, number=number, repeat=7)) / number * 1e6

    plain = per_call(trainer.plain)
    step = per_call(trainer.step)
    serialized = per_call(trainer.serialized)
    return {
        "plain_call_us": plain,
        "training_step_call_us": step,
        "training_step_overhead_us": step - plain,
        "serialized_training_call_us": serialized,
        "serialized_training_overhead_us": serialized - plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~10M parameters instead of ~100M")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs of each writer (default 5)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the files are written (default: a temp dir)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "pause.json")
    args = parser.parse_args()

    width, layers = (1024, 10) if args.quick else (2048, 24)
    torch.manual_seed(0)
    model = build_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()  # AdamW state: step, exp_avg, exp_avg_sq for every parameter
    optimizer.zero_grad(set_to_none=True)
    parameters = sum(p.numel() for p in model.parameters())

    with tempfile.TemporaryDirectory(prefix="pause-bench-", dir=args.dir) as name:
        directory = Path(name)
        blocking = measure_blocking(model, optimizer, directory, args.repeats)
        sizes = measure_sizes(BenchTrainer(model, optimizer, shared=True), directory)
    overhead = measure_overhead(BenchTrainer(model, optimizer, shared=False), 200_000)

    result = {
        "parameters": parameters,
        "state": "model + AdamW (exp_avg, exp_avg_sq)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "blocking": blocking,
        "file_size": sizes,
        "overhead": overhead,
    }
    mb = 1e6
    rows = [
        ("parameters", f"{parameters / 1e6:.1f} M", ""),
        (
            "state_dict + torch.save + fsync (median)",
            f"{blocking['torch_save_fsync_median_s']:.3f} s",
            f"{blocking['baseline_bytes'] / mb:.0f} MB",
        ),
        (
            "save_checkpoint of the same state (median)",
            f"{blocking['save_checkpoint_median_s']:.3f} s",
            "durable write alone",
        ),
        (
            "pause() blocking (median)",
            f"{blocking['pause_median_s']:.3f} s",
            f"{blocking['pause_bytes'] / mb:.0f} MB",
        ),
        (
            f"pause / torch.save ratio (target <= {PAUSE_TARGET})",
            f"{blocking['ratio']:.3f}",
            "ok" if blocking["ratio"] <= PAUSE_TARGET else "ABOVE TARGET",
        ),
        ("pause file, shared keys", f"{sizes['shared_bytes'] / mb:.0f} MB", ""),
        (
            "pause file, separate copies",
            f"{sizes['separate_bytes'] / mb:.0f} MB",
            f"shared/separate {sizes['ratio']:.3f}",
        ),
        ("plain method call", f"{overhead['plain_call_us']:.3f} us", ""),
        (
            "@training_step call",
            f"{overhead['training_step_call_us']:.3f} us",
            f"+{overhead['training_step_overhead_us']:.3f} us",
        ),
        (
            "@serialized_training call",
            f"{overhead['serialized_training_call_us']:.3f} us",
            f"+{overhead['serialized_training_overhead_us']:.3f} us",
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(
        f"pause / save_checkpoint ratio: {blocking['pause_vs_save_checkpoint_ratio']:.3f} (the mixin's own share)"
    )
    for key in ("torch_save_fsync_s", "save_checkpoint_s", "pause_s"):
        print(f"runs {key[:-2]}: {' '.join(f'{t:.3f}' for t in blocking[key])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
