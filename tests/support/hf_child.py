"""ResumableTrainer runs in a process of their own: ``python -m support.hf_child MODE OUT PLAN``.

``PLAN`` is a JSON list of ``{"variant": {...}, "reference": bool, "signals": [m, ...]}``
(see ``support.hf_runs.variant``); each ``m`` is the micro-batch (counted from 0 over
the run) during which the run sends SIGTERM to its own process group (``-1``: during
its first evaluation). Every run
builds a fresh trainer, model and data, as a new command would, in
``OUT/<variant name>/`` (``reference``) or ``OUT/<variant name>/signal-<m>/``.

Modes:
    pause   for each variant: the uninterrupted run (``reference.pt``, when asked),
            then one run per signal, which pauses (``paused.pt``).
    resume  for each variant and signal: the same command again, which resumes from
            the pause file and finishes (``resumed.pt``); then once more, which must
            say that the run is finished (recorded as ``finished``).

The process makes itself a process group first, so that its SIGTERM reaches its
loader workers and nothing outside.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from support.hf_runs import build, run_record, variant_name
from trainer_resume import RunFinishedError


def _pause(out: Path, plan: list[dict[str, Any]]) -> None:
    for entry in plan:
        settings = entry["variant"]
        folder = out / variant_name(settings)
        if entry.get("reference"):
            trainer = build(folder / "reference", settings)
            trainer.train()
            assert not trainer.paused, "the uninterrupted run paused"
            torch.save(run_record(trainer, final=True), folder / "reference.pt")
        for micro_batch in entry["signals"]:
            where = folder / f"signal-{micro_batch}"
            trainer = build(where, settings, signal_at=micro_batch)
            trainer.train()
            record = run_record(trainer, final=False)
            record["paused"] = trainer.paused
            torch.save(record, where / "paused.pt")


def _resume(out: Path, plan: list[dict[str, Any]]) -> None:
    for entry in plan:
        settings = entry["variant"]
        for micro_batch in entry["signals"]:
            where = out / variant_name(settings) / f"signal-{micro_batch}"
            trainer = build(where, settings)
            trainer.train()
            record = run_record(trainer, final=True)
            record["paused"] = trainer.paused
            again = build(where, settings)
            try:
                again.train()
                record["finished"] = "trained again"
            except RunFinishedError as error:
                record["finished"] = str(error)
            torch.save(record, where / "resumed.pt")


def main(argv: list[str]) -> int:
    mode, out, plan = argv[0], Path(argv[1]), json.loads(argv[2])
    os.setpgrp()  # a group of our own: our SIGTERM reaches the loader workers, nothing else
    warnings.simplefilter("ignore")  # transformers' deprecation notes are not under test
    # Trainer.train() starts with a full gc.collect() (accelerator.free_memory): with the
    # imported modules kept out of its reach it takes milliseconds instead of a second.
    gc.freeze()
    {"pause": _pause, "resume": _resume}[mode](out, plan)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
