"""Against a real S3 server (moto), in this process: the resume points' lock object left by
a writer on another machine. A job requeued on a new machine moments after its old one
was lost finds the old writer's lock with its lease still running; it waits for the
lease and takes the lock over, or, when the lock is renewed meanwhile (the writer is
alive), is refused with 348 naming it. The lease and the watching interval are
shortened here; nothing else is.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from typing import Any

import pytest
import s3fs
from support.point_trainers import points_trainer
from support.trainers import trained_state, uninterrupted_state

from trainer_resume.difference import first_difference
from trainer_resume.errors import ResumePointsInUseError
from trainer_resume.resume_points import _object_lock

# Long enough that a renewal every 0.3 s is seen although a loaded machine stalls
# the renewing thread for seconds (a lease run out then would be taken over).
LEASE_S = 6.0


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_object_lock, "LEASE_S", LEASE_S)
    monkeypatch.setattr(_object_lock, "WATCH_S", 0.1)


def _lock_path(url: str) -> str:
    return f"{url[len('s3://') :]}/{_object_lock.LOCK_NAME}"


def _leave_lock(url: str, renewed: float) -> dict[str, Any]:
    """The lock object a writer on another machine wrote, last renewed at ``renewed``."""
    record = {
        "pid": 4242,
        "host": "another-machine",
        "boot": "another-boot",
        "pidns": "another-namespace",
        "start": 1234,
        "since": "2026-12-05 00:00:00 +0000",
        "renewed": renewed,
        "token": secrets.token_hex(16),
    }
    s3fs.S3FileSystem(skip_instance_cache=True).pipe_file(
        _lock_path(url), (json.dumps(record) + "\n").encode()
    )
    return record


def _writer_beside_a_lock_from_another_machine(bucket: str) -> tuple[str, Any, dict[str, Any]]:
    """A trainer taking a point at every step at ``<bucket>/runs/points``, whose lock a
    writer on another machine renewed just now: the points' URL, the trainer, the lock."""
    url = f"{bucket}/runs/points"
    trainer = points_trainer(url, every_steps=1, when_busy="wait")
    return url, trainer, _leave_lock(url, renewed=time.time())


def _lock_record(url: str) -> dict[str, Any]:
    return json.loads(s3fs.S3FileSystem(skip_instance_cache=True).cat_file(_lock_path(url)))


def test_a_lock_left_by_a_writer_lost_with_another_machine_is_taken_over_once_its_lease_runs_out(
    bucket: str,
) -> None:
    url, trainer, left = _writer_beside_a_lock_from_another_machine(bucket)
    expires = left["renewed"] + LEASE_S

    trainer.train_step()  # its point waits for the lease, then takes the lock over

    assert time.time() > expires  # not before the lease ran out
    held = _lock_record(url)
    assert held["pid"] == os.getpid() and held["token"] != left["token"]
    state = trained_state(trainer, 3)
    trainer.points.wait()
    resumed = points_trainer(url, every_steps=100)
    resumed.resume_latest()
    assert resumed.completed_steps == 3
    assert first_difference(uninterrupted_state(3), state) is None
    assert first_difference(uninterrupted_state(6), trained_state(resumed, 6)) is None
    trainer.finish(f"{url}/pause.ckpt")  # lets the lock go
    assert not s3fs.S3FileSystem(skip_instance_cache=True).exists(_lock_path(url))


def test_a_lock_renewed_while_a_new_writer_waits_is_refused_with_348_naming_its_writer(
    bucket: str,
) -> None:
    url, trainer, left = _writer_beside_a_lock_from_another_machine(bucket)

    stop = threading.Event()

    def renew() -> None:  # the writer on the other machine, alive: it renews its lease
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        while not stop.wait(0.3):
            fs.pipe_file(
                _lock_path(url), (json.dumps({**left, "renewed": time.time()}) + "\n").encode()
            )

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        with pytest.raises(
            ResumePointsInUseError,
            match=r"^\[348\] .*process 4242 on host another-machine .*renewed or took the lock while",
        ):
            trainer.train_step()
    finally:
        stop.set()
        renewer.join()
    assert _lock_record(url)["token"] == left["token"]  # left to its live writer


def test_a_holders_finalizer_returns_at_once_while_another_thread_holds_the_lock_registry() -> None:
    # The garbage collector runs it on whatever thread allocates: on fsspec's event-loop
    # thread, while the main thread held the registry and waited for that loop (a read of
    # the lock object), waiting for the registry there hung the run.
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _object_lock._guard:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(30)
    try:
        started = time.monotonic()
        _object_lock._let_go_elsewhere("s3://nowhere/points", 12345)  # holds nothing there
        assert time.monotonic() - started < 5
    finally:
        release.set()
        holder.join()
