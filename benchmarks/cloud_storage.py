"""Pause and resume at an ``s3://`` URL against writing and reading ``torch.save``'s bytes
there with fsspec, on a local S3 server (moto's ``moto_server``).

A trainer (a stack of Linear layers and Adam, one step taken so that the optimizer has
its moments) pauses to ``s3://bench/pause.ckpt`` and a fresh trainer resumes from it.
The references write the same state's ``torch.save`` bytes to the same server with
fsspec, ``fs.pipe`` (serialized into memory, then one call) and ``fs.open(..., "wb")``
(``torch.save`` into the file object), and read them back with ``torch.load`` from
``fs.open(url, "rb")`` plus ``load_state_dict``. The methods run interleaved, in one
process, ``--repeats`` times each; the tables show medians and the peak RSS above the
state already in memory.

    python -m benchmarks.cloud_storage --size-mib 512 --repeats 5
    python -m benchmarks.cloud_storage --quick

Prints tables and writes benchmarks/out/cloud_storage.json.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks._common import median, peak_rss_bytes, print_table, reset_peak_rss, write_json
from benchmarks._s3_server import ENVIRONMENT, make_bucket, moto_server
from trainer_resume import TrainingResumeMixin, training_step

PAUSE = "pause()"
PIPE = "torch.save(BytesIO) + fs.pipe"
OPEN_WRITE = 'torch.save(fs.open(url, "wb"))'
RESUME = "resume()"
LOAD = 'torch.load(fs.open(url, "rb")) + load_state_dict'
TARGET = 1.10
WIDTH = 1024  # a layer of 4 MiB of float32 weights


class _Trainer(TrainingResumeMixin):
    def __init__(self, layers: int) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self._initialize_training_resume({"layers": layers}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {}

    @training_step
    def step(self) -> None:
        self.model(torch.ones(2, WIDTH)).sum().backward()
        self.optimizer.step()
        # No gradient outlives the step: the pause holds the same tensors as the references.
        self.optimizer.zero_grad(set_to_none=True)


def _timed(run: Callable[[], Any]) -> tuple[float, int]:
    """Seconds and peak RSS above the RSS before ``run``."""
    gc.collect()
    reset_peak_rss()
    before = peak_rss_bytes()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    return seconds, max(0, peak_rss_bytes() - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="the model's weights (Adam: x3)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="--size-mib 64 --repeats 3")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.repeats = 64, 3
    torch.set_num_threads(1)
    layers = max(1, args.size_mib // 4)

    with moto_server() as endpoint:
        os.environ.update({**ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint})
        import s3fs

        bucket = make_bucket("bench")
        fs = s3fs.S3FileSystem()
        ours, plain = f"{bucket}/pause.ckpt", "bench/plain.pt"
        trainer = _Trainer(layers)
        trainer.step()
        state = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
        state_bytes = sum(
            t.numel() * t.element_size()
            for group in (state["model"].values(), trainer.optimizer.state.values())
            for item in group
            for t in ([item] if isinstance(item, torch.Tensor) else item.values())
            if isinstance(t, torch.Tensor)
        )

        def pipe() -> None:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            fs.pipe(plain, buffer.getvalue())

        def open_write() -> None:
            with fs.open(plain, "wb") as out:
                torch.save(state, out)

        def resume() -> None:
            _Trainer(layers).resume(ours)

        def load() -> None:
            fresh = _Trainer(layers)
            with fs.open(plain, "rb") as source:
                loaded = torch.load(source, weights_only=True)
            fresh.model.load_state_dict(loaded["model"])
            fresh.optimizer.load_state_dict(loaded["optimizer"])

        writes = {PAUSE: [], PIPE: [], OPEN_WRITE: []}
        reads = {RESUME: [], LOAD: []}
        for _ in range(args.repeats):
            started = time.perf_counter()
            trainer.pause(ours)
            writes[PAUSE].append((time.perf_counter() - started, 0))
            trainer.resume(ours)
            writes[PIPE].append(_timed(pipe))
            writes[OPEN_WRITE].append(_timed(open_write))
            pipe()  # the plain object the reads compare with
            reads[RESUME].append(_timed(resume))
            reads[LOAD].append(_timed(load))
        # pause()'s memory, measured apart (its resume above would count too).
        for index in range(args.repeats):
            seconds, rss = _timed(lambda: trainer.pause(ours))
            writes[PAUSE][index] = (writes[PAUSE][index][0], rss)
            trainer.resume(ours)

    def summary(runs: dict[str, list[tuple[float, int]]], reference: str) -> dict[str, Any]:
        base = median([seconds for seconds, _ in runs[reference]])
        return {
            name: {
                "median_seconds": median([s for s, _ in values]),
                "seconds": [s for s, _ in values],
                "ratio_to_reference": median([s for s, _ in values]) / base,
                "max_peak_rss_above_baseline_bytes": max(r for _, r in values),
            }
            for name, values in runs.items()
        }

    write_summary = summary(writes, PIPE)
    write_summary[PAUSE]["ratio_to_open_write"] = (
        write_summary[PAUSE]["median_seconds"] / write_summary[OPEN_WRITE]["median_seconds"]
    )
    read_summary = summary(reads, LOAD)
    for title, table in (("Write to s3://", write_summary), ("Read from s3://", read_summary)):
        print_table(
            f"{title} (moto_server, {state_bytes / (1 << 20):,.0f} MiB state, "
            f"{args.repeats} runs, interleaved)",
            ["method", "median s", "x reference", "peak RSS above / state"],
            [
                [
                    name,
                    f"{entry['median_seconds']:.3f}",
                    f"{entry['ratio_to_reference']:.2f}",
                    f"{entry['max_peak_rss_above_baseline_bytes'] / state_bytes:.2f}",
                ]
                for name, entry in table.items()
            ],
        )
    path = write_json(
        "cloud_storage",
        {
            "settings": {"size_mib": args.size_mib, "repeats": args.repeats},
            "state_bytes": state_bytes,
            "write": write_summary,
            "read": read_summary,
            "target": TARGET,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
