"""The workers the library starts never outlive their trainer: killed with SIGKILL, it
takes them with it within a second, though they keep SIGTERM blocked."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import process_tree
from support.lightning_procs import TESTS

from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.pause_signals import worker_start
from trainer_resume.processes.names import this_process
from trainer_resume.processes.parent_death import DieWithParent

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

TIMEOUT_S = 300.0  # bounds a hang: spawned workers import torch on a busy machine
EXIT_S = 1.0
ENVIRONMENT = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    OMP_NUM_THREADS="1",
)


def _blocks_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    raise AssertionError(f"no SigBlk for {pid}")


def _start(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "support.orphan_workers", *arguments],
        cwd=TESTS,
        env=ENVIRONMENT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _kill_and_reap(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(timeout=TIMEOUT_S)


@pytest.mark.slow
def test_every_loaders_workers_exit_within_a_second_of_their_trainers_sigkill():
    trainer = _start("started")
    workers: dict[str, list[int]] = {}
    try:
        line = trainer.stdout.readline()
        assert line, f"the trainer exited with {trainer.wait(timeout=TIMEOUT_S)}"
        workers = json.loads(line)
        assert sorted(workers) == [
            "dali-fork",
            "iterable-fork",
            "map-fork",
            "map-forkserver",
            "map-spawn",
            "plain-fork",
        ]
        for name, pids in workers.items():
            assert pids and not any(map(process_tree.ended, pids)), (name, pids)
            if name != "dali-fork":  # DALI's own workers do not block the pause signals
                assert all(map(_blocks_sigterm, pids)), name
        _kill_and_reap(trainer)
        died = time.monotonic()
        pending = {pid: name for name, pids in workers.items() for pid in pids}
        while pending and time.monotonic() - died < EXIT_S:
            pending = {pid: name for pid, name in pending.items() if not process_tree.ended(pid)}
            time.sleep(0.005)
        assert not pending, f"alive {EXIT_S} s after their trainer's SIGKILL: {pending}"
    finally:
        if trainer.poll() is None:
            _kill_and_reap(trainer)
        for pid in (pid for pids in workers.values() for pid in pids):
            if not process_tree.ended(pid):
                os.kill(pid, signal.SIGKILL)  # a failed test leaves no orphan behind


@pytest.mark.slow
def test_a_child_whose_starter_died_before_it_was_tied_kills_itself(tmp_path: Path):
    starter = _start("late", str(tmp_path))
    children: list[int] = []
    try:
        children = [int(pid) for pid in starter.stdout.readline().split()[1:]]
        assert len(children) == 2
        _kill_and_reap(starter)  # the children outlive it untied, for now
        assert not any(map(process_tree.ended, children))
        starter.stdin.close()  # they tie themselves to their dead starter
        deadline = time.monotonic() + TIMEOUT_S
        while not all(map(process_tree.ended, children)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(map(process_tree.ended, children))
        assert not list(tmp_path.glob("survived-*"))
    finally:
        for pid in children:
            if not process_tree.ended(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_workers_started_by_a_thread_that_ended_keep_serving_batches():
    # The kernel's parent-death signal follows the thread that forked: such workers are
    # tied to their process by a watching thread instead, or they would die here.
    trainer = _start("thread")
    try:
        output, _ = trainer.communicate(timeout=TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            _kill_and_reap(trainer)
    assert trainer.returncode == 0
    assert json.loads(output.splitlines()[-1]) == {"batches": 12}  # three epochs of four


def _user_init(worker_id: int) -> None:
    pass


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_new_interpreters_worker_init_fn_ties_it_first_and_the_loader_keeps_its_own(context):
    loader = ResumableDataLoader(
        list(range(4)), num_workers=1, multiprocessing_context=context, worker_init_fn=_user_init
    )
    with pytest.raises(ZeroDivisionError), worker_start(loader):
        wrapped = loader.worker_init_fn  # what DataLoader hands the starting workers
        assert isinstance(wrapped, DieWithParent) and wrapped.init_fn is _user_init
        assert wrapped.bond.starter == this_process()
        assert wrapped.bond.direct is (context == "spawn")
        assert pickle.loads(pickle.dumps(wrapped)).init_fn is _user_init  # sent to the worker
        1 / 0  # noqa: B018 - iter() failing as the workers start
    assert loader.worker_init_fn is _user_init  # put back, also after a failure


def test_a_forked_worker_keeps_its_worker_init_fn_the_fork_hook_ties_it():
    loader = ResumableDataLoader(
        list(range(4)), num_workers=1, multiprocessing_context="fork", worker_init_fn=_user_init
    )
    with worker_start(loader):
        assert loader.worker_init_fn is _user_init
