"""A run killed with SIGKILL at random moments continues from its resume points, exactly."""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from support.point_trainers import CRASH_STEPS, crash_config, train_with_points
from support.trainers import TinyTrainer

from trainer_resume import load_checkpoint
from trainer_resume.resume_points._lock import GUARD_NAME, LOCK_NAME
from trainer_resume.resume_points.files import latest_checkpoint, list_points, point_name

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("error::trainer_resume.SkippedCheckpointWarning"),
    pytest.mark.skipif(os.name != "posix", reason="needs SIGKILL and a fork server"),
]

KILLS = 20
POINT_NAME = re.compile(r"point-\d{12}\.ckpt")


def forkserver() -> multiprocessing.context.BaseContext:
    # Children are forked from a server that imported torch but never computed with it
    # (forking a process that ran OpenMP kernels is unsafe); a fresh interpreter per
    # kill would spend a minute importing torch (and torch._dynamo, which the
    # optimizers import on first use).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "support.point_trainers"])
    return context


def wait_for(condition, child, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert child.is_alive() or condition(), f"child exited with {child.exitcode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def newest_point(directory) -> int:
    found = list_points(directory) if os.path.isdir(directory) else []
    return found[-1][0] if found else 0


def test_run_killed_20_times_at_random_moments_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
    reference = TinyTrainer(crash_config())
    expected_losses = [reference.train_step() for _ in range(CRASH_STEPS)]

    points, losses = tmp_path / "points", tmp_path / "losses"
    losses.mkdir()
    context = forkserver()
    moments = random.Random(17)
    resumed_at = []
    for kill in range(KILLS + 1):
        ready = tmp_path / f"ready-{kill}"
        child = context.Process(
            target=train_with_points, args=(str(points), str(losses), str(ready))
        )
        child.start()
        if kill == KILLS:  # the last child runs to the end
            child.join(120)
            assert child.exitcode == 0, f"the final child exited with {child.exitcode}"
            break
        try:
            wait_for(ready.exists, child, "the resume")
            start = int(ready.read_text().split()[0])
            resumed_at.append(start)
            # Progress: the child completes 1 to 8 steps beyond its resume point (points are
            # due every 3), then dies at a random moment (inside a step, a snapshot, a
            # background write or a rename).
            target = start + moments.randint(1, 8)
            wait_for((losses / f"{target:06d}.pt").exists, child, f"step {target}")
            if kill % 2:
                # Every other child lives until a point beyond its resume is in place:
                # however slowly a loaded machine writes, the run moves forward.
                wait_for(lambda s=start: newest_point(points) > s, child, f"a point after {start}")
            time.sleep(moments.uniform(0.0, 0.005))
        finally:
            child.kill()
            child.join(30)
        assert child.exitcode in (-signal.SIGKILL, 0), child.exitcode
        newest = latest_checkpoint(points)
        if newest is not None:  # never a temp file; always one that verifies
            assert POINT_NAME.fullmatch(os.path.basename(newest)), newest
            assert load_checkpoint(newest)["completed_steps"] >= start

    print("resumed at", resumed_at)
    assert resumed_at[0] == 0 and resumed_at[-1] > 0, resumed_at
    assert resumed_at == sorted(resumed_at), resumed_at
    for step, expected in enumerate(expected_losses, start=1):
        assert torch.equal(torch.load(losses / f"{step:06d}.pt"), expected), f"loss of step {step}"
    final = torch.load(losses / "final.pt")
    for name, value in reference.model.state_dict().items():
        assert torch.equal(final["model"][name], value), name
    for index, state in reference.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(final["optimizer"]["state"][index][name], value), (index, name)
    # The last writer's lock file stays (its run did not finish), and the guard of a
    # writer killed while it took the lock; nothing else hidden.
    assert not [
        e for e in os.listdir(points) if e.startswith(".") and e not in (LOCK_NAME, GUARD_NAME)
    ], "temp files left behind"


def test_interpreter_exit_waits_for_the_point_being_written(tmp_path):
    # A real interpreter exit (a multiprocessing child ends with os._exit instead).
    code = f"from support.point_trainers import exit_while_writing; exit_while_writing({str(tmp_path)!r})"
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([tests, os.path.dirname(tests), os.environ.get("PYTHONPATH", "")])
    environment = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=environment, timeout=120, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    point = load_checkpoint(tmp_path / point_name(1))
    assert point["completed_steps"] == 1
