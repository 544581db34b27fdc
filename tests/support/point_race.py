"""A writer taking a resume point every step (keep=1) and a reader resuming beside it.

Run as ``python -m support.point_race writer|reader ...`` by ``test_resume_points_race``.
The writer trains until the stop file appears; the reader resumes a fresh trainer from
the newest point ``ROUNDS`` times and records, per round, what it resumed and anything
raised or warned, and how many listings found a chosen point vanished (a fallback).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

from support.trainers import TinyTrainer
from trainer_resume import ResumePoints
from trainer_resume.resume_points import files
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import first_difference

MAX_STEPS = 200_000  # bounds the writer should the stop file never come
START_TIMEOUT_S = 120.0


def writer(directory: str, stop: str) -> None:
    trainer = TinyTrainer()
    points = ResumePoints(directory, every_steps=1, keep=1, when_busy="wait")
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    while not os.path.exists(stop) and trainer.completed_steps < MAX_STEPS:
        trainer.train_step()
    points.wait()


def reader(directory: str, rounds: int, result: str) -> None:
    vanished = 0
    listed = files._newest_listed

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal vanished
        found, gone = listed(*args, **kwargs)
        vanished += gone
        return found, gone

    files._newest_listed = counting
    deadline = time.monotonic() + START_TIMEOUT_S
    while not files.list_points(directory):  # the writer's first point
        if time.monotonic() > deadline:
            raise TimeoutError(f"no point in {directory} after {START_TIMEOUT_S} s")
        time.sleep(0.01)
    reference = TinyTrainer()
    generators = random_state()
    record: dict[str, Any] = {"steps": [], "errors": [], "warnings": [], "differences": []}
    for _ in range(rounds):
        trainer = TinyTrainer()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                path = trainer.resume_latest(directory)
            except Exception as error:  # noqa: BLE001 - recorded: the test expects none
                record["errors"].append(f"{type(error).__name__}: {error}")
                continue
        record["warnings"] += [str(w.message) for w in caught]
        resumed = trainer.state()  # the next draws of the generators it restored
        steps = trainer.completed_steps
        record["steps"].append(steps)
        if path != os.path.join(directory, files.point_name(steps)):
            record["differences"].append(f"{path} resumed at step {steps}")
        if reference.completed_steps > steps:
            reference, generators = TinyTrainer(), random_state()
        # The reference trains on its own generators: every TinyTrainer() reseeds them.
        restore_random_state(generators)
        while reference.completed_steps < steps:
            reference.train_step()
        generators = random_state()
        difference = first_difference(reference.state(), resumed)
        if difference is not None:
            record["differences"].append(f"step {steps}: {difference.describe()}")
    record["vanished"] = vanished
    with open(result, "w") as stream:
        json.dump(record, stream)


if __name__ == "__main__":
    role, *arguments = sys.argv[1:]
    if role == "writer":
        writer(*arguments)
    else:
        reader(arguments[0], int(arguments[1]), arguments[2])
