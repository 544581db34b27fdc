"""``TrainingResumeMixin``: pause a trainer at a completed step and resume it exactly.

A trainer subclasses the mixin, calls ``_initialize_training_resume(config,
version=...)`` in its ``__init__``, decorates its outermost step with
``@training_step`` and implements two hooks: ``_resume_objects()`` (model,
optimizer, scheduler, GradScaler...) and ``_resume_loaders()``. ``pause(path)``
writes everything an exact continuation needs; ``resume(path)`` in a fresh trainer
(in a fresh process) continues bit-identically.

This module holds the class: its public guards and documented hooks. The paths
behind the guards live in the private modules beside it (see ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, ClassVar, Literal, Protocol

from ..durable import load_checkpoint, save_checkpoint
from ..resume_points import ResumePoint, ResumePoints
from ..sharded.detect import sharded_objects
from ..state import PauseCheckpoint, StrPath
from ._finish import finish_run
from ._landing import land_requested_pause, record_pause_request
from ._pause import pause_to, refuse_sharded_url
from ._pause_request import DEFAULT_PAUSE_SIGNALS, SignalPause, arm_signals, disarm_signals
from ._points import choose_latest, resume_latest_sharded, take_checkpoint
from ._resume import check_resumable_at, resume_from
from ._settings import settings_of
from ._setup import initialize
from ._step_guard import guard_of, require_step_boundary, serialized_training, training_step

__all__ = ["SignalPause", "Stateful", "TrainingResumeMixin", "serialized_training", "training_step"]


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


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
        config_ignore: Collection[str] = (),
        scheduler_steps: Literal["convert", "keep"] = "convert",
        spent_gradients: Literal["save", "drop"] = "save",
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
            config_ignore: Dotted paths of keys that describe the run rather than
                the training (``"logger"``, ``"paths.output_dir"``), left out of the
                signature with their subtrees. A pause records them; a resume must
                pass at least those. The launch's values from Hydra's ``${hydra:...}``
                (its run directories, job name, number and id, working directory)
                and ``${now:...}`` need no entry: they are signed as written
                (docs/configs.md, "Interpolations").
            scheduler_steps: On a resume with another number of ranks, ``"convert"``
                moves the LR schedulers stepped once per step to the converted step
                count, as the step count moves (the samples seen are kept: schedules
                over samples); ``"keep"`` leaves them at the paused step (schedules
                over optimizer steps). docs/distributed.md, "Resume".
            spent_gradients: ``"save"`` (the default) saves every gradient that is
                set at the pause; ``"drop"`` leaves out those every owning optimizer
                has stepped on, once the loop was seen to set them to ``None`` before
                its next backward: you declare that the loop never reads a spent
                gradient (before its ``zero_grad()``), which is then restored as
                ``None``. docs/trainer.md, "Gradient accumulation".

        Raises:
            TypeError, ValueError: ``version`` is not a non-empty str, ``key`` is
                not bytes of at least 16 (checked here, not at the first pause), or
                ``config`` has no canonical form, ``config_ignore`` holds a
                malformed path or ``scheduler_steps`` or ``spent_gradients`` is
                neither of its values.
        """
        initialize(
            self,
            config,
            version=version,
            key=key,
            resume_points=resume_points,
            excluded_attributes=excluded_attributes,
            config_ignore=config_ignore,
            base=TrainingResumeMixin,
            scheduler_steps=scheduler_steps,
            spent_gradients=spent_gradients,
        )

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
        save_checkpoint(checkpoint, path, key=settings_of(self, "pause()").key)

    def _load_pause_checkpoint(self, path: StrPath) -> Any:
        """Read and verify a pause file (default: ``load_checkpoint``, weights-only)."""
        return load_checkpoint(path, map_location="cpu", key=settings_of(self, "resume()").key)

    # ----------------------------------------------------------------- guards
    # pause() and resume() are guards, not hooks: they take the training lock, refuse
    # at the wrong moment, validate everything before touching state and restore the
    # RNG last. An override that skipped one of these would turn a refused resume into
    # a silently inexact one, so subclasses customise the hooks above instead. The
    # machinery behind the guards is module-level functions of the private modules, so
    # a trainer's namespace holds only the documented hooks: a trainer with its own
    # ``_restore`` or ``_pause_checkpoint`` method cannot replace a path by accident.

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
            require_step_boundary(guard, "pause")
            pause_to(self, guard, path, base=TrainingResumeMixin)

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
            require_step_boundary(guard, "resume")
            resume_from(self, guard, path, base=TrainingResumeMixin)

    def check_resumable(self, path: StrPath) -> None:
        """Check a pause as ``resume(path)`` would check it against this trainer; change nothing.

        The same checks as :meth:`resume` (the file verified, module version, config,
        entries, every object's state against the live object under canonical names,
        gradients, loader states, ``_validate_resume``, RNG), without the restore: a
        pause this raises for, ``resume(path)`` refuses the same way.
        ``assert_training_resume`` runs it on the pause it wrote.

        Args:
            path: A file written by ``pause()`` or a sharded pause directory.

        Raises:
            ResumeError: what ``resume(path)`` would raise before changing anything.
            RuntimeError: under a process group, another rank refused (this rank raises
                the same ``ResumeError`` class naming that rank).

        Under a process group every rank calls it with the same path.
        """
        guard = guard_of(self, "check_resumable()")
        with guard.exclusive():
            check_resumable_at(self, path, base=TrainingResumeMixin)

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
            require_step_boundary(guard, "finish")
            return finish_run(self, guard, path)

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
        record_pause_request(self, guard, path)

    def pause_if_requested(self, *, epoch_end_done: bool = False) -> bool:
        """Write a pending pause request now, between steps (e.g. in a loop that waits or evaluates).

        Where the last step delivered a returned loader's last batch of its epoch, the
        loop's epoch-end work (a per-epoch ``scheduler.step()``, validation) may still
        be due: as at the end of that step, the pause (and a resume point due) is then
        handed on to the next step boundary, and ``False`` is returned with the request
        still pending. A loop that calls this after its epoch-end work says so with
        ``epoch_end_done=True``, and the pause is written here.

        Args:
            epoch_end_done: The loop's work after an epoch's last batch is done.

        Returns:
            True when a pause was written (the trainer is now paused); False when none
            was pending, or when it was handed on to the next step boundary.

        Raises:
            Same as :meth:`pause`.
        """
        guard = guard_of(self, "pause_if_requested()")
        with guard.exclusive():
            require_step_boundary(guard, "pause_if_requested")
            return land_requested_pause(self, guard, epoch_end_done=epoch_end_done)

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
        return take_checkpoint(self, guard)

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
        the next valid one. A trainer with a sharded model takes the newest committed
        sharded point or pause directory that every rank verifies (the ranks try the
        directories in the order rank 0 lists them).
        """
        guard = guard_of(self, "resume_latest()")
        sharded = sharded_objects(self._resume_objects())
        if sharded:  # sharded points are directories
            refuse_sharded_url(directory, sharded)
            return resume_latest_sharded(self, guard, directory, base=TrainingResumeMixin)
        chosen = choose_latest(self, guard, directory)
        if chosen is None:
            return None
        path, read = chosen
        with guard.exclusive():
            require_step_boundary(guard, "resume")
            resume_from(self, guard, path, read, base=TrainingResumeMixin)
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
        blocked, see :mod:`trainer_resume.pause_signals`; loader workers keep SIGINT,
        SIGHUP and SIGUSR2 blocked whenever they started. A running worker that does
        not block one of ``signals`` is warned about (``PauseSignalWarning``). Several
        trainers of one process may each be armed: a signal requests a pause of every
        one armed for it.

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
        return arm_signals(
            self, guard, path, signals, warn_without_step_after=warn_without_step_after
        )

    def restore_signal_handlers(self) -> None:
        """Put back the handlers that ``pause_on_signal`` replaced (no-op if none)."""
        disarm_signals(self)
