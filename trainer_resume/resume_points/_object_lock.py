"""One writing process per resume-point prefix at a URL: a lock object with a lease.

An object store has no ``flock``. The writer creates ``<prefix>/.trainer-resume.lock``
with a conditional write (S3 ``If-None-Match: *``), which fails when the object
exists: of two writers that try at once, exactly one creates it. The object names
the writer (as :mod:`._lock` names it) and its lease: the writer rewrites it every
:data:`RENEW_S` seconds from a daemon thread, and a lock whose last renewal is older
than :data:`LEASE_S` seconds (a writer killed with its machine, which nobody can ask)
is taken over; so is one whose writer has certainly ended on this host. A writer
alive on this host is refused at once with ``ResumePointsInUseError`` (348) naming
it. One on another machine with its lease still running may have been lost with that
machine a moment ago (a preempted job requeued elsewhere): the lock is watched until
it is renewed (a live writer: refused, 348) or its lease runs out unrenewed (taken
over), at most :data:`LEASE_S` seconds. The run's end removes the object.

Stores without conditional writes (fsspec's ``memory://``; others, see
docs/cloud-storage.md) cannot detect two writers starting at the same moment: the
lock object is then written and read back, which detects a second writer started
later, not one racing the first.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import weakref
from typing import Any

from ..errors import CheckpointWriteError, ResumePointsInUseError
from ..processes.names import checkable, ended, this_process
from ..storage import objects, paths

__all__ = ["LEASE_S", "RENEW_S", "WATCH_S", "hold_object_lock", "release_object_lock"]

LOCK_NAME = ".trainer-resume.lock"
# A lock not renewed for this long belongs to a writer that is gone.
LEASE_S = 90.0
RENEW_S = 15.0
# How often a lock with a running lease, held from another machine, is read again.
WATCH_S = 1.0
_ROUNDS = 4

_log = logging.getLogger("trainer_resume")
_held: dict[str, _Lease] = {}
# Re-entrant: a release may run on a thread that holds it, in the middle of taking a lock
# (reads and writes that allocate, a wait for a lease). A holder's finalizer releases on a
# thread of its own (see _let_go_elsewhere).
_guard = threading.RLock()


class _Lease:
    """This process's lock object at one prefix and the thread that renews it."""

    def __init__(self, url: str, record: dict[str, Any]) -> None:
        self.url = url
        self.record = record
        self.holders: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name="trainer-resume-lock-lease", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                current = _read(self.url)
                if current is None or current.get("token") != self.record["token"]:
                    _log.error("%s: the resume points' lock was taken over", self.url)
                    return
                self.record["renewed"] = time.time()
                objects.upload(self.url, [_encode(self.record)])
            except Exception as exc:  # noqa: BLE001 - retried at the next renewal
                _log.warning("%s: renewing the resume points' lock failed: %r", self.url, exc)

    def stop(self) -> None:
        self._stop.set()


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


def _read(url: str) -> dict[str, Any] | None:
    try:
        record = json.loads(objects.read_object(url).decode())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def hold_object_lock(directory: str, holder: object) -> None:
    """Make this process the one writer at the prefix ``directory`` while ``holder`` lives.

    Raises:
        ResumePointsInUseError: a live writer holds the lock object (348).
        CheckpointWriteError: the lock object cannot be written (the cause chained).
    """
    url = paths.join(directory, LOCK_NAME)
    with _guard:
        lease = _held.get(url)
        if lease is None:
            lease = _held[url] = _Lease(url, _take(directory, url))
        if id(holder) not in lease.holders:
            lease.holders.add(id(holder))
            weakref.finalize(holder, _let_go_elsewhere, directory, id(holder))


def _take(directory: str, url: str) -> dict[str, Any]:
    watched = False
    for _ in range(_ROUNDS):
        now = time.time()
        record = {
            **this_process(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "renewed": now,
            "token": secrets.token_hex(16),
        }
        try:
            created = objects.create_exclusive(url, _encode(record))
        except Exception as exc:
            raise CheckpointWriteError(
                f"{directory}: cannot write the lock {url}: {exc!r}"
            ) from exc
        if created and (_read(url) or {}).get("token") == record["token"]:
            return record
        owner = _read(url)
        if owner is None:
            continue  # removed meanwhile: try again
        if not _gone(owner):
            # Alive on this host, or the second holder seen: refused at once.
            if watched or checkable(owner):
                raise ResumePointsInUseError(
                    f"{directory} is written by {_named(owner)}; it holds {url}"
                )
            watched = True
            if not _lease_ran_out(directory, url, owner):
                continue  # removed meanwhile: try again
        _log.warning("%s: the writer that held it, %s, is gone; taking it over", url, _named(owner))
        try:
            objects.remove(url)
        except FileNotFoundError:
            pass
    raise ResumePointsInUseError(f"{directory}: other processes kept replacing the lock {url}")


def _lease_ran_out(directory: str, url: str, owner: dict[str, Any]) -> bool:
    """Watch ``owner``'s lock, held from another machine, until its lease runs out.

    Returns:
        True: it was not renewed for :data:`LEASE_S` seconds (by its own clock, or
        while watched here): its writer is gone. False: the lock object was removed.

    Raises:
        ResumePointsInUseError: it was renewed or taken by another writer (348).
    """
    renewed = owner["renewed"]  # a number: a lock without one is gone, never watched
    left = LEASE_S - (time.time() - renewed)
    _log.warning(
        "%s: held by %s on another machine; waiting up to %.0f s for its lease: renewed, "
        "its writer is alive (refused); not renewed, it is gone with its machine (taken over)",
        url,
        _named(owner),
        max(0.0, min(left, LEASE_S)),
    )
    started = time.monotonic()
    while True:
        time.sleep(WATCH_S)
        current = _read(url)
        if current is None:
            return False
        if current.get("token") != owner.get("token") or current.get("renewed") != renewed:
            raise ResumePointsInUseError(
                f"{directory} is written by {_named(current)}, which renewed or took the lock "
                f"while this process waited for its lease; it holds {url}"
            )
        if _gone(current) or time.monotonic() - started >= LEASE_S:
            return True


def _gone(owner: dict[str, Any]) -> bool:
    renewed = owner.get("renewed")
    if not isinstance(renewed, (int, float)) or time.time() - renewed > LEASE_S:
        return True
    try:
        return ended(owner)
    except Exception:  # noqa: BLE001 - a record from elsewhere: only its lease tells
        return False


def _named(owner: dict[str, Any]) -> str:
    try:
        return (
            f"process {int(owner['pid'])} on host {owner['host']} (since {owner['since']}, "
            f"lease renewed {time.time() - float(owner['renewed']):.0f} s ago)"
        )
    except (KeyError, TypeError, ValueError):
        return "another process"


def release_object_lock(directory: str) -> None:
    """Give the lock up and remove its object (the run is finished); a no-op when not held."""
    _let_go(directory, None)


def _let_go_elsewhere(directory: str, holder: int) -> None:
    """A holder's finalizer: :func:`_let_go` on a thread of its own. The garbage collector
    runs a finalizer on whatever thread allocates, fsspec's event-loop thread included,
    where waiting for the registry (held by a thread that waits for that loop) or reading
    the lock object through the loop would never end."""
    try:
        threading.Thread(
            target=_let_go, args=(directory, holder), name="trainer-resume-lock-release"
        ).start()
    except RuntimeError:  # interpreter shutdown: no new threads; this one is free to wait
        _let_go(directory, holder)


def _let_go(directory: str, holder: int | None) -> None:
    """Drop ``holder``'s hold (every hold when None); the last one removes the lock object."""
    url = paths.join(directory, LOCK_NAME)
    with _guard:
        lease = _held.get(url)
        if lease is None:
            return
        if holder is not None:
            lease.holders.discard(holder)
            if lease.holders:
                return
        del _held[url]
    lease.stop()
    try:
        current = _read(url)
        if current is not None and current.get("token") == lease.record["token"]:
            objects.remove(url)
    except Exception as exc:  # noqa: BLE001 - the lease expires on its own
        _log.warning("%s: removing the resume points' lock failed: %r", url, exc)
