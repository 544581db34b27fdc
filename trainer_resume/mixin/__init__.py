"""``TrainingResumeMixin``: pause a trainer at a completed step and resume it exactly.

A trainer subclasses the mixin, calls ``_initialize_training_resume(config,
version=...)`` in its ``__init__``, decorates its outermost step with
``@training_step`` and implements two hooks: ``_resume_objects()`` (model,
optimizer, scheduler, GradScaler...) and ``_resume_loaders()``. ``pause(path)``
writes everything an exact continuation needs; ``resume(path)`` in a fresh trainer
(in a fresh process) continues bit-identically.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from .. import distributed as _distributed
from .._atomic import make_parent_directory
from .._hook_results import is_library_loader
from .._pause_checks import (
    check_layout,
    check_names,
    check_random_state,
    check_saveable,
    object_states,
    to_cpu,
)
from .._state_match import check_object_states
from ..amp import restore_grad_scaler_state
from ..durable import load_checkpoint, save_checkpoint, validate_key
from ..errors import (
    ConfigSignatureMismatchError,
    PauseBlockedError,
    ResumeStateMismatchError,
    TrainerLockedError,
    UnsupportedResumeConfigurationError,
    VersionMismatchError,
)
from ..finished import finished_marker_path, mark_finished, refuse_if_finished
from ..resume_points import ResumePoint, ResumePoints
from ..rng import restore_random_state
from ..sharded.detect import (
    SHARDED_STATE,
    ShardedObjects,
    refuse_dtensors,
    refuse_unreduced_gradients,
    sharded_objects,
)
from ..sharded.manifest import is_pause_directory
from ..signature import canonical_config, config_difference, config_signature
from ..state import GRADIENTS_KEY, PAUSE_FORMAT, PauseCheckpoint, StrPath
from ._boundary import boundary_loader_states, boundary_random_state, record_boundary, rng_device
from ._gradients import check_gradients, collect_gradients, restore_gradients
from ._hook_audit import (
    audit_trainer,
    name_stale_iterators,
    stale_iterators,
    warn_request_without_step,
)
from ._latest import latest_to_resume
from ._pause_request import DEFAULT_PAUSE_SIGNALS, SignalPause
from ._step_guard import (
    GUARD_ATTRIBUTE,
    StepGuard,
    guard_of,
    serialized_training,
    training_step,
)
from ._training_start import (
    check_at_training_start,
    check_hook_results,
    restore_foreign_loaders,
)

if TYPE_CHECKING:
    from ..sharded.read import ShardedPause

__all__ = ["SignalPause", "Stateful", "TrainingResumeMixin", "serialized_training", "training_step"]

_GRAD_SCALERS: tuple[type, ...] = (torch.amp.GradScaler,)
if not issubclass(torch.cuda.amp.GradScaler, torch.amp.GradScaler):  # older torch: separate classes
    _GRAD_SCALERS += (torch.cuda.amp.GradScaler,)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class _Settings:
    __slots__ = ("canonical", "key", "signature", "version")

    def __init__(self, version: str, signature: str, canonical: Any, key: bytes | None) -> None:
        self.version = version
        self.signature = signature
        self.canonical = canonical
        self.key = key


def _overrides(trainer: Any, hook: str) -> bool:
    return getattr(type(trainer), hook) is not getattr(TrainingResumeMixin, hook)


class TrainingResumeMixin:
    """Adds exact, thread-safe and signal-safe ``pause()`` / ``resume()`` to a trainer.

    Subclasses implement ``_resume_objects()`` and ``_resume_loaders()`` and may
    override the other ``_resume_*`` / ``_load_resume_extra_state`` /
    ``_rebuild_resume_iterators`` / ``_validate_resume`` / ``_regular_checkpoint``
    hooks. Steps go through ``@training_step``; other state-changing methods
    through ``@serialized_training``.
    """

    # True checks for a pause at every step boundary, not only after a request, for
    # trainers whose pause decision is collective (every process must take part at
    # every boundary).
    _pause_check_every_step: ClassVar[bool] = False

    # ----------------------------------------------------------------- setup
    def _initialize_training_resume(
        self,
        config: Any,
        *,
        version: str,
        key: bytes | None = None,
        resume_points: ResumePoints | None = None,
        excluded_attributes: Iterable[str] = (),
    ) -> None:
        """Sign ``config`` (its ``load`` entry excluded) and record the module version.

        Call it at the end of ``__init__``, once the loaders (and their iterators)
        exist, with the original config: its end is the boundary before the first
        step (a pause from another thread before the first step saves the loader
        positions of that moment).

        Args:
            config: The trainer's config (mapping, OmegaConf config, dataclass...).
            version: The version of the training module; a pause file of another
                version is refused (``VersionMismatchError``).
            key: Optional signing key (bytes, at least 16): pause files are signed
                with it and ``resume`` refuses files without a valid signature.
            resume_points: Take periodic, asynchronous resume points
                (:class:`~trainer_resume.ResumePoints`); ``resume_latest`` continues
                from the newest after a crash.
            excluded_attributes: Names of attributes holding stateful objects that
                are deliberately not saved (a validation loader, a metrics
                object): the first step does not warn about them.

        Raises:
            TypeError, ValueError: ``version`` is not a non-empty str, or ``key`` is
                not bytes of at least 16 (checked here, not at the first pause).
        """
        if not isinstance(version, str) or not version:
            raise TypeError(f"version must be a non-empty str, got {version!r}")
        key = validate_key(key)
        excluded = frozenset(excluded_attributes)
        if isinstance(excluded_attributes, str) or not all(
            isinstance(name, str) for name in excluded
        ):
            raise TypeError(
                f"excluded_attributes must be attribute names, got {excluded_attributes!r}"
            )
        if resume_points is not None and not isinstance(resume_points, ResumePoints):
            raise TypeError(
                f"resume_points must be a ResumePoints, got {type(resume_points).__name__}"
            )
        canonical = canonical_config(config)
        self.__dict__["_training_resume_settings"] = _Settings(
            version, config_signature(config), canonical, key
        )
        if GUARD_ATTRIBUTE not in self.__dict__:
            self.__dict__[GUARD_ATTRIBUTE] = StepGuard(_pause_at_step_boundary)
        self.__dict__[GUARD_ATTRIBUTE].check_every_boundary = bool(self._pause_check_every_step)
        if resume_points is not None:
            resume_points.attach(self)
        self.__dict__[GUARD_ATTRIBUTE].points = resume_points

        def first_boundary(trainer: TrainingResumeMixin) -> Any:
            # When training starts: the first micro-batch of a window shows where the
            # gradients of a sharded model go, before any pause could need them.
            try:
                objects = trainer._resume_objects()
            except Exception:  # noqa: BLE001 - pause() calls the same hook and reports it
                objects = {}
            refuse_unreduced_gradients(objects, sharded_objects(objects))
            return audit_trainer(trainer, excluded, TrainingResumeMixin)

        self.__dict__[GUARD_ATTRIBUTE].audit = first_boundary
        self.__dict__[GUARD_ATTRIBUTE].start_check = check_at_training_start
        record_boundary(self, self.__dict__[GUARD_ATTRIBUTE])

    # ------------------------------------------------------------ state flags
    @property
    def paused(self) -> bool:
        """True after a successful ``pause()`` until ``resume()``: the training loop should exit."""
        return guard_of(self, "paused").paused

    @property
    def locked(self) -> bool:
        """True after a restore failed part-way, until a later ``resume()`` succeeds."""
        return guard_of(self, "locked").locked_reason is not None

    @property
    def completed_steps(self) -> int:
        """Number of outermost ``@training_step`` calls that returned (restored by ``resume``)."""
        return guard_of(self, "completed_steps").completed_steps

    @property
    def pause_requested(self) -> bool:
        """True while a pause asked for by ``request_pause`` or a signal waits for a step boundary."""
        return guard_of(self, "pause_requested").requested_path is not None

    # ------------------------------------------------------------------ hooks
    def _resume_objects(self) -> Mapping[str, Stateful]:
        """Name -> object with ``state_dict``/``load_state_dict`` (model, optimizer, scheduler, scaler)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _resume_objects()")

    def _resume_loaders(self) -> Mapping[str, Any]:
        """Name -> resumable loader (``state_dict``, ``load_state_dict``, ``validate_state_dict``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement _resume_loaders() (return {{}} if none)"
        )

    def _resume_shared_keys(self) -> Iterable[str]:
        """Resume objects whose state is taken from the regular checkpoint under the same key."""
        return ()

    def _regular_checkpoint(self) -> Mapping[str, Any] | None:
        """The trainer's usual checkpoint (e.g. weights), stored once in the pause file."""
        return None

    def _resume_extra_state(self) -> Mapping[str, Any]:
        """Plain-data state outside the resume objects (counters, pools, warm-up flags)."""
        return {}

    def _load_resume_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``_resume_extra_state`` returned."""

    def _rebuild_resume_iterators(self) -> None:
        """Recreate iterators over the loaders after their state was restored."""

    def _validate_resume(self, checkpoint: PauseCheckpoint) -> None:
        """Refuse a checkpoint (raise a ``ResumeError``) before any state is touched."""

    def _save_pause_checkpoint(self, checkpoint: PauseCheckpoint, path: StrPath) -> None:
        """Write the pause checkpoint durably (default: ``save_checkpoint``)."""
        save_checkpoint(checkpoint, path, key=_settings(self, "pause()").key)

    def _load_pause_checkpoint(self, path: StrPath) -> Any:
        """Read and verify a pause file (default: ``load_checkpoint``, weights-only)."""
        return load_checkpoint(path, map_location="cpu", key=_settings(self, "resume()").key)

    # ----------------------------------------------------------------- guards
    # pause() and resume() are guards, not hooks: they take the training lock, refuse
    # at the wrong moment, validate everything before touching state and restore the
    # RNG last. An override that skipped one of these would turn a refused resume into
    # a silently inexact one, so subclasses customise the hooks above instead.

    def pause(self, path: StrPath) -> None:
        """Write a pause checkpoint at the current completed-step boundary and pause.

        Called from another thread, it waits for the running step to finish. After
        it returns, every ``@training_step`` call raises ``TrainingPausedError``
        until ``resume()``.

        Args:
            path: The pause file; replaced atomically, the previous one stays intact
                until the new one is complete.

        Raises:
            TrainerLockedError: a restore failed part-way.
            PauseBlockedError: the last training step raised.
            ResumeStateMismatchError: a shared key is missing from the objects or
                the regular checkpoint.
            CheckpointWriteError: writing failed; the trainer is not paused and may
                continue or retry.
            TypeError: the state holds a value ``torch.load(weights_only=True)``
                would refuse (named by its path); nothing was written.
            UnsupportedResumeConfigurationError: a DTensor outside the sharded
                model/optimizer pairs (see :mod:`trainer_resume.sharded`).
            RuntimeError: called inside a training step (use ``request_pause``); or,
                under a process group of several ranks, the ranks are not at the same
                completed step (then every rank raises and nothing is written). When
                another rank refused with a ``ResumeError``, this rank raises the same
                class, naming that rank.

        Under a ``torch.distributed`` process group of several ranks, call it on every
        rank at the same completed step (or use ``request_pause`` / signals on any
        rank): rank 0 writes one file with every rank's state, see
        :mod:`trainer_resume.distributed`. A model with DTensor parameters (FSDP2
        ``fully_shard``) makes ``path`` a directory that every rank writes its own
        shards to, see :mod:`trainer_resume.sharded`.
        """
        guard = guard_of(self, "pause()")
        with guard.exclusive():
            _require_step_boundary(guard, "pause")
            if guard.audit is not None:  # paused before the first step: check the hooks now
                audit, guard.audit = guard.audit, None
                guard.audit = audit(self)
            # Under a process group every rank takes part in each collective below, so a
            # refusal on one rank is announced to all before it is raised (none waits forever).
            collective = _distributed.is_distributed()
            try:
                if guard.start_check is not None:  # before the first step, as that step would
                    check_hook_results(self)
                    guard.start_check = None
                if guard.locked_reason is not None:
                    raise TrainerLockedError(guard.locked_reason)
                if guard.failed:
                    raise PauseBlockedError(
                        f"step {guard.completed_steps + 1} raised; run a step that succeeds first"
                    )
                sharded = sharded_objects(self._resume_objects())
                refuse_unreduced_gradients(self._resume_objects(), sharded)
                checkpoint = _pause_checkpoint(self, guard, sharded=sharded)
            except Exception as error:
                if collective:
                    _distributed.announce_refusal(error, "pause()")
                raise
            if collective:
                _distributed.agree(None, "pause()")
            if sharded:
                key = _settings(self, "pause()").key
                from ..sharded.write import write_pause  # imports torch.distributed.checkpoint

                write_pause(path, checkpoint, self._resume_objects(), sharded, key=key)
            elif collective:
                combined = _distributed.gather_pause(checkpoint)

                def write() -> None:
                    make_parent_directory(path)
                    self._save_pause_checkpoint(combined, path)

                _distributed.commit(write, os.fspath(path))
            else:
                make_parent_directory(path)
                self._save_pause_checkpoint(checkpoint, path)
            guard.paused = True
            if guard.requested_path is not None and os.fspath(guard.requested_path) == os.fspath(
                path
            ):
                guard.requested_path = None

    def resume(self, path: StrPath) -> None:
        """Restore the trainer from a pause file and unpause it.

        The file is verified and checked completely (format, module version, config
        signature, entries, every object's state against the live object: keys,
        shapes, dtypes, optimizer parameter groups; loader states,
        ``_validate_resume``, RNG state) before anything changes; a refusal leaves
        the trainer as it was. Objects, loaders, extra state and iterators are then
        restored, the main-process RNG last.

        Args:
            path: A file written by ``pause()``, or the directory of a sharded pause
                (see :mod:`trainer_resume.sharded`).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            RunFinishedError: ``finish(path)`` marked the run finished (see
                :func:`trainer_resume.run_finished`); nothing changed.
            ResumeError: the file is refused (321 format, 322 corrupted, 323 config,
                328 unsafe, 329 version, 330 entries or a state that does not fit its
                object, 333 loader state, 339 signature, or what ``_validate_resume``
                raises); nothing changed and the trainer is not locked.
            TrainerLockedError: restoring failed part-way; the trainer refuses steps
                and pauses until a later ``resume()`` succeeds.
            RuntimeError: called inside a training step. Under a process group of
                several ranks, when another rank refused (nothing changed anywhere),
                this rank raises the same ``ResumeError`` class naming that rank
                (``RuntimeError`` for any other failure there).

        Under a process group every rank calls it with the same file and takes its own
        part; with another world size than the paused run the loaders re-shard from
        the global position (see :mod:`trainer_resume.distributed`).
        """
        guard = guard_of(self, "resume()")
        with guard.exclusive():
            _require_step_boundary(guard, "resume")
            _resume_from(self, guard, path)

    def finish(self, path: StrPath) -> str:
        """Mark the run that pauses to ``path`` finished, once training is complete.

        A durable *finished marker* holding the completed step count replaces the
        pause file (see :mod:`trainer_resume.finished`). From then on ``resume(path)``
        raises ``RunFinishedError`` and :func:`trainer_resume.run_finished` returns
        the marker, so a requeued job that already finished can exit 0 instead of
        training the tail again.

        Args:
            path: The pause file path the run uses (it need not exist).

        Returns:
            The marker's path.

        Raises:
            TrainerLockedError: a restore failed part-way.
            CheckpointWriteError: the marker could not be written; nothing was retired.
            RuntimeError: called inside a training step.

        Under a process group of several ranks, call it on every rank: rank 0 writes.
        """
        guard = guard_of(self, "finish()")
        with guard.exclusive():
            _require_step_boundary(guard, "finish")
            if guard.locked_reason is not None:
                raise TrainerLockedError(guard.locked_reason)
            key = _settings(self, "finish()").key
            location = os.fspath(path)

            def write() -> None:
                make_parent_directory(location)
                mark_finished(location, completed_steps=guard.completed_steps, key=key)
                if guard.points is not None:  # the resume points retire with the pause file
                    guard.points.retire(completed_steps=guard.completed_steps, key=key)

            if _distributed.is_distributed():
                _distributed.commit(write, location)
            else:
                write()
            return finished_marker_path(location)

    def request_pause(self, path: StrPath) -> None:
        """Ask for a pause at the end of the running (or next) outermost training step.

        Safe from any thread and from signal handlers: it only records the request.
        ``paused`` becomes true once the pause is written. Should that write fail, the
        step still counts as completed, the request is dropped and the step call
        raises the ``CheckpointWriteError``. Called from another thread before any
        ``@training_step`` call has run, it warns (``UnsavedStateWarning``) that the
        pause waits for one. When a loader's epoch ended with the step that just
        ended, the pause lands one step later, after the loop's epoch-end work.
        """
        guard = guard_of(self, "request_pause()")
        guard.requested_path = os.fspath(path)
        # Only off the main thread: there a signal handler may be the caller, and it
        # must not write (pause_on_signal's watcher warns for signals).
        if not guard.landings and threading.current_thread() is not threading.main_thread():
            warn_request_without_step(type(self).__name__, "request_pause() from another thread")

    def pause_if_requested(self) -> bool:
        """Write a pending pause request now, between steps (e.g. in a loop that waits or evaluates).

        Returns:
            True when a pause was written (the trainer is now paused).

        Raises:
            Same as :meth:`pause`.
        """
        guard = guard_of(self, "pause_if_requested()")
        with guard.exclusive():
            _require_step_boundary(guard, "pause_if_requested")
            guard.landings += 1
            if guard.requested_path is None and not _distributed.is_distributed():
                return False
            return _pause_at_step_boundary(self, step_end=False)

    def checkpoint(self) -> ResumePoint:
        """Take a resume point now, into the ``ResumePoints`` directory, and return its handle.

        Between steps it snapshots at once (waiting for the write in flight first);
        called from another thread it waits for the running step to end; inside a
        step, or under a process group of several ranks, it is taken at the next step
        boundary. When an automatic point is due at the same boundary, one point serves
        both. ``handle.wait()`` blocks until the point is durable (under a process
        group, rank 0's handle: rank 0 writes).

        Raises:
            RuntimeError: the trainer was initialised without ``resume_points``.
            TrainerLockedError, PauseBlockedError: as for :meth:`pause`.
        """
        guard = guard_of(self, "checkpoint()")
        points = _points_of(guard, "checkpoint()")
        if guard.depth or _distributed.is_distributed():
            return points.request()
        with guard.exclusive():
            if guard.locked_reason is not None:
                raise TrainerLockedError(guard.locked_reason)
            if guard.failed:
                raise PauseBlockedError(
                    f"step {guard.completed_steps + 1} raised; run a step that succeeds first"
                )
            key = _settings(self, "checkpoint()").key
            return points.take(
                guard.completed_steps, lambda copy: _pause_checkpoint(self, guard, copy), key=key
            )

    def resume_latest(self, directory: StrPath | None = None) -> str | None:
        """Resume from the newest complete, valid resume point or pause file in ``directory``.

        Temp files of a killed writer are removed and never taken; a damaged file is
        skipped with a ``SkippedCheckpointWarning`` for the next older one.

        Args:
            directory: Default: the directory of the trainer's ``ResumePoints``.

        Returns:
            The path resumed from, or ``None`` when there is nothing (a fresh start).

        Raises:
            RunFinishedError: the directory holds the run's finished marker: the run
                is done (a requeued job can exit 0).
            CheckpointCorruptedError: every point chosen was removed before it
                could be read, 100 listings in a row.
            Same as :meth:`resume` for the file chosen.

        The file is taken by its verified contents: a point whose contents hold
        another step than its name says is skipped with a warning, and one that a
        running writer's retention removes while it is chosen is passed over for
        the next valid one.
        """
        guard = guard_of(self, "resume_latest()")
        if directory is None:
            directory = _points_of(guard, "resume_latest() without a directory").directory
        if guard.points is not None:
            guard.points.wait()
        key = _settings(self, "resume_latest()").key
        # The file is read (and verified) once, to learn its step, and resumed from that read.
        chosen = latest_to_resume(directory, key=key, load=self._load_pause_checkpoint)
        if chosen is None:
            return None
        path, read = chosen
        with guard.exclusive():
            _require_step_boundary(guard, "resume")
            _resume_from(self, guard, path, read)
        return path

    def pause_on_signal(
        self,
        path: StrPath,
        signals: Iterable[int] = DEFAULT_PAUSE_SIGNALS,
        *,
        warn_without_step_after: float | None = 60.0,
    ) -> SignalPause:
        """Turn the given signals into a pause request (written at the next step boundary).

        The handler only records the request: no I/O runs inside it. Must be called
        from the main thread. Calling it again replaces the path and signals; the
        handlers from before the first call are the ones put back. Processes started
        from now on by this process (loader workers included) keep these signals
        blocked, see :mod:`trainer_resume.pause_signals`.

        Args:
            path: The pause file written when a signal arrives.
            signals: Signal numbers (default ``SIGTERM`` and ``SIGUSR1``).
            warn_without_step_after: Seconds after which an ``UnsavedStateWarning``
                says that no ``@training_step`` call (nor ``pause_if_requested()``)
                has started, so a signal could never pause; a signal that arrives
                before any such call is warned about at once. ``None`` turns both off.

        Returns:
            A handle (also a context manager) whose ``restore()`` puts the previous
            handlers back; ``previous`` maps each signal to its former handler.

        Raises:
            CheckpointWriteError: the folder of ``path`` does not exist and cannot be
                created (it is created when missing).
        """
        guard = guard_of(self, "pause_on_signal()")
        make_parent_directory(path)  # a missing folder is created now, or refused with the reason
        self.restore_signal_handlers()
        handle = SignalPause(
            guard,
            path,
            signals,
            trainer_name=type(self).__name__,
            warn_without_step_after=warn_without_step_after,
        )
        self.__dict__["_training_resume_signals"] = handle
        return handle

    def restore_signal_handlers(self) -> None:
        """Put back the handlers that ``pause_on_signal`` replaced (no-op if none)."""
        handle: SignalPause | None = self.__dict__.pop("_training_resume_signals", None)
        if handle is not None:
            handle.restore()


# ------------------------------------------------------------------ internals
# The machinery behind the guards lives here, outside the class, so that a trainer's
# namespace holds only the documented hooks: a trainer with its own ``_restore`` or
# ``_pause_checkpoint`` method cannot replace the restore or pause path by accident.


def _settings(trainer: TrainingResumeMixin, action: str) -> _Settings:
    guard_of(trainer, action)
    return trainer.__dict__["_training_resume_settings"]


def _resume_from(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    path: StrPath,
    read: Callable[[], Any] | None = None,
) -> None:
    """The body of ``resume()`` (under the lock); ``read`` gives a pause file already read."""
    location = os.fspath(path)
    collective = _distributed.is_distributed()
    try:
        key = _settings(trainer, "resume()").key
        refuse_if_finished(location, key=key)
        opened = None
        if read is not None:
            loaded: Any = read()
        elif is_pause_directory(path):
            from ..sharded.read import open_pause  # imports torch.distributed.checkpoint

            opened = open_pause(path, key=key)
            loaded = opened.checkpoint
        else:
            loaded = trainer._load_pause_checkpoint(path)
        _check_sharded(trainer, opened, location)
        checkpoint = _rank_checkpoint(trainer, loaded, location)
        states = _check_pause_checkpoint(
            trainer, checkpoint, location, sharded=opened.names if opened is not None else ()
        )
    except Exception as error:
        if collective:
            _distributed.announce_refusal(error, "resume()")
        raise
    if collective:  # every rank checked the file: restore everywhere or nowhere
        _distributed.agree(None, "resume()")
    # Every rank reads its shards before any state changes; a failure is raised on
    # every rank with nothing restored (collective, see ShardedPause.load).
    staged = opened.load(trainer._resume_objects()) if opened is not None else None
    # Then the loaders from elsewhere, which check a state only by loading it: one that
    # refuses is put back with every other, and nothing else changed.
    restore_foreign_loaders(trainer, guard, checkpoint["loaders"], location, collective)
    _restore(trainer, guard, checkpoint, states, location, opened, staged)


def _pause_at_step_boundary(trainer: TrainingResumeMixin, *, step_end: bool = True) -> bool:
    """Take a due resume point and write the pending pause request, if any (under the lock, between steps).

    ``step_end``: called at the end of a ``@training_step`` (not from
    ``pause_if_requested()``, which the loop calls where it wants the pause): there,
    a boundary where a loader's epoch just ended hands the pause and a due resume
    point to the next boundary, once, so that the loop's epoch-end work is saved.
    """
    guard: StepGuard = trainer.__dict__[GUARD_ATTRIBUTE]
    boundary = guard.boundary
    epoch_ended = step_end and boundary is not None and boundary.epoch_ended
    failure = None
    if guard.points is not None:
        failure = guard.points.at_step_boundary(
            guard.completed_steps,
            lambda copy: _pause_checkpoint(trainer, guard, copy),
            key=_settings(trainer, "checkpoint()").key,
            defer=epoch_ended,
        )
    requested = guard.requested_path
    guard.requested_path = None
    # At most one boundary later: a step that spans a whole epoch ends one at every boundary.
    defer = epoch_ended and guard.deferred_at != guard.completed_steps - 1
    if _distributed.is_distributed():
        # A request on any rank pauses every rank at this same boundary, and a deferral
        # on any rank defers it on every rank (one all-reduce for both).
        path, deferred = _distributed.agreed_pause(requested, defer=defer)
    else:
        deferred = defer and requested is not None
        path = None if deferred else requested
    if deferred:
        guard.deferred_at = guard.completed_steps
        if requested is not None and guard.requested_path is None:  # a newer request wins
            guard.requested_path = requested
    if path is not None:
        trainer.pause(path)
    if failure is not None:  # a background write of an earlier point failed
        raise failure
    return path is not None


def _points_of(guard: StepGuard, action: str) -> ResumePoints:
    if guard.points is None:
        raise RuntimeError(
            f"{action} needs resume points: pass resume_points=ResumePoints(directory, ...) "
            "to _initialize_training_resume"
        )
    return guard.points


def _rank_checkpoint(
    trainer: TrainingResumeMixin, checkpoint: Any, location: str
) -> PauseCheckpoint:
    # This rank's part of a pause file (the file itself for one process and a plain file).
    check_layout(checkpoint, location)
    world_size, rank = _distributed.world()
    return _distributed.rank_view(
        checkpoint,
        world_size=world_size,
        rank=rank,
        location=location,
        device=rng_device(),
        objects=trainer._resume_objects(),
    )


def _require_step_boundary(guard: StepGuard, action: str) -> None:
    if guard.depth:
        hint = " use request_pause(path) to pause when the step ends" if action == "pause" else ""
        raise RuntimeError(f"{action}() was called inside a training step;{hint}")


def _check_sharded(
    trainer: TrainingResumeMixin, opened: ShardedPause | None, location: str
) -> None:
    if opened is not None:
        opened.check_objects(trainer._resume_objects())
    elif sharded_objects(trainer._resume_objects()):
        raise UnsupportedResumeConfigurationError(
            f"{location} is a pause file of unsharded states; a trainer whose model has "
            "DTensor parameters (fully_shard) resumes from a sharded pause directory"
        )


def _pause_checkpoint(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    copy: Callable[[Any, dict], Any] = to_cpu,
    sharded: ShardedObjects | None = None,
) -> PauseCheckpoint:
    # copy: to_cpu for a pause (written under the lock); for a resume point, a copy in
    # host memory (written while training changes the live tensors). sharded: the
    # objects every rank writes through DCP (a pause only; resume points refuse DTensors).
    sharded = sharded if sharded is not None else ShardedObjects()
    settings = _settings(trainer, "pause()")
    objects = dict(trainer._resume_objects())
    shared = list(trainer._resume_shared_keys())
    regular_source = trainer._regular_checkpoint()
    for name in shared:
        if name in sharded.names:
            raise UnsupportedResumeConfigurationError(
                f"shared key {name!r} names a sharded object (DTensor parameters): its "
                "state is written through torch.distributed.checkpoint, not taken from the "
                "regular checkpoint"
            )
        if name not in objects or regular_source is None or name not in regular_source:
            where = "the resume objects" if name not in objects else "the regular checkpoint"
            raise ResumeStateMismatchError(f"shared key {name!r} is not in {where}")
    memo: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
    regular = None if regular_source is None else copy(dict(regular_source), memo)
    object_states: dict[str, Any] = {}
    for name, obj in objects.items():
        if name in sharded.names:  # written by every rank for its shards, see write_pause
            object_states[name] = dict(SHARDED_STATE)
            continue
        # A shared key references the regular snapshot: no second state_dict() call,
        # and torch.save writes the object once because it is the same object.
        object_states[name] = (
            regular[name]
            if regular is not None and name in shared
            else copy(obj.state_dict(), memo)
        )
    checkpoint: PauseCheckpoint = {
        "format": PAUSE_FORMAT,
        "module_version": settings.version,
        "config_signature": settings.signature,
        "config": settings.canonical,
        "completed_steps": guard.completed_steps,
        "regular": regular,
        "shared_keys": shared,
        "objects": object_states,
        # Loader positions as of the last step boundary: a batch fetched since (outside
        # the step) is delivered again. The RNG is never caught inside a fetch.
        "loaders": boundary_loader_states(trainer, guard),
        "extra": copy(dict(trainer._resume_extra_state()), memo),
        "rng": boundary_random_state(),
    }
    # Inside a gradient-accumulation window the partial sums move to the next step too.
    gradients = collect_gradients(objects, copy, memo, skipped=set(sharded.names))
    if gradients is not None:
        checkpoint[GRADIENTS_KEY] = gradients
    refuse_dtensors(checkpoint, "checkpoint")
    check_saveable(checkpoint)
    return checkpoint


def _check_pause_checkpoint(
    trainer: TrainingResumeMixin, checkpoint: Any, location: str, *, sharded: Iterable[str] = ()
) -> dict[str, Any]:
    settings = _settings(trainer, "resume()")
    check_layout(checkpoint, location)
    if checkpoint["module_version"] != settings.version:
        raise VersionMismatchError(
            f"{location} was written by version {checkpoint['module_version']!r}, this trainer is {settings.version!r}"
        )
    if checkpoint["config_signature"] != settings.signature:
        saved = checkpoint.get("config")
        difference = config_difference(saved, settings.canonical) if saved is not None else None
        raise ConfigSignatureMismatchError(
            difference
            or f"signature {checkpoint['config_signature'][:16]}... != {settings.signature[:16]}..."
        )
    states = object_states(checkpoint)
    loaders = trainer._resume_loaders()
    objects = trainer._resume_objects()
    check_hook_results(trainer)
    check_names("objects (_resume_objects())", states, objects)
    check_names("loaders (_resume_loaders())", checkpoint["loaders"], loaders)
    check_names(
        "extra state (_resume_extra_state())", checkpoint["extra"], trainer._resume_extra_state()
    )
    if checkpoint["extra"] and not _overrides(trainer, "_load_resume_extra_state"):
        raise ResumeStateMismatchError(
            f"the checkpoint holds extra state {sorted(checkpoint['extra'])} but "
            f"{type(trainer).__name__} does not implement _load_resume_extra_state(state) to restore it"
        )
    # Sharded states are in the DCP files; ShardedPause.check_objects checks those.
    skipped = set(sharded)
    unsharded = {name: obj for name, obj in objects.items() if name not in skipped}
    check_object_states(unsharded, states, _GRAD_SCALERS)
    check_gradients(checkpoint.get(GRADIENTS_KEY), objects, skipped)
    for name, loader in loaders.items():
        if is_library_loader(loader):  # the others check a state by loading it, first
            loader.validate_state_dict(checkpoint["loaders"][name])
    trainer._validate_resume(checkpoint)
    check_random_state(checkpoint["rng"], location, rng_device())
    return states


def _restore(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    checkpoint: PauseCheckpoint,
    states: dict[str, Any],
    location: str,
    opened: ShardedPause | None = None,
    staged: Mapping[str, Any] | None = None,
) -> None:
    objects = trainer._resume_objects()
    scalers = [name for name, obj in objects.items() if isinstance(obj, _GRAD_SCALERS)]
    optimizers = [obj for obj in objects.values() if isinstance(obj, torch.optim.Optimizer)]
    sharded = opened.names if opened is not None else []
    stage = "objects"
    iterators = stale_iterators(trainer)  # live now; restoring the loaders ends them
    try:
        if opened is not None and staged is not None:
            stage = "sharded objects"
            opened.apply(objects, staged)
        for name, obj in objects.items():
            if name not in scalers and name not in sharded:
                stage = f"object {name!r}"
                obj.load_state_dict(states[name])
        # Scalers after the optimizers: their per-optimizer bookkeeping refers to them.
        for name in scalers:
            stage = f"GradScaler {name!r}"
            restore_grad_scaler_state(objects[name], states[name], optimizers)
        for name, loader in trainer._resume_loaders().items():
            if is_library_loader(loader):  # the others were restored first
                stage = f"loader {name!r}"
                loader.load_state_dict(checkpoint["loaders"][name])
        if checkpoint["extra"]:  # the hook receives only what was saved
            stage = "extra state"
            trainer._load_resume_extra_state(checkpoint["extra"])
        stage = "iterators"
        trainer._rebuild_resume_iterators()
        name_stale_iterators(trainer, iterators)
        stage = "gradients"
        restore_gradients(checkpoint.get(GRADIENTS_KEY), objects, set(sharded))
        # Last: rebuilding loaders and iterators may draw from the global generators.
        stage = "random state"
        restore_random_state(checkpoint["rng"], rng_device())
    except BaseException as error:
        guard.locked_reason = (
            f"restoring {stage} from {location} failed ({type(error).__name__}: {error})"
        )
        if not isinstance(error, Exception):
            raise
        raise TrainerLockedError(guard.locked_reason) from error
    guard.locked_reason = None
    guard.failed = False
    guard.paused = False
    guard.completed_steps = checkpoint["completed_steps"]
    record_boundary(trainer, guard)
