"""What the step boundary costs: ``@training_step`` over a ResumableDataLoader against a bare loop.

One tiny model (``Linear(16, 16)``, SGD, one thread), so the library's own per-step cost
shows: a bare step is about a hundred microseconds. For each loader case:

* **bare**: ``x, y = next(batches); loss = ...; backward; step`` over torch's ``DataLoader``;
* **library**: the same step as the ``@training_step`` method of a ``TrainingResumeMixin``
  trainer (the quickstart shape, default settings) fetching from
  ``ResumableDataLoader(resumable=True)``;
* beside them, for context: the bare loop over torchdata's ``StatefulDataLoader`` (its own
  per-step cost, not a target), and Lightning's ``Trainer.fit`` over the same ``DataLoader``
  (``max_steps``; timed by a callback from the first timed batch to the last).

For context, not targets: in the map-style case without workers, the bare loop plus the
library's per-batch seeding alone (what every such batch needs to replay its
augmentation: the global generators seeded, the caller's handed back); in both cases
without workers, where the rest goes: the bare loop over the ``ResumableDataLoader``
alone (no trainer), and the library's step of a trainer that declares
``spent_gradients="drop"`` (its gradient tracking: a process-wide optimizer step hook and
a hook on each parameter an optimizer steps); and, after the cases, the gradient
tracking's cost per parameter on a model of 200 parameters, in a loop that zeroes first
and in one that never zeroes (whose gradients are kept for good).

Cases: map-style (``shuffle=True``), 0 workers; an ``IterableDataset`` with
``state_dict()``, 0 workers; the same with 2 workers. Per case every variant is built once
and warmed up (``--warmup`` steps), then ``--rounds`` rounds time ``--steps`` steps of each
variant, in blocks of ``BLOCK`` steps that take turns (the order rotating from block to
block), so that a busy machine slows them alike: a round's figure for a variant is the
sum of its blocks, every step of the round counted. Lightning runs its own loop, so it is
timed in runs of its own after them.
Each figure is wall-clock µs per step, with the main thread's CPU time beside it (what
the loop itself pays, whatever else runs on the machine); the report gives the median
over rounds, every round's spread (min-max), and the median of the per-round ratios to
the bare loop of the same round, the figure the targets are checked against. Every variant
but the ``spent_gradients="drop"`` one steps without the gradient tracking's process-wide
optimizer step hook (taken out while it steps), as in a process where no trainer declared
it.

    python -m benchmarks.step_overhead --quick

Prints the tables and writes benchmarks/out/step_overhead.json (read by ``python -m
benchmarks`` for the targets in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from benchmarks._common import environment, print_table, write_json
from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.loaders._seeding import caller_generators
from trainer_resume.mixin import _gradient_liveness

FEATURES = 16
BATCH = 32
# Steps a variant runs before the next takes its turn (a few milliseconds): the variants
# of a round share the machine's load at that grain.
BLOCK = 10
SIZE = 1 << 22  # items: no pass ends inside a timed run
CASES = ("map, 0 workers", "iterable, 0 workers", "iterable, 2 workers")
VARIANTS = ("bare", "seeding", "loader", "library", "dropping", "torchdata", "lightning")
LABELS = {
    "bare": "bare loop, DataLoader",
    "seeding": "bare loop + per-batch seeding alone",
    "loader": "bare loop, ResumableDataLoader alone",
    "library": "@training_step, ResumableDataLoader",
    "dropping": "the same, spent_gradients='drop' (gradient tracking)",
    "torchdata": "bare loop, StatefulDataLoader",
    "lightning": "Lightning Trainer.fit, DataLoader",
}
LIGHTNING_RUNS = 3  # Lightning is context, not a target: a few runs of its own loop
# The context variants and the cases they run in (the others run in every case): the
# seeding in the map-style case without workers, the one case where the main thread seeds
# each batch (the seed and the hand-back of the caller's generators, as the library's
# fetch does), so its share of the library's cost shows; where the main process pays the
# loader's work, how the library's cost splits between the loader and the step (guard,
# boundary), and what the gradient tracking of spent_gradients="drop" adds.
CONTEXT_CASES = {
    "seeding": ("map, 0 workers",),
    "loader": ("map, 0 workers", "iterable, 0 workers"),
    "dropping": ("map, 0 workers", "iterable, 0 workers"),
}
# Context too: the gradient tracking's cost per parameter on a model with many.
TRACKING_LAYERS = 100  # Linear(8, 8) layers: 200 parameters
# The step boundary's targets: library / bare, medians of the per-round ratios.
TARGETS = {"map, 0 workers": 1.10, "iterable, 0 workers": 1.10, "iterable, 2 workers": 1.05}


_TABLE = torch.linspace(0.0, 1.0, 1000 * FEATURES).reshape(1000, FEATURES)


def _item(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Item ``index``: rows of a fixed table (cheap, no randomness)."""
    row = _TABLE[index % 1000]
    return row, row


class Points(Dataset):
    """``dataset[i]``: the fixed input and target of item ``i``."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _item(index)


class PointStream(IterableDataset):
    """The same items as a stream split over workers, with ``state_dict()`` (its position)."""

    def __init__(self) -> None:
        self.position = 0
        self.stride = 1

    def __iter__(self) -> PointStream:
        info = get_worker_info()
        start, self.stride = (0, 1) if info is None else (info.id, info.num_workers)
        self.position = max(self.position, start)
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position >= SIZE:
            raise StopIteration
        item = _item(self.position)
        self.position += self.stride
        return item

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def _loader(kind: str, case: str) -> DataLoader:
    dataset, workers = case.split(", ")
    options: dict[str, Any] = {"batch_size": BATCH, "num_workers": int(workers.split()[0])}
    data: Any
    if dataset == "map":
        data, options["shuffle"] = Points(), True
    else:
        data = PointStream()
    if kind == "library":
        return ResumableDataLoader(data, resumable=True, **options)
    if kind == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return StatefulDataLoader(data, **options)
    return DataLoader(data, **options)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, FEATURES)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss


class Trainer(TrainingResumeMixin):
    """The quickstart shape: the step fetches its batch from the loader's iterator."""

    def __init__(self, loader: ResumableDataLoader, spent_gradients: str = "save") -> None:
        self.model, self.optimizer = _model()
        self.loader = loader
        self.batches = iter(loader)
        self._initialize_training_resume(
            {"benchmark": "step_overhead"},
            version="step/1",
            spent_gradients=spent_gradients,  # type: ignore[arg-type]
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _rebuild_resume_iterators(self) -> None:
        self.batches = iter(self.loader)

    @training_step
    def step(self) -> torch.Tensor:
        return _train(self.model, self.optimizer, next(self.batches))


def _timed(step: Callable[[], object], steps: int) -> tuple[float, float]:
    """Wall and this thread's CPU microseconds per step over ``steps`` steps."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    return (
        (time.perf_counter() - wall) / steps * 1e6,
        (time.thread_time() - cpu) / steps * 1e6,
    )


@contextlib.contextmanager
def _as_without_the_library(variant: str) -> Iterator[None]:
    """Every variant but the steps of a ``spent_gradients="drop"`` trainer as in a process
    where no such trainer was made: the process-wide optimizer step hook it installs
    (``mixin/_gradient_liveness.py``, which also hooks each parameter an optimizer steps)
    is taken out while they step, and put back after, so the bare loops and the library's
    default step pay none of the gradient tracking."""
    tracker = _gradient_liveness._TRACKER
    if variant == "dropping" or tracker.handle is None:
        yield
        return
    with _gradient_liveness._INSTALL:
        tracker.handle.remove()
        tracker.handle = None
    try:
        yield
    finally:
        _gradient_liveness.track_gradients()


class Runner:
    """One variant of one case, built once: its step, and how to stop its workers."""

    def __init__(self, variant: str, case: str) -> None:
        self.loader = _loader(_LOADERS.get(variant, variant), case)
        if variant in ("library", "dropping"):
            spent = "drop" if variant == "dropping" else "save"
            trainer = Trainer(self.loader, spent)  # type: ignore[arg-type]
            self.iterator: Any = None
            self.step: Callable[[], object] = trainer.step
        elif variant == "seeding":
            model, optimizer = _model()
            batches = self.iterator = iter(self.loader)
            run, seeds = caller_generators().run, iter(range(1 << 62))

            def seeded() -> torch.Tensor:
                run(next(seeds), _nothing)  # seeded from the int, as the library's fetch
                return _train(model, optimizer, next(batches))

            self.step = seeded
        else:
            model, optimizer = _model()
            batches = self.iterator = iter(self.loader)
            self.step = lambda: _train(model, optimizer, next(batches))

    def close(self) -> None:
        if isinstance(self.loader, ResumableDataLoader):
            self.loader.close()
            return
        shutdown = getattr(self.iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _nothing() -> None:
    return None


# The loader each context variant steps over (the others: their own name's).
_LOADERS = {"seeding": "bare", "loader": "library", "dropping": "library"}


def gradient_tracking(rounds: int, steps: int, *, zeroes: bool = True) -> dict[str, Any]:
    """A step of a model with many parameters, with and without the library's gradient
    tracking (its optimizer step hook and parameter hooks), interleaved: the cost per
    parameter per step (zero_grad unless ``zeroes`` is False, one backward, step). A loop
    that never zeroes keeps its gradients for good: their hooks are let go of."""
    inputs = torch.randn(4, 8)

    def build() -> Callable[[], object]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(TRACKING_LAYERS)])
        # A small rate: without zero_grad the gradients grow at every step.
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step() -> None:
            if zeroes:
                optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()

        return step

    _gradient_liveness.track_gradients()
    steps_of = {"bare": build(), "dropping": build()}
    parameters = 2 * TRACKING_LAYERS
    cpu: dict[str, list[float]] = {name: [] for name in steps_of}
    for number in range(rounds):
        names = list(steps_of) if number % 2 == 0 else list(reversed(steps_of))
        for name in names:
            with _as_without_the_library(name):
                for _ in range(3):  # hooked at the first step, seen kept (or not) by the third
                    steps_of[name]()
                cpu[name].append(_timed(steps_of[name], steps)[1])
    per_parameter = [
        (ours - theirs) / parameters for ours, theirs in zip(cpu["dropping"], cpu["bare"])
    ]
    return {
        "parameters": parameters,
        "zero_grad": zeroes,
        "cpu_us_per_step": cpu,
        "us_per_parameter": per_parameter,
        "median_us_per_parameter": statistics.median(per_parameter),
    }


def run_lightning(case: str, warmup: int, steps: int) -> tuple[float, float]:
    """Lightning's ``fit`` over torch's DataLoader: wall and main-thread CPU µs per step."""
    import logging

    import pytorch_lightning as pl

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    times: list[tuple[float, float]] = []

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            if index == warmup:
                times.append((time.perf_counter(), time.thread_time()))

        def on_train_end(self, trainer: Any, module: Any) -> None:
            times.append((time.perf_counter(), time.thread_time()))

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.optimizer = _model()

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            # Lightning's automatic optimization: zero_grad, backward and step, as the bare loop
            inputs, targets = batch
            return torch.nn.functional.mse_loss(self.model(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.optimizer

    trainer = pl.Trainer(
        max_steps=warmup + steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Clock()],
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), _loader("bare", case))
    # the last timed step ends at on_train_end (after the loop's last batch)
    (wall, cpu), (wall_end, cpu_end) = times
    return (wall_end - wall) / steps * 1e6, (cpu_end - cpu) / steps * 1e6


def _spread(values: list[float], digits: int = 0) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def _entry(values: list[float], bare: list[float]) -> dict[str, Any]:
    ratios = [value / base for value, base in zip(values, bare)]
    return {
        "us_per_step": values,
        "median_us_per_step": statistics.median(values),
        "ratios_to_bare": ratios,
        "median_ratio_to_bare": statistics.median(ratios),
        "median_overhead_us": statistics.median(
            [value - base for value, base in zip(values, bare)]
        ),
    }


def summarise(
    wall: dict[str, dict[str, list[float]]], cpu: dict[str, dict[str, list[float]]]
) -> dict[str, dict[str, Any]]:
    """Per case and variant: medians, spreads and per-round ratios to the bare loop of the same
    round (Lightning, timed in runs of its own, against the median bare round), wall clock,
    with this thread's CPU time beside it."""
    summary: dict[str, dict[str, Any]] = {}
    for case, timed in wall.items():
        entry: dict[str, Any] = {}
        for variant, values in timed.items():
            if variant == "lightning":
                bare = [statistics.median(timed["bare"])] * len(values)
                bare_cpu = [statistics.median(cpu[case]["bare"])] * len(values)
            else:
                bare, bare_cpu = timed["bare"], cpu[case]["bare"]
            entry[variant] = _entry(values, bare)
            entry[variant]["cpu"] = _entry(cpu[case][variant], bare_cpu)
        summary[case] = entry
    return summary


def measure_case(
    case: str, variants: list[str], warmup: int, steps: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every variant built once, then ``rounds`` rounds of ``steps`` steps each, in blocks of
    ``BLOCK`` steps that take turns, the order rotating from block to block (Lightning runs
    its own loop: runs of its own, after)."""
    interleaved = [
        variant
        for variant in variants
        if variant != "lightning" and case in CONTEXT_CASES.get(variant, CASES)
    ]
    runners = {variant: Runner(variant, case) for variant in interleaved}
    timed = [variant for variant in variants if variant in interleaved or variant == "lightning"]
    wall: dict[str, list[float]] = {variant: [] for variant in timed}
    cpu: dict[str, list[float]] = {variant: [] for variant in timed}
    try:
        for variant, runner in runners.items():
            with _as_without_the_library(variant):
                for _ in range(warmup):
                    runner.step()
        gc.collect()
        blocks = max(1, steps // BLOCK)
        for number in range(rounds):
            seconds = dict.fromkeys(interleaved, 0.0)
            used = dict.fromkeys(interleaved, 0.0)
            for block in range(blocks):
                shift = (number + block) % len(interleaved)
                for variant in interleaved[shift:] + interleaved[:shift]:
                    with _as_without_the_library(variant):
                        block_seconds, block_used = _timed(runners[variant].step, BLOCK)
                    seconds[variant] += block_seconds
                    used[variant] += block_used
            for variant in interleaved:
                wall[variant].append(seconds[variant] / blocks)
                cpu[variant].append(used[variant] / blocks)
    finally:
        for runner in runners.values():
            runner.close()
    if "lightning" in variants:
        for _ in range(LIGHTNING_RUNS):
            with _as_without_the_library("lightning"):
                seconds, used = run_lightning(case, warmup, steps * 5)
            wall["lightning"].append(seconds)
            cpu["lightning"].append(used)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args(argv)
    steps = args.steps or (300 if args.quick else 1000)
    warmup = args.warmup or (100 if args.quick else 300)
    rounds = args.rounds or (15 if args.quick else 31)
    torch.set_num_threads(1)
    variants = [variant for variant in VARIANTS if variant in args.variants]
    if "bare" not in variants:
        variants.insert(0, "bare")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None

    wall: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    for case in args.cases:
        wall[case], cpu[case] = measure_case(case, variants, warmup, steps, rounds)
    summary = summarise(wall, cpu)

    for case, entry in summary.items():
        print_table(
            f"µs per step, {case}: Linear({FEATURES}, {FEATURES}), SGD, batch {BATCH}, one thread; "
            f"{rounds} rounds of {steps} steps interleaved in blocks of {BLOCK}, after {warmup} "
            "(Lightning: "
            f"{LIGHTNING_RUNS} runs of {steps * 5} steps of its own); wall clock, and the main "
            "thread's CPU time",
            [
                "variant",
                "median µs/step",
                "min-max",
                "x bare (median of rounds, min-max)",
                "overhead µs",
                "CPU µs/step",
                "CPU x bare",
            ],
            [
                [
                    LABELS[variant],
                    f"{result['median_us_per_step']:.1f}",
                    _spread(result["us_per_step"], 1),
                    f"{result['median_ratio_to_bare']:.3f} ({_spread(result['ratios_to_bare'], 3)})",
                    f"{result['median_overhead_us']:+.1f}",
                    f"{result['cpu']['median_us_per_step']:.1f}",
                    f"{result['cpu']['median_ratio_to_bare']:.3f} "
                    f"({_spread(result['cpu']['ratios_to_bare'], 3)})",
                ]
                for variant, result in entry.items()
            ],
        )
        target = TARGETS.get(case)
        if target is not None:
            ratio = entry["library"]["median_ratio_to_bare"]
            print(
                f"target {case}: library <= {target:.2f}x bare: {ratio:.3f}x "
                f"{'met' if ratio <= target else 'MISSED'}\n"
            )
    tracking_rounds = 9 if args.quick else 21
    tracking = gradient_tracking(rounds=tracking_rounds, steps=100)
    kept = gradient_tracking(rounds=tracking_rounds, steps=100, zeroes=False)
    rows = []
    for loop, found in (("zero_grad first", tracking), ("never zeroes (kept)", kept)):
        rows += [
            [
                f"{loop}: bare",
                f"{statistics.median(found['cpu_us_per_step']['bare']):.0f}",
                _spread(found["cpu_us_per_step"]["bare"]),
                "",
            ],
            [
                f"{loop}: with the gradient tracking (spent_gradients='drop')",
                f"{statistics.median(found['cpu_us_per_step']['dropping']):.0f}",
                _spread(found["cpu_us_per_step"]["dropping"]),
                f"{found['median_us_per_parameter']:.2f} ({_spread(found['us_per_parameter'], 2)})",
            ],
        ]
    print_table(
        f"Gradient tracking, {tracking['parameters']} parameters ({TRACKING_LAYERS} x "
        "Linear(8, 8), SGD; a loop that zeroes first, and one that never zeroes, whose "
        "gradients are kept for good): main-thread CPU µs per step, interleaved rounds "
        "(context, not a target)",
        ["variant", "median µs/step", "min-max", "µs per parameter per step (median, min-max)"],
        rows,
    )
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"load average before {load_before}, after {load_after}")
    path = write_json(
        "step_overhead",
        {
            "features": FEATURES,
            "batch_size": BATCH,
            "steps": steps,
            "warmup": warmup,
            "rounds": rounds,
            "block": BLOCK,
            "targets": TARGETS,
            "cases": summary,
            "gradient_tracking": tracking,
            "gradient_tracking_kept": kept,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "environment": environment(),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
