"""Processes around a resume-point directory's writer lock, for the writer-lock tests.

``python -m support.lock_writers MODE DIRECTORY`` (tests/ on ``PYTHONPATH``):

* ``fork``: take the directory's lock as a writer does, fork a child (which runs
  Python's fork hooks), print ``held <child pid>`` and wait for stdin to close; the
  child waits for the same.
* ``duplicate``: take the lock, start a process that inherits a duplicate of the
  locked descriptor without running any fork hook (as a child stuck inside
  ``os.fork`` would hold it), print ``held <its pid>`` and wait for stdin to close.
* ``race``: ``ROUNDS`` times, in a new subdirectory, leave a lock whose writer has
  ended but which a process it started still holds, and fork ``RACERS`` children
  that each try to take it at the same moment; print one JSON line: per round, what
  each racer got (``"held"`` or the error's text).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
from typing import Any

from trainer_resume.processes.names import this_process
from trainer_resume.resume_points import _lock

RACERS = 6
ROUNDS = 10  # a race lost by the lock is rare: several rounds to catch one


class Holder:
    """What holds a writer's lock in these processes (the lock lives while it does)."""


def _hold(directory: str) -> tuple[Holder, int]:
    holder = Holder()
    _lock.hold_writer_lock(directory, holder)
    return holder, _lock._held[os.path.realpath(directory)][0]


def fork(directory: str) -> None:
    holder, _ = _hold(directory)
    child = os.fork()
    if child == 0:
        sys.stdin.read()
        os._exit(0)
    print(f"held {child}", flush=True)
    sys.stdin.read()
    del holder


def duplicate(directory: str) -> None:
    holder, descriptor = _hold(directory)
    keeper = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], pass_fds=[descriptor]
    )
    print(f"held {keeper.pid}", flush=True)
    sys.stdin.read()
    del holder


def race(directory: str) -> None:
    logging.getLogger("trainer_resume").setLevel(logging.ERROR)  # a takeover per round
    rounds = []
    for number in range(ROUNDS):
        arena = os.path.join(directory, f"round-{number}")
        os.mkdir(arena)
        keeper, release = _dead_writers_lock(arena)
        rounds.append(_race(arena))
        os.close(release)
        os.waitpid(keeper, 0)
    print(json.dumps(rounds), flush=True)


def _dead_writers_lock(directory: str) -> tuple[int, int]:
    """A lock left by a writer that has ended, still held by a process it started: that
    process's pid, and the pipe end whose closing ends it."""
    path = os.path.join(directory, _lock.LOCK_NAME)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    release_r, release_w = os.pipe()
    keeper = os.fork()
    if keeper == 0:  # holds its duplicate of the locked descriptor until released
        os.close(release_w)
        os.read(release_r, 1)
        os._exit(0)
    os.close(release_r)
    os.close(descriptor)  # only the keeper's duplicate holds the flock now
    writer = os.fork()
    if writer == 0:
        os._exit(0)
    os.waitpid(writer, 0)  # reaped: its name names a process that has ended
    with open(path, "w") as record:
        record.write(json.dumps({**this_process(), "pid": writer, "since": "then"}))
    return keeper, release_w


def _race(directory: str) -> list[str]:
    # Each racer waits for the end of a pipe: closing it releases them all at once.
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    results_r, results_w = os.pipe()
    children = []
    for _ in range(RACERS):
        child = os.fork()
        if child == 0:
            os.close(go_w)
            os.close(done_w)
            os.read(go_r, 1)  # every racer is forked and waiting: go
            try:
                kept = _hold(directory)  # noqa: F841 - the lock lives as long as its holder
                outcome: Any = "held"
            except Exception as error:  # noqa: BLE001 - reported to the test
                outcome = f"{type(error).__name__}: {error}"
            os.write(results_w, (json.dumps(outcome) + "\n").encode())
            os.read(done_r, 1)  # keep what it took until every racer has reported
            os._exit(0)
        children.append(child)
    for descriptor in (go_r, done_r, results_w):
        os.close(descriptor)
    os.close(go_w)
    with os.fdopen(results_r) as results:
        outcomes = [json.loads(results.readline()) for _ in range(RACERS)]
    os.close(done_w)
    for child in children:
        os.waitpid(child, 0)
    return outcomes


if __name__ == "__main__":
    {"fork": fork, "duplicate": duplicate, "race": race}[sys.argv[1]](sys.argv[2])
