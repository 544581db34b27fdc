"""Where in Lightning's fit loop a pause happens, and how the resumed fit picks up from there.

A pause (or resume point) asked for in ``on_train_batch_end`` is written once every
``on_train_batch_end`` hook of the batch has run (the callbacks listed after this
one, ``ModelCheckpoint``'s save, then the ``LightningModule``'s own) and its metrics
are logged: in the epoch loop's ``on_advance_end`` (:func:`at_batch_end`), before the
validation due after the batch, or, with none due, after the rest of it (the
step-interval ``ReduceLROnPlateau`` schedulers, the loggers' step count). In an
uninterrupted ``fit`` the rest of that batch's loop iteration would still run: the
validation due after this batch (per epoch, or every ``val_check_interval``), and
at an epoch's last batch the epoch end (``on_train_epoch_end`` hooks, epoch-interval
schedulers).

Lightning restarts from a checkpoint taken there by *skipping* the validation due
at that batch (it assumes it ran) and, at an epoch's last batch,
by skipping the epoch end. So the paused process stops right after the batch: it
skips that validation and the epoch end Lightning runs when ``should_stop`` is set
(preemption leaves little time, and their effects, such as a ``ModelCheckpoint``
file saved with the previous validation's metrics, belong to the resumed fit),
and ``fit`` returns. The pause file
describes the batch as finished and the validation as started but not run, a state
Lightning restarts from by running that validation before anything else. At an
epoch's last batch without validation, the resumed callback tells the epoch loop
that nothing is left of the epoch, so Lightning runs the epoch end and goes on with
the next epoch.

Everything here reads and writes Lightning's loop internals (``_TrainingEpochLoop``,
``_EvaluationLoop`` and the loops' checkpoint entries), checked against
``pytorch_lightning`` 2.5.3 to 2.6.6 by the adapter tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

__all__ = [
    "PausePoint",
    "at_batch_end",
    "end_epoch_on_resume",
    "end_restart",
    "finish_batch_in_checkpoint",
    "fit_ends_after_batch",
    "fit_ends_here",
    "pause_point",
    "restore_fit_loop",
    "skip_last_save_at_train_end",
    "stop_after_batch",
    "undo_pending_validation_mark",
]


class PausePoint(NamedTuple):
    """What the uninterrupted fit would still do after the paused batch."""

    validation: bool  # a validation run is due after this batch
    epoch_end: bool  # this batch is the epoch's last


def pause_point(trainer: pl.Trainer) -> PausePoint:
    """Return what follows the current batch.

    Call after the batch's ``on_train_batch_end`` hooks, before ``should_stop`` is set.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    fetcher = trainer.fit_loop._data_fetcher
    validation = fetcher is not None and bool(epoch_loop._should_check_val_fx(fetcher))
    return PausePoint(
        validation=validation, epoch_end=bool(epoch_loop._num_ready_batches_reached())
    )


class _AtBatchEnd:
    """The epoch loop's ``on_advance_end`` for one batch, with actions run at its pause point."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self.actions: list[Callable[[PausePoint], None]] = []

    def __call__(self, data_fetcher: Any) -> None:
        epoch_loop = self.trainer.fit_loop.epoch_loop
        del epoch_loop.on_advance_end  # this batch only: Lightning's own from now on
        point = pause_point(self.trainer)
        if point.validation:  # left pending: the actions describe the batch before it
            for action in self.actions:
                action(point)
            epoch_loop.on_advance_end(data_fetcher)
        else:
            epoch_loop.on_advance_end(data_fetcher)
            for action in self.actions:
                action(point)


def at_batch_end(trainer: pl.Trainer, action: Callable[[PausePoint], None]) -> None:
    """Run ``action(point)`` where a pause of the current batch is taken.

    Call in ``on_train_batch_end``. ``action`` runs in the epoch loop's ``on_advance_end``
    of this batch: after every ``on_train_batch_end`` hook (those of the callbacks after
    the caller, then the module's) and the batch's logging; before the validation due
    after the batch (``point.validation``), else after the rest of that iteration
    (step-interval ``ReduceLROnPlateau`` schedulers, the loggers' step count). Actions
    asked for at the same batch run in the order asked.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    armed = vars(epoch_loop).get("on_advance_end")
    if not isinstance(armed, _AtBatchEnd):
        armed = _AtBatchEnd(trainer)
        epoch_loop.on_advance_end = armed  # type: ignore[method-assign]
    armed.actions.append(action)


def fit_ends_here(trainer: pl.Trainer) -> bool:
    """Whether ``fit`` ends after the current batch whatever a pause does, on this rank:
    ``max_steps`` reached, or ``should_stop`` set (by another callback) with the minimum
    trained.

    A fit restarted there would end at once, without the validation due after the
    batch; no pause (or resume point) is taken at it. A callback may stop one rank
    only: the ranks must agree (:func:`fit_ends_after_batch`; resume points agree on
    it in their own collective, as a deferred point).
    """
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    return bool(trainer.should_stop) and bool(trainer.fit_loop._can_stop_early)


def fit_ends_after_batch(trainer: pl.Trainer) -> bool:
    """:func:`fit_ends_here` on any rank (every rank gets the answer: all write or none)."""
    return bool(trainer.strategy.reduce_boolean_decision(fit_ends_here(trainer), all=False))


# The fit loop's min_epochs and min_steps while stop_after_batch has them off.
_MINIMUMS = "_trainer_resume_minimums"


def stop_after_batch(trainer: pl.Trainer, point: PausePoint) -> None:
    """In the paused process: skip the validation and the epoch end that follow the current batch.

    Call with ``trainer.should_stop`` set, where :func:`at_batch_end` runs its actions;
    undo with :func:`restore_fit_loop` when ``fit`` ends (also on errors), so the
    trainer's next ``fit`` is unaffected.
    """
    if point.validation:
        trainer.fit_loop.epoch_loop._skip_next_val = True
    fit_loop = trainer.fit_loop

    def skip_epoch_end_once() -> None:
        # The epoch end (hooks, epoch counters) of the interrupted epoch runs in the resumed fit.
        vars(fit_loop).pop("on_advance_end", None)

    fit_loop.on_advance_end = skip_epoch_end_once  # type: ignore[method-assign]
    # Lightning ignores should_stop until min_epochs and min_steps are met: the paused
    # process stops anyway (its minimums are the resumed fit's to meet).
    vars(fit_loop)[_MINIMUMS] = (fit_loop.min_epochs, fit_loop.epoch_loop.min_steps)
    fit_loop.min_epochs = fit_loop.epoch_loop.min_steps = None


def skip_last_save_at_train_end(trainer: pl.Trainer) -> None:
    """In the paused process: no ``last.ckpt`` from ``ModelCheckpoint.on_train_end``.

    ``ModelCheckpoint(save_last=True)`` saves ``last.ckpt`` when training ends if it has
    saved none yet (Lightning 2.6); at a pause the resumed fit would find a file its
    restored state does not know, and save ``last-v1.ckpt`` instead. Undone by
    :func:`restore_fit_loop`.
    """
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint) or not callback.save_last:
            continue
        if getattr(callback, "_last_checkpoint_saved", True):
            continue  # saved already, or a release that saves none at the end

        def skip(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            del trainer, pl_module

        callback.on_train_end = skip  # type: ignore[method-assign]


def restore_fit_loop(trainer: pl.Trainer) -> None:
    """Undo :func:`stop_after_batch`'s change to the fit loop (and an :func:`at_batch_end`
    left armed by an error, and :func:`skip_last_save_at_train_end`), if still in place."""
    vars(trainer.fit_loop).pop("on_advance_end", None)
    vars(trainer.fit_loop.epoch_loop).pop("on_advance_end", None)
    minimums = vars(trainer.fit_loop).pop(_MINIMUMS, None)
    if minimums is not None:
        trainer.fit_loop.min_epochs, trainer.fit_loop.epoch_loop.min_steps = minimums
    for callback in trainer.checkpoint_callbacks:
        vars(callback).pop("on_train_end", None)


def finish_batch_in_checkpoint(checkpoint: dict[str, Any], point: PausePoint) -> None:
    """Describe the validation after the paused batch as pending, where one is due.

    Taken where :func:`at_batch_end` runs, the batch is ``completed``; marking the
    validation loop as started with no batch processed makes the resumed fit run
    that validation from its first batch, and then the rest of the batch's iteration.
    """
    if point.validation:
        validation = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
        total = validation["total"]
        total["ready"] = total["started"] = total["completed"] + 1
        # The current run's counters restart from zero: one batch started, none processed.
        validation["current"].update(ready=1, started=1, processed=0, completed=0)


def end_epoch_on_resume(trainer: pl.Trainer) -> None:
    """Resumed at an epoch's last batch with no validation due: end that epoch.

    The restored epoch loop is done with its batches but, while restarting, waits
    for a validation run; marking the validation loop as run lets it end the epoch
    without pulling another batch.
    """
    trainer.fit_loop.epoch_loop.val_loop._has_run = True


def end_restart(trainer: pl.Trainer) -> None:
    """At the end of the epoch the pause interrupted: leave Lightning's restart mode.

    Lightning stays in restart mode until the restored epoch ends, and skips the
    metric-based epoch schedulers then, because its checkpoints do not hold the
    metrics; the pause file does, so they step as in the uninterrupted fit. A resume
    that only ran the pending validation and epoch end has trained no batch, and a
    loop left restarting would take the next epoch for the restored one.
    """
    fit_loop = trainer.fit_loop
    fit_loop.epoch_loop.restarting = False  # and the loops below it
    # Not the fit loop's setter: it keeps restarting on for iteration-based training (max_steps).
    fit_loop._restarting = False


def undo_pending_validation_mark(trainer: pl.Trainer) -> None:
    """After the pending validation ran: drop the extra started batch from its totals."""
    progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total
    progress.ready -= 1
    progress.started -= 1
