"""An Accelerate loop interrupted and resumed: Accelerate's own resume against the adapter.

One standard Accelerate 1.15 loop (single process on CPU, bf16, gradient accumulation
4, dropout, ``shuffle=True`` with ``num_workers=2``, samples drawing from ``random``,
NumPy and torch), ``accelerator.prepare(model, optimizer, scheduler)``, is run

* uninterrupted (the reference: every loss);
* with Accelerate's own recipe: after micro-step ``K`` (inside an accumulation
  window, mid-epoch) the loop calls ``accelerator.save_state(dir)`` and stops; a new
  process calls ``accelerator.load_state(dir)`` and continues the epoch from
  ``accelerator.skip_first_batches(loader, K mod batches per epoch)``;
* with trainer-resume's adapter (``prepare_loader``, ``resume_objects``,
  ``@training_step`` on one micro-batch): after micro-step ``K`` the loop calls
  ``trainer.pause(path)``; a new process calls ``trainer.resume(path)`` and continues.

Reported per method: whether the resumed run's losses and final weights equal the
reference's bit for bit, the first micro-step whose loss differs, the pause time (the
save call, repeated ``--repeats`` times in the interrupted process) and the resume time
(in a fresh process, from the loop built to the first resumed batch delivered: loading,
skipping and worker start-up included; one fresh process per repeat, each training to
the end, the first one's losses compared). Each method is compared with its own
uninterrupted run.

    python -m benchmarks.accelerate_resume --quick   # ~0.6M parameters, 3 repeats
    python -m benchmarks.accelerate_resume           # ~8.5M parameters, 5 repeats

Prints a table and writes benchmarks/out/accelerate_resume.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    framework_resume_result,
    max_weight_difference,
    report_framework_resume,
)

SAMPLES, BATCH, EPOCHS, ACCUMULATION, FEATURES = 200, 8, 2, 4, 64  # 25 batches per epoch
INTERRUPT_AT = 30  # epoch 2, its 5th micro-step: the first of a window, gradients held
SIZES = {"quick": (512, 4), "full": (2048, 4)}  # (width, layers)
METHODS = {
    "accelerate": "Accelerate save_state / load_state / skip_first_batches",
    "adapter": "trainer-resume adapter (pause / resume)",
}
RESULT_PREFIX = "ACCELERATE_RESUME_RESULT "


def _loop(width: int, layers: int, with_trainer: bool) -> Any:
    """Build the loop in this process: the Accelerator, prepared objects and the loader."""
    import numpy as np
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class Noisy(Dataset):
        def __init__(self) -> None:
            generator = torch.Generator().manual_seed(3)
            self.x = torch.randn(SAMPLES, FEATURES, generator=generator)
            self.y = torch.randn(SAMPLES, 1, generator=generator)

        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            noise = 0.1 * (torch.rand(FEATURES) + random.random() + float(np.random.rand()))
            return self.x[index] + noise, self.y[index]

    accelerator = Accelerator(
        cpu=True, mixed_precision="bf16", gradient_accumulation_steps=ACCUMULATION
    )
    set_seed(0)
    blocks: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU(), nn.Dropout(0.2)]
    for _ in range(layers - 2):
        blocks += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.2)]
    model = nn.Sequential(*blocks, nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.05 * step))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    def step(batch: Any) -> Any:
        inputs, targets = batch
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(inputs).float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        return loss.detach()

    if not with_trainer:
        loader = accelerator.prepare(DataLoader(Noisy(), BATCH, shuffle=True, num_workers=2))
        return accelerator, model, loader, step, None

    from trainer_resume import TrainingResumeMixin, training_step
    from trainer_resume.adapters.accelerate import prepare_loader, resume_objects
    from trainer_resume.loaders import ResumableDataLoader

    class Trainer(TrainingResumeMixin):
        def __init__(self) -> None:
            self.loader = prepare_loader(
                accelerator,
                ResumableDataLoader(Noisy(), BATCH, shuffle=True, num_workers=2, resumable=True),
            )
            self._initialize_training_resume({"benchmark": "accelerate_resume"}, version="1")

        def _resume_objects(self) -> dict[str, Any]:
            return resume_objects(
                accelerator, model=model, optimizer=optimizer, scheduler=scheduler
            )

        def _resume_loaders(self) -> dict[str, Any]:
            return {"train": self.loader}

        @training_step
        def step(self, batch: Any) -> Any:
            return step(batch)

    trainer = Trainer()
    return accelerator, model, trainer.loader, trainer.step, trainer


def _child(phase: str, method: str, width: int, layers: int, path: str, repeats: int) -> dict:
    """One process of the benchmark: ``reference``, ``interrupt`` or ``resume``.

    ``path`` is the pause file (or Accelerate's state folder); the final weights of a
    ``reference`` or ``resume`` run go to ``<path>.<phase>-weights.pt``.
    """
    import torch

    accelerator, model, loader, step, trainer = _loop(width, layers, method == "adapter")
    per_epoch = len(loader)
    losses: list[float] = []
    result: dict[str, Any] = {}
    first_epoch, skip = 0, 0
    started = time.perf_counter()
    if phase == "resume":
        if trainer is not None:
            trainer.resume(path)
            first_epoch = loader.epoch
        else:
            accelerator.load_state(path)
            first_epoch, skip = divmod(INTERRUPT_AT, per_epoch)
    for epoch in range(first_epoch, EPOCHS):
        batches = loader
        if epoch == first_epoch and skip:
            batches = accelerator.skip_first_batches(loader, skip)
        for batch in batches:
            if phase == "resume" and "resume_s" not in result:
                # The first resumed batch is here: loading, skipping and worker start-up are behind.
                result["resume_s"] = time.perf_counter() - started
            losses.append(step(batch).item())
            if phase == "interrupt" and len(losses) == INTERRUPT_AT:
                times = []
                for repeat in range(repeats):
                    target = f"{path}-{repeat}" if repeat else path
                    begin = time.perf_counter()
                    if trainer is not None:
                        trainer.pause(target)
                    else:
                        accelerator.save_state(target)
                    times.append(time.perf_counter() - begin)
                return {"pause_s": times}
    torch.save(accelerator.unwrap_model(model).state_dict(), f"{path}.{phase}-weights.pt")
    result.update(losses=losses, per_epoch=per_epoch)
    return result


def _run(arguments: list[str], timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.accelerate_resume", "--child", *arguments]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{arguments} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def _first_difference(expected: list[float], got: list[float], offset: int) -> int | None:
    for number, (a, b) in enumerate(zip(expected, got), start=offset + 1):
        if a != b:
            return number
    return None if len(expected) == len(got) else offset + min(len(expected), len(got)) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    parser.add_argument("--child", nargs=6, metavar=("PHASE", "METHOD", "W", "L", "PATH", "R"))
    args = parser.parse_args(argv)
    if args.child:
        phase, method, width, layers, path, repeats = args.child
        result = _child(phase, method, int(width), int(layers), path, int(repeats))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    width, layers = SIZES["quick" if args.quick else "full"]
    repeats = args.repeats or (3 if args.quick else 5)
    scratch = Path(tempfile.mkdtemp(prefix="accelerate-resume-"))
    try:
        shape = [str(width), str(layers)]
        methods: dict[str, Any] = {}
        for method in METHODS:
            # Each method against its own uninterrupted run: the two loaders order alike
            # only by chance.
            path = str(scratch / method)
            reference = _run(["reference", method, *shape, path, "0"], args.timeout)
            paused = _run(["interrupt", method, *shape, path, str(repeats)], args.timeout)
            resumes = [
                _run(["resume", method, *shape, path, "0"], args.timeout) for _ in range(repeats)
            ]
            # The last resume's losses and weights file (the resumes of one pause run alike).
            losses = resumes[-1]["losses"]
            expected = reference["losses"][INTERRUPT_AT:]
            first = _first_difference(expected, losses, INTERRUPT_AT)
            weights = max_weight_difference(
                Path(f"{path}.reference-weights.pt"), Path(f"{path}.resume-weights.pt")
            )
            methods[method] = framework_resume_result(
                METHODS[method],
                paused["pause_s"],
                [run["resume_s"] for run in resumes],
                first,
                weights,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    parameters = _parameter_count(width, layers)
    total = len(reference["losses"])
    report_framework_resume(
        "accelerate_resume",
        f"Accelerate loop, {parameters / 1e6:.1f}M parameters, bf16, accumulation {ACCUMULATION}, "
        f"{total} micro-steps, interrupted after micro-step {INTERRUPT_AT} (inside a window); "
        f"medians of {repeats}",
        "micro-step",
        methods,
        parameters=parameters,
        steps=total,  # micro-steps
        interrupted_after=INTERRUPT_AT,
        accumulation=ACCUMULATION,
        repeats=repeats,
    )
    return 0


def _parameter_count(width: int, layers: int) -> int:
    return (FEATURES + 1) * width + (layers - 2) * (width + 1) * width + width + 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
