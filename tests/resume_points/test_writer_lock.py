"""No process but the writer holds a resume-point directory's lock: a writer that dies,
however it dies, leaves the lock to the next process at once, while a live writer still
refuses a second one (348)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import process_tree
from support.elastic_child import EPOCHS, POINT_EVERY, assert_same_final_state
from support.lightning_procs import TESTS
from support.lock_writers import RACERS, ROUNDS
from support.process_names import FLOCK_SCRIPT, name_of_an_ended_process

from trainer_resume import ResumePointsInUseError
from trainer_resume.resume_points._lock import GUARD_NAME, LOCK_NAME, hold_writer_lock

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="flock, fork, /proc and SIGKILL"
)

TIMEOUT_S = 300.0  # bounds a hang; each process here needs seconds
ENVIRONMENT = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    OMP_NUM_THREADS="1",
)


class Holder:
    """What a writer's lock lives as long as."""


def _refusal(directory: Path, pid: int) -> str:
    return (
        rf"^\[348\] {re.escape(ResumePointsInUseError.message)}: {re.escape(str(directory))} "
        rf"is written by process {pid} on host {re.escape(socket.gethostname())} "
        rf"\(since [^)]+\); it holds {re.escape(str(directory / LOCK_NAME))}$"
    )


def _taken_and_let_go(directory: Path) -> None:
    holder = Holder()
    hold_writer_lock(str(directory), holder)
    del holder  # lets the lock go


def _start(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENVIRONMENT,
        cwd=TESTS,
    )


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=TIMEOUT_S)


# ------------------------------------------------------------------- the writer dies


def _run(out: Path, *arguments: str, attempt: int = 0) -> int:
    """Run the epoch-loop child alone; its exit status, as soon as it has ended.

    Its output goes to a file, not a pipe: run() would wait for the end of a pipe, which
    the child's workers hold too.
    """
    environment = dict(ENVIRONMENT, TORCHELASTIC_RESTART_COUNT=str(attempt))
    environment.pop("WORLD_SIZE", None)
    with open(out / f"log_a{attempt}.txt", "w") as log:
        return subprocess.run(
            [sys.executable, "-m", "support.elastic_child", str(out), *arguments],
            cwd=TESTS,
            env=environment,
            timeout=TIMEOUT_S,
            stdout=log,
            stderr=subprocess.STDOUT,
        ).returncode


@pytest.mark.slow
def test_a_writer_killed_with_fork_workers_leaves_its_lock_at_once_and_the_run_resumes_exactly(
    tmp_path,
):
    # One process, no torchrun: 12 steps per epoch; step 18 is mid-way through the
    # second epoch, whose two fork workers were forked after the first point took the
    # lock (step 4), and whose newest point is step 16.
    steps_per_epoch, kill_step = 12, 18
    assert (kill_step - 1) // steps_per_epoch == 1 and kill_step % POINT_EVERY != 0
    reference, out = tmp_path / "reference", tmp_path / "run"
    reference.mkdir()
    out.mkdir()
    assert _run(reference) == 0
    assert _run(out, "0", str(kill_step)) == -signal.SIGKILL
    workers = [int(pid) for pid in (out / "pids_a0_r0.txt").read_text().split()[1:]]
    assert len(workers) == 2
    _taken_and_let_go(out / "points")  # at once: no 348 naming the dead writer

    assert _run(out, attempt=1) == 0  # a new process resumes and takes points
    assert all(process_tree.ended(pid) for pid in workers)
    assert (out / "start_a1_r0.txt").read_text() == "16"
    expected = torch.load(reference / "losses_a0_r0.pt")
    assert sorted(expected) == list(range(1, EPOCHS * steps_per_epoch + 1))
    killed = torch.load(out / "losses_a0_r0.pt")
    resumed = torch.load(out / "losses_a1_r0.pt")
    assert sorted(killed) == list(range(1, kill_step))  # the kill landed in step 18
    assert sorted(resumed) == list(range(17, EPOCHS * steps_per_epoch + 1))
    for losses in (killed, resumed):  # bit for bit, the redone steps too
        assert losses == {step: expected[step] for step in losses}
    assert_same_final_state(reference / "result_a0_r0.pt", out / "result_a1_r0.pt")


@pytest.mark.slow
def test_a_live_writer_is_refused_and_its_lock_is_free_the_moment_it_dies_though_its_child_lives(
    tmp_path, caplog
):
    writer = _start("-m", "support.lock_writers", "fork", str(tmp_path))
    child = None
    try:
        child = int(writer.stdout.readline().split()[1])
        with pytest.raises(ResumePointsInUseError, match=_refusal(tmp_path, writer.pid)):
            _taken_and_let_go(tmp_path)  # its child closed its copy, the writer holds on
        lock = os.stat(tmp_path / LOCK_NAME).st_ino
        writer.kill()
        writer.wait(timeout=TIMEOUT_S)
        assert not process_tree.ended(child)
        with caplog.at_level(logging.WARNING, logger="trainer_resume"):
            _taken_and_let_go(tmp_path)
        assert not process_tree.ended(child)
        # The lock was free: the same file, nothing taken over.
        assert os.stat(tmp_path / LOCK_NAME).st_ino == lock and not caplog.records
    finally:
        _stop(writer)  # closing its stdin ends the child too
        if child is not None and not process_tree.ended(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_a_dead_writers_lock_held_through_a_duplicate_of_its_descriptor_is_taken_over(
    tmp_path, caplog
):
    writer = _start("-m", "support.lock_writers", "duplicate", str(tmp_path))
    keeper = None
    try:
        keeper = int(writer.stdout.readline().split()[1])
        with pytest.raises(ResumePointsInUseError, match=_refusal(tmp_path, writer.pid)):
            _taken_and_let_go(tmp_path)
        lock = os.stat(tmp_path / LOCK_NAME).st_ino
        since = json.loads((tmp_path / LOCK_NAME).read_text())["since"]
        writer.kill()
        writer.wait(timeout=TIMEOUT_S)
        assert not process_tree.ended(keeper)  # it still holds the dead writer's flock
        with caplog.at_level(logging.WARNING, logger="trainer_resume"):
            holder = Holder()
            hold_writer_lock(str(tmp_path), holder)
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid()
        assert os.stat(tmp_path / LOCK_NAME).st_ino != lock  # a new lock file
        assert [r.getMessage() for r in caplog.records] == [
            f"{tmp_path / LOCK_NAME}: the writer that held it, process {writer.pid} on host "
            f"{socket.gethostname()} (since {since}), has ended, but a process it "
            "started still holds the lock; taking it over"
        ]
        assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # the guard is gone again
        del holder
    finally:
        _stop(writer)
        if keeper is not None and not process_tree.ended(keeper):
            os.kill(keeper, signal.SIGKILL)


@pytest.mark.slow
def test_of_processes_racing_for_a_dead_writers_lock_exactly_one_takes_it(tmp_path):
    racers = subprocess.run(
        [sys.executable, "-m", "support.lock_writers", "race", str(tmp_path)],
        cwd=TESTS,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert racers.returncode == 0, racers.stderr[-3000:]
    rounds = json.loads(racers.stdout.splitlines()[-1])
    assert len(rounds) == ROUNDS
    for outcomes in rounds:
        assert len(outcomes) == RACERS
        assert outcomes.count("held") == 1, rounds
        refused = [o for o in outcomes if o != "held"]
        assert all(o.startswith("ResumePointsInUseError: [348]") for o in refused), refused


# -------------------------------------------------- whose lock is taken over, whose not


def _tampered(name: dict[str, Any], change: str) -> dict[str, Any]:
    if change == "other host":
        return {**name, "host": name["host"] + "-elsewhere"}
    if change == "other boot":
        return {**name, "boot": "00000000-0000-0000-0000-000000000000"}
    if change == "other pid namespace":
        return {**name, "pidns": "pid:[1]"}
    if change == "earlier version":  # its writers recorded pid, host and since only
        return {key: name[key] for key in ("pid", "host", "since")}
    return name


@pytest.mark.parametrize(
    ("owner", "taken_over"),
    [
        ("ended", True),
        ("holder, started at another time (pid reused)", True),
        ("holder", False),
        ("ended, other host", False),
        ("ended, other boot", False),
        ("ended, other pid namespace", False),
        ("ended, earlier version", False),
        ("none yet", False),
    ],
)
def test_a_held_lock_is_taken_over_only_when_the_writer_it_names_has_certainly_ended(
    tmp_path, owner, taken_over
):
    path = tmp_path / LOCK_NAME
    keeper = _start("-c", FLOCK_SCRIPT, str(path))
    try:
        name = json.loads(keeper.stdout.readline())  # it holds the flock from now on
        if owner.startswith("ended"):
            name = name_of_an_ended_process()
        elif owner.startswith("holder, started"):
            name = {**name, "start": name["start"] + 1}
        name = _tampered({**name, "since": "then"}, owner.partition(", ")[2])
        path.write_text("" if owner == "none yet" else json.dumps(name))
        if taken_over:
            _taken_and_let_go(tmp_path)
            assert keeper.poll() is None  # taken over while the old file stays locked
            assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]
        else:
            with pytest.raises(ResumePointsInUseError) as refused:
                _taken_and_let_go(tmp_path)
            named = "another process (its record is being written)"
            if owner != "none yet":
                named = f"process {name['pid']} on host {name['host']} (since then)"
            assert f"is written by {named}; it holds {path}" in str(refused.value)
            assert path.read_text() == ("" if owner == "none yet" else json.dumps(name))
        assert GUARD_NAME not in os.listdir(tmp_path)
    finally:
        _stop(keeper)
