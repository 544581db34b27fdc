"""What a resume point costs the training loop.

1. Blocking time: how long the training thread is held by a resume point
   (``trainer.checkpoint()`` returns once the state is copied to host memory; the
   durable write goes on in the background), against a synchronous ``pause()`` and
   against ``state_dict()`` + ``torch.save`` + flush + fsync of the same state
   (model + AdamW), at ~10.5M and ~100M parameters (``--quick``: 10.5M only).
   Target: point <= 0.25x torch.save + fsync at 100M. The time until the point is
   durable is reported beside it. After one warm-up round the writers take turns in
   rotating order, each after ``os.sync()``; medians are reported.
2. Throughput: training steps of the same model (batch of 4, AdamW) with a resume
   point every 50 steps against none, in alternating segments of 50 steps, so both
   see the same machine load. Target: loss <= 5% at 100M (``--quick``: 10.5M).

Prints a table and writes JSON to ``benchmarks/out/resume_points.json``.

    python -m benchmarks.resume_points            # 10.5M and 100M parameters
    python -m benchmarks.resume_points --quick    # 10.5M only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer_resume import ResumePoints
from trainer_resume.mixin import TrainingResumeMixin, training_step

SIZES = {"10.5M": (1024, 10), "100M": (2048, 24)}
BATCH = 4


class PointTrainer(TrainingResumeMixin):
    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, points: ResumePoints | None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.inputs = torch.randn(
            BATCH, model[0].in_features, generator=torch.Generator().manual_seed(0)
        )
        self._initialize_training_resume(
            {"benchmark": "resume_points"}, version="1", resume_points=points
        )

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {}

    @training_step
    def tick(self) -> None:
        """A step that changes nothing (the blocking measurement needs a new boundary, not work)."""

    @training_step
    def step(self) -> None:
        loss = self.model(self.inputs).square().mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def build(width: int, layers: int) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()  # AdamW state: step, exp_avg, exp_avg_sq for every parameter
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def torch_save_fsync(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with open(path, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())


def measure_blocking(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, repeats: int
) -> dict[str, Any]:
    times: dict[str, list[float]] = {
        "torch_save_fsync": [],
        "pause": [],
        "point": [],
        "point_durable": [],
    }
    order = ["torch_save_fsync", "pause", "point"]
    # One trainer takes every point, as in training: the first copy allocates host
    # memory (timed apart, in round 0), later ones reuse the written point's buffers.
    pointing = PointTrainer(model, optimizer, ResumePoints(directory / "points", keep=1))
    first_point = 0.0
    for repeat in range(repeats + 1):  # round 0 warms up
        for name in order[repeat % 3 :] + order[: repeat % 3]:
            for entry in directory.rglob("*"):  # every run writes a new file, none overwrites
                if entry.is_file():
                    entry.unlink()
            os.sync()
            time.sleep(0.5)
            start = time.perf_counter()
            if name == "torch_save_fsync":
                torch_save_fsync(model, optimizer, directory / "baseline.pt")
            elif name == "pause":
                PointTrainer(model, optimizer, None).pause(directory / "pause.ckpt")
            else:
                pointing.tick()
                start = time.perf_counter()
                handle = pointing.checkpoint()
                blocked = time.perf_counter() - start
                handle.wait()
                if repeat:
                    times["point_durable"].append(time.perf_counter() - start)
                else:
                    first_point = blocked
            elapsed = time.perf_counter() - start if name != "point" else blocked
            if repeat:
                times[name].append(elapsed)
    medians = {f"{name}_median_s": statistics.median(values) for name, values in times.items()}
    return {
        **{f"{name}_s": values for name, values in times.items()},
        **medians,
        "first_point_s": first_point,
        "point_vs_torch_save": medians["point_median_s"] / medians["torch_save_fsync_median_s"],
        "pause_vs_torch_save": medians["pause_median_s"] / medians["torch_save_fsync_median_s"],
    }


def measure_throughput(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, every: int, segments: int
) -> dict[str, Any]:
    points = ResumePoints(directory / "throughput", every_steps=every, keep=2)
    with_points = PointTrainer(model, optimizer, points)
    without = PointTrainer(model, optimizer, None)
    for _ in range(3):  # warm-up
        without.step()
    seconds: dict[str, list[float]] = {"none": [], "points": []}
    for segment in range(segments):
        # Alternate which run goes first, so neither always follows the other's write.
        runs = [("none", without), ("points", with_points)]
        for name, trainer in runs if segment % 2 == 0 else runs[::-1]:
            start = time.perf_counter()
            for _ in range(every):
                trainer.step()  # the point run takes one point in each segment, at its last step
            seconds[name].append(time.perf_counter() - start)
    points.wait()
    none, with_ = sum(seconds["none"]), sum(seconds["points"])
    steps = every * segments
    return {
        "every_steps": every,
        "steps_per_run": steps,
        "segments_none_s": seconds["none"],
        "segments_points_s": seconds["points"],
        "step_none_s": none / steps,
        "step_points_s": with_ / steps,
        "points_written": points.written,
        "points_skipped": points.skipped,
        "throughput_ratio": none / with_,
        "loss_percent": (with_ / none - 1) * 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10.5M parameters only")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each writer (default 3)"
    )
    parser.add_argument("--every", type=int, default=50, help="steps between points (default 50)")
    parser.add_argument(
        "--segments", type=int, default=4, help="segments of --every steps per run (default 4)"
    )
    parser.add_argument(
        "--throughput-size",
        choices=sorted(SIZES),
        default=None,
        help="model of the throughput run (default: the largest measured)",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the files are written (default: a temp dir)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "out" / "resume_points.json"
    )
    args = parser.parse_args()

    labels = ["10.5M"] if args.quick else ["10.5M", "100M"]
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "state": "model + AdamW (exp_avg, exp_avg_sq)",
        "sizes": {},
    }
    rows = [
        (
            "",
            "parameters",
            "torch.save+fsync",
            "pause()",
            "point blocks",
            "first point blocks",
            "point durable",
            "point/torch.save",
        )
    ]
    with tempfile.TemporaryDirectory(prefix="points-bench-", dir=args.dir) as name:
        directory = Path(name)
        for label in labels:
            model, optimizer = build(*SIZES[label])
            parameters = sum(p.numel() for p in model.parameters())
            blocking = measure_blocking(model, optimizer, directory, args.repeats)
            result["sizes"][label] = {"parameters": parameters, "blocking": blocking}
            rows.append(
                (
                    label,
                    f"{parameters / 1e6:.1f} M",
                    f"{blocking['torch_save_fsync_median_s']:.3f} s",
                    f"{blocking['pause_median_s']:.3f} s",
                    f"{blocking['point_median_s']:.3f} s",
                    f"{blocking['first_point_s']:.3f} s",
                    f"{blocking['point_durable_median_s']:.3f} s",
                    f"{blocking['point_vs_torch_save']:.3f}",
                )
            )
            del model, optimizer
        label = args.throughput_size or labels[-1]
        model, optimizer = build(*SIZES[label])
        throughput = measure_throughput(model, optimizer, directory, args.every, args.segments)
        result["throughput"] = {"size": label, **throughput}
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    largest = result["sizes"][labels[-1]]["blocking"]["point_vs_torch_save"]
    print(
        f"point blocking / torch.save+fsync at {labels[-1]}: {largest:.3f} "
        f"(target <= 0.25: {'ok' if largest <= 0.25 else 'ABOVE TARGET'})"
    )
    t = result["throughput"]
    print(
        f"throughput at {label}, a point every {t['every_steps']} steps, {t['steps_per_run']} steps per run: "
        f"step {t['step_none_s'] * 1e3:.1f} ms without points, {t['step_points_s'] * 1e3:.1f} ms with; "
        f"loss {t['loss_percent']:.1f}% (target <= 5%: {'ok' if t['loss_percent'] <= 5 else 'ABOVE TARGET'}); "
        f"{t['points_written']} points written"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
