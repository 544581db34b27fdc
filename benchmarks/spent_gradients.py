"""What pauses and resume points of a ``zero_grad()``-first loop carry of its gradients.

In a loop that calls ``optimizer.zero_grad()`` before its backward (the tutorials' and
nanoGPT's order) every step boundary holds spent gradients. A trainer that declares
``spent_gradients="drop"`` (its loop never reads them) leaves them out of pauses and
resume points once the loop has shown that it sets them to ``None`` (at its second
step); before that (after its first step) they are saved, as the default always saves
them.
Both states side by side, AdamW at ~100M parameters (``--quick``: 10.5M):

1. File size: ``pause()`` against ``torch.save`` of the model's and the optimizer's
   ``state_dict()``. Target: the pause file of the spent state no larger than that + 1%.
2. Blocking time: how long ``trainer.checkpoint()`` holds the training thread (the
   copy to host memory; the durable write goes on in the background) against
   ``state_dict()`` + ``torch.save`` + flush + fsync. After one warm-up round (the
   points' host buffers are allocated there) the three take turns in rotating order,
   each after ``os.sync()``; medians. Target: the spent state's point <= 0.12x.

Prints a table and writes JSON to ``benchmarks/out/spent_gradients.json``.

    python -m benchmarks.spent_gradients            # 100.7M parameters
    python -m benchmarks.spent_gradients --quick    # 10.5M
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks._common import print_table, write_json
from benchmarks.resume_points import SIZES, build, torch_save_fsync
from trainer_resume import ResumePoints
from trainer_resume.mixin import TrainingResumeMixin, training_step

BLOCKING_TARGET = 0.12  # point blocking / (torch.save + fsync), medians
SIZE_TARGET = 1.01  # pause file / torch.save file of model + optimizer
BATCH = 4


class ZeroGradFirstTrainer(TrainingResumeMixin):
    def __init__(
        self, model: nn.Sequential, optimizer: torch.optim.Optimizer, points: ResumePoints | None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.inputs = torch.randn(
            BATCH, model[0].in_features, generator=torch.Generator().manual_seed(0)
        )
        self._initialize_training_resume(
            {"benchmark": "spent_gradients"},
            version="1",
            resume_points=points,
            spent_gradients="drop",
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {}

    @training_step
    def tick(self) -> None:
        """A step that changes nothing (a point needs a new boundary, not work)."""

    @training_step
    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(self.inputs).square().mean().backward()
        self.optimizer.step()


def measure(label: str, directory: Path, repeats: int) -> dict[str, Any]:
    spent_model, spent_optimizer = build(*SIZES[label])
    kept_model, kept_optimizer = build(*SIZES[label])
    spent = ZeroGradFirstTrainer(spent_model, spent_optimizer, ResumePoints(directory / "spent"))
    kept = ZeroGradFirstTrainer(kept_model, kept_optimizer, ResumePoints(directory / "kept"))
    spent.step()
    spent.step()  # its backward finds the first step's gradients set to None
    kept.step()  # nothing shows yet what the loop does with spent gradients
    parameters = sum(p.numel() for p in spent_model.parameters())
    gradient_bytes = sum(p.grad.numel() * p.grad.element_size() for p in kept_model.parameters())

    sizes: dict[str, int] = {}
    torch_save_fsync(spent_model, spent_optimizer, directory / "baseline.pt")
    sizes["torch_save"] = (directory / "baseline.pt").stat().st_size
    for name, model, optimizer in (
        ("pause_spent", spent_model, spent_optimizer),
        ("pause_kept", kept_model, kept_optimizer),
    ):
        ZeroGradFirstTrainer(model, optimizer, None).pause(directory / f"{name}.ckpt")
        sizes[name] = (directory / f"{name}.ckpt").stat().st_size
    for entry in directory.glob("*.*"):
        entry.unlink()

    times: dict[str, list[float]] = {"torch_save_fsync": [], "point_spent": [], "point_kept": []}
    order = list(times)
    for repeat in range(repeats + 1):  # round 0 warms up
        for name in order[repeat % 3 :] + order[: repeat % 3]:
            for entry in directory.rglob("*"):  # every run writes a new file, none overwrites
                if entry.is_file():
                    entry.unlink()
            os.sync()
            time.sleep(0.5)
            if name == "torch_save_fsync":
                start = time.perf_counter()
                torch_save_fsync(spent_model, spent_optimizer, directory / "baseline.pt")
                elapsed = time.perf_counter() - start
            else:
                trainer = spent if name == "point_spent" else kept
                trainer.tick()
                start = time.perf_counter()
                handle = trainer.checkpoint()
                elapsed = time.perf_counter() - start
                handle.wait()
            if repeat:
                times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "parameters": parameters,
        "gradient_bytes": gradient_bytes,
        "bytes": sizes,
        "size_ratio_spent": sizes["pause_spent"] / sizes["torch_save"],
        "size_ratio_kept": sizes["pause_kept"] / sizes["torch_save"],
        "seconds": times,
        "median_seconds": medians,
        "blocking_ratio_spent": medians["point_spent"] / medians["torch_save_fsync"],
        "blocking_ratio_kept": medians["point_kept"] / medians["torch_save_fsync"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10.5M parameters instead of 100M")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each writer (default 3)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the files are written (default: a temp dir)"
    )
    args = parser.parse_args()
    label = "10.5M" if args.quick else "100M"
    with tempfile.TemporaryDirectory(prefix="spent-gradients-", dir=args.dir) as name:
        result = measure(label, Path(name), args.repeats)
    size, median = result["bytes"], result["median_seconds"]
    mb = 1e6
    print_table(
        f"zero_grad()-first loop, AdamW, {result['parameters'] / 1e6:.1f}M parameters "
        f"(gradients {result['gradient_bytes'] / mb:,.0f} MB), medians of {args.repeats}",
        ["", "file MB", "x torch.save file", "blocks s", "x torch.save + fsync"],
        [
            [
                "torch.save + fsync",
                f"{size['torch_save'] / mb:,.1f}",
                "1.000",
                f"{median['torch_save_fsync']:.3f}",
                "1.000",
            ],
            [
                "spent gradients left out",
                f"{size['pause_spent'] / mb:,.1f}",
                f"{result['size_ratio_spent']:.3f}",
                f"{median['point_spent']:.3f}",
                f"{result['blocking_ratio_spent']:.3f}",
            ],
            [
                "gradients saved (1st step)",
                f"{size['pause_kept'] / mb:,.1f}",
                f"{result['size_ratio_kept']:.3f}",
                f"{median['point_kept']:.3f}",
                f"{result['blocking_ratio_kept']:.3f}",
            ],
        ],
    )
    size_ok = result["size_ratio_spent"] <= SIZE_TARGET
    blocking_ok = result["blocking_ratio_spent"] <= BLOCKING_TARGET
    print(
        f"pause file / torch.save file: {result['size_ratio_spent']:.4f} "
        f"(target <= {SIZE_TARGET}: {'ok' if size_ok else 'ABOVE TARGET'})"
    )
    print(
        f"point blocking / torch.save+fsync: {result['blocking_ratio_spent']:.3f} "
        f"(target <= {BLOCKING_TARGET}: {'ok' if blocking_ok else 'ABOVE TARGET'})"
    )
    path = write_json(
        "spent_gradients",
        {
            "size": label,
            "repeats": args.repeats,
            "targets": {"size_ratio": SIZE_TARGET, "blocking_ratio": BLOCKING_TARGET},
            **result,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
