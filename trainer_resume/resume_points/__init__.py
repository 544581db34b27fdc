"""Resume points: periodic, asynchronous, crash-proof checkpoints of the exact state.

A pause needs a signal and the time to write. A resume point needs neither: every
``every_steps`` steps and/or ``every_seconds`` seconds, at a completed step
boundary, the trainer copies its pause state (the same content as a pause file) to
host memory and a background thread writes it durably into the directory while
training goes on. After a hard kill, ``resume_latest(directory)`` continues from the
newest point bit-identically.

The step blocks only while the state is copied (tensors on an accelerator go to
pinned host memory where CUDA is available). At most one write is in flight, so
host memory holds at most one snapshot besides the live state; its buffers are kept
and receive the next point's copy.

When a point is due while the previous write still runs, the policy ``when_busy``
decides: ``"skip"`` (the default) does not block the step; the point is taken at
the first step boundary after the write finished and ``skipped`` counts the
scheduled points that were passed over. ``"wait"`` blocks the step until the write is
done, then takes the point, so points are never later than scheduled.

Under a process group rank 0 writes one file with every rank's state; with a model
sharded by FSDP2 / DTensor every rank writes its own shards instead, each point a
sharded pause directory committed by rank 0 (see :mod:`.sharded_points`).

A write that fails is reported by the next training step (it raises the
``CheckpointWriteError``; the step itself has completed) and logged when it
happens; older points are never touched by a failed write. A normal interpreter
exit waits for the write in flight (the writer is not a daemon thread); so do
:meth:`ResumePoints.wait` and the trainer's ``finish()``.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch

from .. import distributed as _distributed
from ..checks.pause_state import to_cpu
from ..durable import save_checkpoint
from ..errors import (
    CheckpointWriteError,
    ResumePointsInUseError,
    UnsupportedResumeConfigurationError,
)
from ..finished import mark_finished
from ..launch_directory import warn_if_in_launch_directory
from ..state import StrPath
from ..storage import paths
from ..storage.urls import set_storage_options
from ._host_snapshot import HostBuffers
from ._lock import hold_writer_lock, release_writer_lock
from .files import (
    point_name,
    remove_points,
    remove_stale_temp_files,
    retain_points,
)
from .sharded_points import list_sharded_points, retain_sharded_points, sharded_point_name

if TYPE_CHECKING:
    from ..sharded.detect import ShardedObjects

__all__ = ["ResumePoint", "ResumePoints", "Snapshot"]

_log = logging.getLogger("trainer_resume")

WhenBusy = Literal["skip", "wait"]
# Builds the checkpoint of the current boundary, copying its tensors with the given
# function (``copy(value, memo)``): the point's host copy on the writing rank. Given the
# sharded objects too (``snapshot(copy, sharded)``), it leaves their states out.
Snapshot = Callable[..., dict[str, Any]]
# The trainer's sharded models and optimizers and its resume objects (see sharded.detect).
Shards = Callable[[], "tuple[ShardedObjects, Mapping[str, Any]]"]

_ACTIVE: weakref.WeakSet[ResumePoints] = weakref.WeakSet()


def _wait_for_writes_at_exit() -> None:
    for points in list(_ACTIVE):
        points.wait()


# The writer is not a daemon thread, so the interpreter joins it at exit, but only
# after the threading exit hooks ran, and one of them shuts down concurrent.futures
# (the digest's helper thread). Hooks run last-registered first: this one, registered
# after concurrent.futures was imported, lets the write in flight finish before that.
getattr(threading, "_register_atexit", lambda hook: None)(_wait_for_writes_at_exit)


# The writers' gloo group of each default group, made once and kept for the life of the
# process: a process group that became garbage and is collected in a forked child (a
# loader worker) hangs or aborts that child, so none is ever let go.
_WRITER_GROUPS: list[tuple[Any, Any]] = []


def _writers_group() -> Any:
    """The group the sharded writers' collectives run on (``None``: the default group).

    A group of their own beside the training thread's, except in a gloo group of one
    process, where no collective waits on another rank. Making it is a collective: every
    rank asks at the same boundary.
    """
    import torch.distributed as dist

    if not (_distributed.is_distributed() or dist.get_backend() != "gloo"):
        return None
    world = dist.group.WORLD
    for default, group in _WRITER_GROUPS:
        if default is world:
            return group
    group = dist.new_group(backend="gloo")
    _WRITER_GROUPS.append((world, group))
    return group


class ResumePoint:
    """A resume point being written; :meth:`wait` blocks until it is durable.

    ``trainer.checkpoint()`` may return it before the point is taken (from another
    thread, or under a process group, the point is taken at the next step boundary);
    ``path`` and ``completed_steps`` are ``None`` until then.

    Attributes:
        path: The point's file.
        completed_steps: The step boundary it was taken at.
    """

    def __init__(self, path: str | None = None, completed_steps: int | None = None) -> None:
        self.path = path
        self.completed_steps = completed_steps
        self.reported = False
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._followers: list[ResumePoint] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        """True once the write finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> str:
        """Block until the point is durable and return its path.

        Raises:
            CheckpointWriteError: the write failed (older points are intact).
            TimeoutError: ``timeout`` seconds passed first.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(
                f"resume point {self.path or '(not taken yet)'} not durable after {timeout} s"
            )
        if self._error is not None:
            self.reported = True
            raise self._error
        assert self.path is not None
        return self.path

    @property
    def failed(self) -> bool:
        return self._done.is_set() and self._error is not None

    def _serve(self, follower: ResumePoint) -> None:
        # A checkpoint() request answered by this point: it finishes when this one does.
        follower.path, follower.completed_steps = self.path, self.completed_steps
        with self._lock:
            if not self._done.is_set():
                self._followers.append(follower)
                return
        follower._finish(self._error)

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            self._error = error
            self._done.set()
            followers, self._followers = self._followers, []
        for follower in followers:
            follower._finish(error)


class ResumePoints:
    """Where and how often a trainer takes resume points.

    Give it to ``_initialize_training_resume(config, version=..., resume_points=...)``
    (one trainer per instance). Points are taken at completed step boundaries:
    after every ``every_steps``-th step (counted from the start of the run, so the
    same steps in every process) and/or once ``every_seconds`` seconds have passed
    since the last point; ``trainer.checkpoint()`` takes one on demand.

    Args:
        directory: Where the points go; created if missing. It should hold only this
            run's points and pause files.
        every_steps: Take a point when ``completed_steps`` is a multiple of it.
        every_seconds: Take a point at the first boundary this long after the last one.
        keep: How many points to keep; older ones are removed only after a newer one
            is durable.
        storage_options: fsspec options for a ``directory`` that is a URL (``s3://...``),
            besides what the environment gives (docs/cloud-storage.md).
        when_busy: What happens when a point is due while the previous write still
            runs: ``"skip"`` (take it at the first boundary after the write is done;
            ``skipped`` counts the scheduled points passed over) or ``"wait"`` (block the
            step until the write is done).

    Raises:
        ValueError: an interval is not positive, ``keep`` < 1 or ``when_busy`` unknown.

    The process that writes points holds the directory's lock file from its first
    point on (see :mod:`._lock`): a point due while another live process holds it
    raises ``ResumePointsInUseError`` (348) from the step, naming that process.
    """

    def __init__(
        self,
        directory: StrPath,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        keep: int = 3,
        when_busy: WhenBusy = "skip",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if every_steps is not None and (
            isinstance(every_steps, bool) or not isinstance(every_steps, int)
        ):
            raise TypeError(f"every_steps must be an int, got {every_steps!r}")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        if when_busy not in ("skip", "wait"):
            raise ValueError(f"when_busy must be 'skip' or 'wait', got {when_busy!r}")
        location = paths.location(directory)
        if paths.is_url(location):  # a key prefix: nothing to create
            if storage_options is not None:
                set_storage_options(location, storage_options)
            self.directory = location
        else:
            if storage_options:
                raise ValueError("storage_options apply to URLs (s3://...), not to local paths")
            self.directory = os.path.abspath(location)
            warn_if_in_launch_directory(location, "the resume points' directory")
            os.makedirs(self.directory, exist_ok=True)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep = keep
        self.when_busy: WhenBusy = when_busy
        self.skipped = 0  # points that were due while the previous write still ran
        self._overdue = False  # a point was skipped: take one at the next free boundary
        self._deferred_at: int | None = None  # the boundary a due point was handed on from
        self.written = 0  # points made durable
        self._buffers = HostBuffers()
        self._owner: int | None = None
        self._lock = threading.Lock()
        self._writing: ResumePoint | None = None
        self._writer: threading.Thread | None = None
        self._last: ResumePoint | None = None
        self._unreported: ResumePoint | None = None
        self._requested: list[ResumePoint] = []
        self._last_time = time.monotonic()
        self._group: Any = None  # where the sharded writers' collectives run, see _writers_group

    # ------------------------------------------------------------------ public

    @property
    def latest(self) -> ResumePoint | None:
        """The last point taken by this process (in flight or written), if any."""
        return self._last

    def wait(self) -> None:
        """Block until the write in flight (if any) has finished; its failure stays to be reported."""
        writer = self._writer
        if writer is not None:
            writer.join()

    def request(self) -> ResumePoint:
        """Ask for a point at the next step boundary (from any thread); returns its handle."""
        handle = ResumePoint()
        with self._lock:
            self._requested.append(handle)
        return handle

    def retire(self, *, completed_steps: int, key: bytes | None = None) -> str:
        """End of the run: wait for the write in flight, mark the directory finished, remove the points.

        The finished marker is durable before the first point is removed, so a crash
        in between leaves a finished run, never a run that resumes from an old point.

        Returns:
            The marker's path.
        """
        self.wait()
        marker = mark_finished(self.directory, completed_steps=completed_steps, key=key)
        remove_points(self.directory)
        for _, path, _ in list_sharded_points(self.directory):
            shutil.rmtree(path, ignore_errors=True)
        release_writer_lock(self.directory)
        return marker

    # ------------------------------------------------------- used by the mixin

    def attach(self, owner: object) -> None:
        """Bind these points to one trainer (a second trainer would mix two runs in one directory)."""
        if self._owner is not None and self._owner != id(owner):
            raise ValueError(f"ResumePoints({self.directory!r}) already belongs to another trainer")
        self._owner = id(owner)

    def wants_boundary(self, completed_steps: int) -> bool:
        """Whether the step that just completed must run the boundary hook (cheap: no I/O)."""
        return bool(self._requested) or self._unreported is not None or self._due(completed_steps)

    def at_step_boundary(
        self,
        completed_steps: int,
        snapshot: Snapshot,
        *,
        key: bytes | None,
        combine: Callable[[Any], Any] | None = None,
        defer: bool = False,
        shards: Shards | None = None,
    ) -> CheckpointWriteError | None:
        """Take a point if one is due or requested; return an unreported write failure.

        Under a process group every rank calls it at every boundary: the ranks agree
        on whether a point is due, all snapshot the same step, and rank 0 writes what
        ``combine`` makes of its snapshot (default: the mixin's ``gather_pause``).
        ``defer`` (agreed the same way) moves a due or requested point to the next
        boundary: the mixin's rule for a boundary where a loader's epoch just ended.
        ``shards`` (the mixin's) names the sharded models when a point is taken: with
        any, every rank writes its shards (see :mod:`.sharded_points`).
        """
        if _distributed.is_distributed():
            return self._collective_boundary(
                completed_steps, snapshot, key, combine or _distributed.gather_pause, defer, shards
            )
        failure = self._take_failure()
        defer = self._defers(defer, completed_steps)
        if defer:
            if self._requested or self._due(completed_steps):
                self._overdue = True
                self._deferred_at = completed_steps
            return failure
        if self._requested or self._due(completed_steps):
            if self._busy() and self.when_busy == "skip" and not self._requested:
                self._skip(completed_steps)
            else:
                self.take(completed_steps, snapshot, key=key, shards=shards)
        return failure

    def take(
        self,
        completed_steps: int,
        snapshot: Snapshot,
        *,
        key: bytes | None,
        shards: Shards | None = None,
    ) -> ResumePoint:
        """Snapshot now (waiting for the write in flight first) and write in the background.

        A point already taken at this step serves again (one point per boundary).
        """
        last = self._last
        sharded, objects = shards() if shards is not None else (None, {})
        if sharded and (last is None or last.completed_steps != completed_steps or last.failed):
            last = self._take_sharded(completed_steps, snapshot, key, sharded, objects)
        elif last is None or last.completed_steps != completed_steps or last.failed:
            self.wait()
            checkpoint = snapshot(self._buffers.copy)  # refuses what cannot be saved first
            try:
                hold_writer_lock(self.directory, self)
            except BaseException:
                self._buffers.recycle(self._buffers.take_made())
                raise
            last = self._submit(checkpoint, completed_steps, key, write=True)
        self._serve_requests(last)
        return last

    # ----------------------------------------------------------------- inside

    def _defers(self, defer: bool, completed_steps: int) -> bool:
        # A point is handed on once: the next boundary takes it whatever it is.
        return defer and self._deferred_at != completed_steps - 1

    def _skip(self, completed_steps: int) -> None:
        # Count each point the schedule asked for, not each boundary it waited at.
        if not self._overdue or self._step_scheduled(completed_steps):
            self.skipped += 1
        self._overdue = True

    def _step_scheduled(self, completed_steps: int) -> bool:
        return self.every_steps is not None and completed_steps % self.every_steps == 0

    def _due(self, completed_steps: int) -> bool:
        if self._overdue:
            return True
        if self._step_scheduled(completed_steps):
            last = self._last
            if last is None or last.completed_steps != completed_steps:
                return True
        return (
            self.every_seconds is not None
            and time.monotonic() - self._last_time >= self.every_seconds
        )

    def _serve_requests(self, point: ResumePoint) -> None:
        with self._lock:
            requested, self._requested = self._requested, []
        for handle in requested:
            point._serve(handle)

    def _busy(self) -> bool:
        writing = self._writing
        return writing is not None and not writing.done()

    def _take_failure(self) -> CheckpointWriteError | None:
        with self._lock:
            point, self._unreported = self._unreported, None
        if point is None or point.reported:
            return None
        point.reported = True
        error = point._error
        return (
            error
            if isinstance(error, CheckpointWriteError)
            else CheckpointWriteError(f"{point.path}: {error!r}")
        )

    def _take_sharded(
        self,
        completed_steps: int,
        snapshot: Snapshot,
        key: bytes | None,
        sharded: ShardedObjects,
        objects: Mapping[str, Any],
    ) -> ResumePoint:
        # Every rank, at the same boundary: the step waits only for the copies to host memory.
        from ..sharded.write import dcp_state, host_copy

        if paths.is_url(self.directory):  # refused when training starts; never written
            raise UnsupportedResumeConfigurationError(
                f"{self.directory}: resume points of a sharded model are directories every "
                "rank writes to; give a path on a shared file system, not a URL"
            )
        self.wait()
        self._group = _writers_group()
        checkpoint = snapshot(self._buffers.copy, sharded)  # refuses what cannot be saved first
        try:
            staged = host_copy(dcp_state(objects, sharded))
            if _distributed.world()[1] == 0:
                hold_writer_lock(self.directory, self)
        except BaseException:
            self._buffers.recycle(self._buffers.take_made())
            raise
        return self._submit(checkpoint, completed_steps, key, write=True, sharded=(sharded, staged))

    def _submit(
        self,
        checkpoint: Any,
        completed_steps: int,
        key: bytes | None,
        *,
        write: bool,
        sharded: tuple[ShardedObjects, Any] | None = None,
    ) -> ResumePoint:
        name = sharded_point_name if sharded is not None else point_name
        point = ResumePoint(paths.join(self.directory, name(completed_steps)), completed_steps)
        self._last = point
        self._last_time = time.monotonic()
        self._overdue = False
        _ACTIVE.add(self)
        made = self._buffers.take_made()
        if not write:  # another rank writes this point
            self._buffers.recycle(made)
            point._finish(None)
            return point
        self._writing = point
        # Not a daemon: a normal interpreter exit waits for the point to be durable.
        self._writer = threading.Thread(
            target=self._write if sharded is None else self._write_sharded,
            args=(point, checkpoint, made, key) + (() if sharded is None else sharded),
            name="trainer-resume-point",
            daemon=False,
        )
        self._writer.start()
        return point

    def _write(
        self, point: ResumePoint, checkpoint: Any, made: list[torch.Tensor], key: bytes | None
    ) -> None:
        error: BaseException | None = None
        try:
            try:
                save_checkpoint(checkpoint, point.path, key=key)
            finally:
                del checkpoint
                # Before the point reports done: only then may the next copy reuse them.
                self._buffers.recycle(made)
            retain_points(self.directory, point.completed_steps, self.keep)
            remove_stale_temp_files(self.directory)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            error = exc
            if paths.exists(point.path) and not isinstance(exc, CheckpointWriteError):
                # The point itself is durable; only removing old points failed.
                _log.warning(
                    "resume point %s written, but removing older points failed: %r", point.path, exc
                )
                error = None
            else:
                _log.error("resume point %s could not be written: %s", point.path, exc)
        self._settle(point, error)

    def _settle(self, point: ResumePoint, error: BaseException | None) -> None:
        # A written point counts; a failed one is raised in the training thread next step.
        if error is None:
            self.written += 1
        else:
            with self._lock:
                self._unreported = point
        point._finish(error)

    def _write_sharded(
        self,
        point: ResumePoint,
        checkpoint: Any,
        made: list[torch.Tensor],
        key: bytes | None,
        sharded: ShardedObjects,
        staged: Any,
    ) -> None:
        from ..sharded.write import write_pause

        error: BaseException | None = None
        try:
            try:
                # Every rank's writer: its shards and rank file, then rank 0's commit; a
                # failure on any rank fails the point on every rank (write_pause).
                with _distributed.collectives_on(self._group):
                    write_pause(point.path, checkpoint, {}, sharded, key=key, state=staged)
            finally:
                del checkpoint, staged
                self._buffers.recycle(made)
            if _distributed.world()[1] == 0:  # only now that the newer point is committed
                retain_sharded_points(self.directory, point.completed_steps, self.keep)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            error = exc
            _log.error("resume point %s could not be written: %s", point.path, exc)
        self._settle(point, error)

    def _collective_boundary(
        self,
        completed_steps: int,
        snapshot: Snapshot,
        key: bytes | None,
        combine: Callable[[Any], Any],
        defer: bool,
        shards: Shards | None,
    ) -> CheckpointWriteError | None:
        rank = _distributed.world()[1]
        in_use: ResumePointsInUseError | None = None
        if rank == 0:  # the writing rank
            try:
                hold_writer_lock(self.directory, self)
            except ResumePointsInUseError as error:
                in_use = error
        due, requested, failed, refused, deferred = _distributed.any_ranks(
            [
                self._due(completed_steps),
                bool(self._requested),
                self._unreported is not None,  # only rank 0 writes, unless a model is sharded
                in_use is not None,
                self._defers(defer, completed_steps),
            ]
        )
        if refused:
            raise in_use or ResumePointsInUseError(
                f"{self.directory}: rank 0 cannot take resume points there"
            )
        failure: CheckpointWriteError | None = None
        if failed:
            local = self._take_failure()
            failure = local or CheckpointWriteError(
                f"{self.directory}: another rank could not write its part of the last resume "
                "point; the older points are intact"
            )
        if not (due or requested):
            return failure
        if deferred:
            self._overdue = True
            self._deferred_at = completed_steps
            return failure
        sharded, objects = shards() if shards is not None else (None, {})
        # Rank 0 writes (every rank, for a sharded model): the writers decide for every
        # rank whether the point waits.
        busy = _distributed.any_ranks([(rank == 0 or bool(sharded)) and self._busy()])[0]
        if busy and self.when_busy == "skip" and not requested:
            self._skip(completed_steps)
            return failure
        if sharded:
            point = self._take_sharded(completed_steps, snapshot, key, sharded, objects)
            self._serve_requests(point)
            return failure
        if rank == 0:
            self.wait()
        # Only rank 0 writes: the other ranks' states are gathered (pickled) at once.
        combined = combine(snapshot(self._buffers.copy if rank == 0 else to_cpu))
        point = self._submit(combined, completed_steps, key, write=rank == 0)
        self._serve_requests(point)
        return failure
