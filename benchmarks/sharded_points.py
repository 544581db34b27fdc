"""Resume points of an FSDP2 model: how long the training step blocks when a point is taken.

Two gloo ranks on CPU shard a stack of Linear layers with ``fully_shard`` and train with
AdamW, taking a resume point every ``EVERY`` steps (``when_busy="skip"``). Reported per
rank: the median step without a point, the time the step spends taking each point (the
copy of its shards and state to host memory; measured around ``ResumePoints``'s
``_take_sharded``, the first point also makes the writers' gloo group and imports DCP),
how long the last write still ran after training stopped, and, for scale, one
synchronous sharded ``pause()`` of the same state. Prints a table and writes JSON to
``benchmarks/out/sharded_points.json``.

    python -m benchmarks.sharded_points --quick   # ~8M parameters (~100 MB of state)
    python -m benchmarks.sharded_points           # ~67M parameters (~800 MB of state)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import print_table, write_json
from benchmarks.sharded_pause import WORLD, sharded_rank_model

EVERY = 10


def _rank(rank: int, init: str, options: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist

    from trainer_resume import ResumePoints
    from trainer_resume.mixin import TrainingResumeMixin, training_step

    width = options["width"]
    model, optimizer = sharded_rank_model(rank, init, width, options["layers"])

    class Trainer(TrainingResumeMixin):
        def __init__(self, points: ResumePoints) -> None:
            self.model, self.optimizer = model, optimizer
            self._initialize_training_resume({"benchmark": "sharded_points"}, version="1",
                                             resume_points=points)  # fmt: skip

        def _resume_objects(self) -> dict[str, Any]:
            return {"model": self.model, "optimizer": self.optimizer}

        def _resume_loaders(self) -> dict[str, Any]:
            return {}

        @training_step
        def step(self) -> None:
            self.model(torch.randn(8, width)).square().mean().backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    taking: list[float] = []
    take = ResumePoints._take_sharded

    def timed(self: ResumePoints, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return take(self, *args, **kwargs)
        finally:
            taking.append(time.perf_counter() - start)

    ResumePoints._take_sharded = timed  # type: ignore[method-assign]
    directory = options["directory"]
    points = ResumePoints(os.path.join(directory, "points"), every_steps=EVERY, keep=2)
    trainer = Trainer(points)
    steps: list[float] = []
    for _ in range(options["steps"]):
        dist.barrier()
        start = time.perf_counter()
        trainer.step()
        steps.append(time.perf_counter() - start)
    start = time.perf_counter()
    points.wait()
    drained = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    trainer.pause(os.path.join(directory, "pause"))
    pause_seconds = time.perf_counter() - start
    plain = [s for index, s in enumerate(steps, 1) if index % EVERY and index > 1]
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "median_plain_step_seconds": statistics.median(plain),
                "point_seconds": taking,
                "points_written": points.written,
                "last_write_after_training_seconds": drained,
                "sharded_pause_seconds": pause_seconds,
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~8M parameters instead of ~67M")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    width, layers = (1024, 8) if args.quick else (2048, 16)
    steps = 4 * EVERY + 1
    with tempfile.TemporaryDirectory() as scratch:
        options = {"width": width, "layers": layers, "steps": steps, "directory": scratch}
        mp.spawn(_rank, args=(str(Path(scratch, "init")), options, scratch), nprocs=WORLD)
        ranks = [json.loads(Path(scratch, f"rank{r}.json").read_text()) for r in range(WORLD)]
    parameters = width * width * layers + width * layers
    rows = [
        [
            rank,
            f"{result['median_plain_step_seconds'] * 1e3:.1f}",
            f"{result['point_seconds'][0] * 1e3:.1f}",
            f"{statistics.median(result['point_seconds'][1:]) * 1e3:.1f}",
            f"{result['last_write_after_training_seconds'] * 1e3:.1f}",
            f"{result['sharded_pause_seconds'] * 1e3:.1f}",
        ]
        for rank, result in enumerate(ranks)
    ]
    print_table(
        f"Resume points of an FSDP2 model on {WORLD} gloo ranks: {parameters / 1e6:.1f}M "
        f"parameters + AdamW, a point every {EVERY} steps ({ranks[0]['points_written']} written)",
        [
            "rank",
            "median step ms",
            "first point blocks ms",
            "later points block ms (median)",
            "last write ran on ms",
            "sharded pause() ms",
        ],
        rows,
    )
    write_json("sharded_points", {"parameters": parameters, "world": WORLD, "ranks": ranks})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
