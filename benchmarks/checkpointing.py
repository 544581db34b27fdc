"""Blocking cost of a checkpoint: pause() against what users would pick instead.

The same state (an MLP of ``nn.Linear`` layers plus its AdamW state after one step,
built as in ``benchmarks/pause.py``) is written by

* ``TrainingResumeMixin.pause()`` (durable, verified: temp file, BLAKE3, fsync, rename),
* ``torch.save`` of the model and optimizer state dicts (no fsync),
* the same ``torch.save`` followed by flush + fsync (the reference of every ratio),
* Lightning's ``trainer.save_checkpoint`` (a real ``pytorch_lightning.Trainer`` fitted
  for one step so the optimizer state exists),
* Accelerate's ``Accelerator.save_state`` (skipped with a note if ``accelerate`` is not
  importable).

Every run is a fresh child process: it builds the state, syncs the disk (no earlier
dirty data queued), resets its peak-RSS mark (Linux ``/proc/self/clear_refs``;
elsewhere the build's own peak is the baseline), writes once into a new file and
reports the blocking wall time, the peak RSS above that baseline (``ru_maxrss``) and
the file size. Methods alternate order between repeats; the median
is reported with every run listed. The children of ``pause()`` and ``torch.save`` +
fsync then read their file back: ``resume()`` against ``torch.load(weights_only=True)``
+ ``load_state_dict`` of the same state.

The same pairs are also measured in one process per size (``--rounds`` rounds):
the model is built once, then each round writes with ``pause()`` and with
``torch.save`` + fsync (order alternating between rounds), then reads back with
``resume()`` and with ``torch.load`` + ``load_state_dict`` (alternating too); the
peak-RSS mark is reset before every measurement. Finally ``@training_step``
overhead per call (``pause.measure_overhead``).

    python -m benchmarks.checkpointing            # ~10M and ~100M parameters, 5 runs each
    python -m benchmarks.checkpointing --quick    # ~10M, 3 runs; ~100M for pause() and torch.save + fsync only
    python -m benchmarks.checkpointing --pair     # pause()/resume() against torch only, both sizes

Prints tables and writes benchmarks/out/checkpointing.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import peak_rss_bytes, print_table, reset_peak_rss, write_json

# name -> (width, layers): the shapes benchmarks/pause.py uses for --quick and the full run.
SIZES = {"10M": (1024, 10), "100M": (2048, 24)}
SAVE_METHODS = {
    "pause()": "pause",
    "torch.save": "torch_save",
    "torch.save + fsync": "torch_save_fsync",
    "Lightning trainer.save_checkpoint": "lightning",
    "Accelerate save_state": "accelerate",
}
REFERENCE = "torch.save + fsync"
# --quick adds the large state for the target's pair only: all five methods there would
# take minutes more.
TARGET_PAIR = ("pause()", REFERENCE)
# load row -> the save row whose child reads its file back
LOAD_METHODS = {"resume()": "pause()", "torch.load + load_state_dict": "torch.save + fsync"}
LOAD_REFERENCE = "torch.load + load_state_dict"
RESULT_PREFIX = "CHECKPOINTING-RESULT "
INTERLEAVED = "interleaved"  # the child that measures the pairs in one process
LR = 1e-4


# ----------------------------------------------------------------------------- child


def _baseline() -> tuple[int, bool]:
    gc.collect()
    reset = reset_peak_rss()
    return peak_rss_bytes(), reset


def tensor_bytes(*states: Any) -> int:
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0

    def visit(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += key[1]
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    for state in states:
        visit(state)
    return total


def build_model(width: int, layers: int) -> tuple[Any, Any]:
    """Model + AdamW after one step: exp_avg and exp_avg_sq exist for every parameter."""
    import torch

    from benchmarks.pause import build_model

    torch.manual_seed(0)
    model = build_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _path_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
    return path.stat().st_size


def _timed_with_peak(action: Callable[[], Any]) -> dict[str, Any]:
    if hasattr(os, "sync"):
        os.sync()  # start with no other dirty data queued for the disk
    baseline, reset = _baseline()
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "baseline_rss_bytes": baseline,
        "peak_rss_above_baseline_bytes": peak_rss_bytes() - baseline,
        "peak_reset": reset,
    }


def _child_pause(width: int, layers: int, directory: Path) -> dict[str, Any]:
    from benchmarks.pause import BenchTrainer

    model, optimizer = build_model(width, layers)
    state_bytes = tensor_bytes(model.state_dict(), optimizer.state_dict())
    trainer = BenchTrainer(model, optimizer, shared=False)
    path = directory / "pause.ckpt"
    save = _timed_with_peak(lambda: trainer.pause(path))
    save["file_bytes"] = _path_bytes(path)
    load = _timed_with_peak(lambda: trainer.resume(path))
    return {"state_bytes": state_bytes, "save": save, "load": load}


def _child_torch(width: int, layers: int, directory: Path, *, fsync: bool) -> dict[str, Any]:
    import torch

    from benchmarks.pause import torch_save_fsync

    model, optimizer = build_model(width, layers)
    state_bytes = tensor_bytes(model.state_dict(), optimizer.state_dict())
    path = directory / "torch.pt"

    def plain_save() -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    save = _timed_with_peak(
        (lambda: torch_save_fsync(model, optimizer, path)) if fsync else plain_save
    )
    save["file_bytes"] = _path_bytes(path)
    result: dict[str, Any] = {"state_bytes": state_bytes, "save": save}
    if fsync:
        loaded: dict[str, Any] = {}

        def load() -> None:
            start = time.perf_counter()
            state = torch.load(path, map_location="cpu", weights_only=True)
            loaded["torch_load_seconds"] = time.perf_counter() - start
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        result["load"] = {**_timed_with_peak(load), **loaded}
    return result


def _child_lightning(width: int, layers: int, directory: Path) -> dict[str, Any]:
    import logging
    import warnings

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader

    from benchmarks.pause import build_model

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = build_model(width, layers)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(batch).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=LR)

    module = Module()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        limit_train_batches=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(directory),
    )
    trainer.fit(module, train_dataloaders=DataLoader(torch.randn(2, width), batch_size=2))
    optimizer = trainer.optimizers[0]
    if not optimizer.state:
        raise RuntimeError("Lightning fit did not create the optimizer state")
    state_bytes = tensor_bytes(module.state_dict(), optimizer.state_dict())
    path = directory / "lightning.ckpt"
    save = _timed_with_peak(lambda: trainer.save_checkpoint(path))
    save["file_bytes"] = _path_bytes(path)
    return {"state_bytes": state_bytes, "save": save}


def _child_accelerate(width: int, layers: int, directory: Path) -> dict[str, Any]:
    import torch
    from accelerate import Accelerator

    from benchmarks.pause import build_model

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = build_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(2, width)).square().mean())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state_bytes = tensor_bytes(model.state_dict(), optimizer.state_dict())
    path = directory / "accelerate"
    save = _timed_with_peak(lambda: accelerator.save_state(str(path)))
    save["file_bytes"] = _path_bytes(path)
    return {"state_bytes": state_bytes, "save": save}


def _child_interleaved(width: int, layers: int, directory: Path, rounds: int) -> dict[str, Any]:
    """Both save pairs and both load pairs, ``rounds`` times, interleaved in this one process."""
    import torch

    from benchmarks.pause import BenchTrainer, torch_save_fsync

    model, optimizer = build_model(width, layers)
    trainer = BenchTrainer(model, optimizer, shared=False)
    pause_path, torch_path = directory / "pause.ckpt", directory / "torch.pt"

    def torch_load() -> None:
        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    saves = {
        "pause()": lambda: trainer.pause(pause_path),
        REFERENCE: lambda: torch_save_fsync(model, optimizer, torch_path),
    }
    loads = {"resume()": lambda: trainer.resume(pause_path), LOAD_REFERENCE: torch_load}
    result: dict[str, Any] = {
        "save": {name: [] for name in saves},
        "load": {name: [] for name in loads},
    }
    for number in range(rounds):
        for kind, actions in (("save", saves), ("load", loads)):
            names = list(actions) if number % 2 == 0 else list(reversed(actions))
            for name in names:
                result[kind][name].append(_timed_with_peak(actions[name]))
    return result


def _child(
    method: str, width: int, layers: int, directory: Path, rounds: int = 0
) -> dict[str, Any]:
    if method == INTERLEAVED:
        return _child_interleaved(width, layers, directory, rounds)
    if method == "pause":
        return _child_pause(width, layers, directory)
    if method in ("torch_save", "torch_save_fsync"):
        return _child_torch(width, layers, directory, fsync=method == "torch_save_fsync")
    if method == "lightning":
        return _child_lightning(width, layers, directory)
    if method == "accelerate":
        return _child_accelerate(width, layers, directory)
    raise ValueError(f"unknown method {method!r}")


# ---------------------------------------------------------------------------- parent


def accelerate_missing() -> str | None:
    """Why Accelerate's row is skipped, or None when it can run."""
    try:
        import accelerate  # noqa: F401
    except ImportError as error:
        return f"accelerate is not importable ({error}); install the bench extra to add it"
    return None


def _run_child(
    method: str, width: int, layers: int, directory: Path, timeout: float, rounds: int = 0
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"{method}-", dir=directory))
    command = [
        sys.executable,
        "-m",
        "benchmarks.checkpointing",
        "--child",
        method,
        "--width",
        str(width),
        "--layers",
        str(layers),
        "--dir",
        str(workdir),
        "--rounds",
        str(rounds),
    ]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
        results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        if done.returncode != 0 or not results:
            raise RuntimeError(
                f"{method} child failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
            )
        return json.loads(results[-1][len(RESULT_PREFIX) :])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _summarise(runs: list[dict[str, Any]], reference_median: float | None) -> dict[str, Any]:
    seconds = [run["seconds"] for run in runs]
    median = statistics.median(seconds)
    peaks = [run["peak_rss_above_baseline_bytes"] for run in runs]
    summary: dict[str, Any] = {
        "seconds": seconds,
        "median_seconds": median,
        "ratio_to_reference": median / reference_median if reference_median else None,
        "peak_rss_above_baseline_bytes": peaks,
        "max_peak_rss_above_baseline_bytes": max(peaks),
        "baseline_rss_bytes": statistics.median(run["baseline_rss_bytes"] for run in runs),
        "peak_reset": all(run["peak_reset"] for run in runs),
    }
    if "file_bytes" in runs[0]:
        summary["file_bytes"] = runs[0]["file_bytes"]
    if "torch_load_seconds" in runs[0]:
        summary["torch_load_only_median_seconds"] = statistics.median(
            run["torch_load_seconds"] for run in runs
        )
    return summary


def measure_size(
    label: str, repeats: int, directory: Path, methods: dict[str, str], timeout: float, rounds: int
) -> dict[str, Any]:
    width, layers = SIZES[label]
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    for repeat in range(repeats):
        order = (
            list(methods) if repeat % 2 == 0 else list(reversed(methods))
        )  # no method always goes first
        for name in order:
            print(f"  {label} run {repeat + 1}/{repeats}: {name}", file=sys.stderr, flush=True)
            raw[name].append(_run_child(methods[name], width, layers, directory, timeout))
    save_reference = statistics.median(run["save"]["seconds"] for run in raw[REFERENCE])
    save = {
        name: _summarise([run["save"] for run in runs], save_reference)
        for name, runs in raw.items()
    }
    load_runs = {name: [run["load"] for run in raw[child]] for name, child in LOAD_METHODS.items()}
    load_reference = statistics.median(run["seconds"] for run in load_runs[LOAD_REFERENCE])
    load = {name: _summarise(runs, load_reference) for name, runs in load_runs.items()}
    state_bytes = {name: runs[0]["state_bytes"] for name, runs in raw.items()}
    print(f"  {label}: {rounds} interleaved rounds in one process", file=sys.stderr, flush=True)
    same = _run_child(INTERLEAVED, width, layers, directory, timeout * 2, rounds)
    same_process = {
        kind: {
            name: _summarise(
                runs, statistics.median(run["seconds"] for run in same[kind][reference])
            )
            for name, runs in same[kind].items()
        }
        for kind, reference in (("save", REFERENCE), ("load", LOAD_REFERENCE))
    }
    return {
        "label": label,
        "width": width,
        "layers": layers,
        "parameters": layers * (width * width + width),
        "state_bytes": state_bytes[REFERENCE],
        "state_bytes_by_method": state_bytes,
        "save": save,
        "load": load,
        "same_process": same_process,
    }


def _mib(value: float) -> str:
    return f"{value / (1 << 20):,.1f}"


def _timing_cells(name: str, result: dict[str, Any]) -> list[str]:
    """Method, median, ratio, every run and peak RSS: the columns both tables share."""
    return [
        name,
        f"{result['median_seconds']:.3f}",
        f"{result['ratio_to_reference']:.2f}",
        " ".join(f"{value:.3f}" for value in result["seconds"]),
        _mib(result["max_peak_rss_above_baseline_bytes"]),
    ]


def print_tables(
    sizes: list[dict[str, Any]], overhead: dict[str, float], repeats: int, skipped: dict[str, str]
) -> None:
    for size in sizes:
        state = size["state_bytes"]
        rows = []
        for name, result in size["save"].items():
            rows.append(
                [
                    *_timing_cells(name, result),
                    f"{result['max_peak_rss_above_baseline_bytes'] / state:.2f}",
                    _mib(result["file_bytes"]),
                ]
            )
        print_table(
            f"Checkpoint save, {size['parameters'] / 1e6:.1f}M parameters + AdamW state "
            f"({_mib(state)} MiB of tensors); fresh process per run, median of {repeats}; "
            f"ratio to {REFERENCE}.",
            [
                "method",
                "median s",
                "ratio",
                "all runs (s)",
                "peak RSS above baseline MiB",
                "peak/state",
                "file MiB",
            ],
            rows,
        )
        rows = []
        for name, result in size["load"].items():
            rows.append(_timing_cells(name, result))
        load_only = size["load"][LOAD_REFERENCE].get("torch_load_only_median_seconds")
        print_table(
            f"Resume, {size['parameters'] / 1e6:.1f}M parameters: the file just written, read back in the "
            f"same child (page cache warm for both); ratio to {LOAD_REFERENCE} "
            f"(torch.load alone: {load_only:.3f} s median).",
            ["method", "median s", "ratio", "all runs (s)", "peak RSS above baseline MiB"],
            rows,
        )
        for kind, title in (("save", "Save"), ("load", "Resume")):
            results = size["same_process"][kind]
            reference = REFERENCE if kind == "save" else LOAD_REFERENCE
            print_table(
                f"{title}, {size['parameters'] / 1e6:.1f}M parameters, all in one process: "
                f"{len(next(iter(results.values()))['seconds'])} interleaved rounds, median; "
                f"ratio to {reference}.",
                ["method", "median s", "ratio", "all runs (s)", "peak RSS above baseline MiB"],
                [_timing_cells(name, result) for name, result in results.items()],
            )
    print_table(
        "Step overhead per call, min of 7 timeit repeats (pause.measure_overhead).",
        ["call", "µs per call", "overhead µs"],
        [
            ["plain method", f"{overhead['plain_call_us']:.3f}", ""],
            [
                "@training_step",
                f"{overhead['training_step_call_us']:.3f}",
                f"{overhead['training_step_overhead_us']:.3f}",
            ],
            [
                "@serialized_training",
                f"{overhead['serialized_training_call_us']:.3f}",
                f"{overhead['serialized_training_overhead_us']:.3f}",
            ],
        ],
    )
    if not all(result["peak_reset"] for size in sizes for result in size["save"].values()):
        print(
            "note: the peak-RSS mark could not be reset on this system; the baseline is the build's own peak"
        )
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 runs per method; ~100M parameters only for pause() and torch.save + fsync",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=sorted(SIZES),
        default=None,
        help="state sizes, every method for each (default: 10M and 100M)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="fresh-process runs per method (default 5, quick 3)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where files are written (default: a temp dir under the current directory)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    parser.add_argument("--overhead-calls", type=int, default=None, help="calls per timeit repeat")
    parser.add_argument(
        "--pair",
        action="store_true",
        help="only pause()/resume() and torch.save + fsync / torch.load, for every size",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds in the one-process measurement (default: --repeats)",
    )
    parser.add_argument(
        "--child", choices=sorted({*SAVE_METHODS.values(), INTERLEAVED}), help=argparse.SUPPRESS
    )
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        result = _child(args.child, args.width, args.layers, args.dir, args.rounds or 0)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return

    repeats = args.repeats or (3 if args.quick else 5)
    methods = dict(SAVE_METHODS)
    skipped: dict[str, str] = {}
    missing = accelerate_missing()
    if missing:
        skipped["Accelerate save_state"] = missing
        del methods["Accelerate save_state"]
    if args.pair:
        methods = {name: methods[name] for name in TARGET_PAIR}
    if args.sizes:
        plan = [(label, methods) for label in args.sizes]
    elif args.quick:
        plan = [("10M", methods), ("100M", {name: methods[name] for name in TARGET_PAIR})]
    else:
        plan = [("10M", methods), ("100M", methods)]
    sizes = [label for label, _ in plan]

    owned = args.dir is None
    directory = (
        Path(tempfile.mkdtemp(prefix=".checkpointing-bench-", dir=os.getcwd()))
        if owned
        else args.dir
    )
    directory.mkdir(parents=True, exist_ok=True)
    try:
        rounds = args.rounds or repeats
        measured = [
            measure_size(label, repeats, directory, chosen, args.timeout, rounds)
            for label, chosen in plan
        ]
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)

    import torch

    from benchmarks.pause import BenchTrainer, build_model, measure_overhead

    calls = args.overhead_calls or (50_000 if args.quick else 200_000)
    tiny = build_model(4, 1)
    overhead = measure_overhead(
        BenchTrainer(tiny, torch.optim.SGD(tiny.parameters(), lr=LR), shared=False), calls
    )

    print_tables(measured, overhead, repeats, skipped)
    path = write_json(
        "checkpointing",
        {
            "settings": {
                "sizes": sizes,
                "repeats": repeats,
                "rounds": rounds,
                "reference": REFERENCE,
                "load_reference": LOAD_REFERENCE,
                "overhead_calls": calls,
            },
            "sizes": measured,
            "step_overhead": overhead,
            "skipped": skipped,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
