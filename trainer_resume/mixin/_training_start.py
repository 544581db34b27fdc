"""What the hooks return, when training starts and when ``resume()`` restores.

Before the first ``@training_step`` call runs (and in ``resume()``, and in a pause
before any step), :func:`check_hook_results` refuses a resume object or loader a
pause could not save (see :mod:`trainer_resume.checks.hook_results`). Under a process
group the ranks agree on the result, so no rank trains on while another refused.

A loader from elsewhere (torchdata's Stateful protocol) cannot check a state
without loading it, so ``resume()`` restores those loaders before anything else
(:func:`restore_foreign_loaders`); when one refuses its state, the ones already
loaded get their previous state back, and the trainer is as it was, not locked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import distributed as _distributed
from ..checks.hook_results import (
    check_resume_loaders,
    check_resume_objects,
    is_library_loader,
    resume_loaders,
)
from ..errors import LoaderStateError, TrainerLockedError, UnsupportedResumeConfigurationError

__all__ = [
    "check_at_training_start",
    "check_hook_results",
    "refuse_epoch_start_loaders",
    "refuse_inside_epoch",
    "restore_foreign_loaders",
]

_FIRST_STEP = "the first training step"


def check_hook_results(trainer: Any) -> None:
    """Refuse what ``_resume_objects()`` / ``_resume_loaders()`` return that a pause could not save.

    Raises:
        UnsupportedResumeConfigurationError: naming the entry, its type and the fix (332).
    """
    name = type(trainer).__name__
    check_resume_objects(trainer._resume_objects(), name)
    check_resume_loaders(resume_loaders(trainer), name, vars(trainer))


def check_at_training_start(trainer: Any) -> None:
    """Before the first step: :func:`check_hook_results`, agreed by every rank."""
    with _distributed.agreed(_FIRST_STEP, _distributed.is_distributed()):
        check_hook_results(trainer)


def refuse_epoch_start_loaders(trainer: Any, pauses: str | None) -> None:
    """Refuse a loader the trainer holds that resumes only at an epoch's start (its class
    says ``resumes_at_epoch_start_only``: ``ReuseDataLoader``) where ``pauses`` (resume
    points, signals) would land inside its epochs: a run resumed there would repeat the
    epoch's batches read before the pause.

    Raises:
        UnsupportedResumeConfigurationError: naming the loader and the fix (332).
    """
    if pauses is None:
        return
    for label, value in _epoch_start_loaders(trainer):
        raise UnsupportedResumeConfigurationError(
            f"{type(trainer).__name__}.{label} ({type(value).__name__}) resumes only at an "
            f"epoch's start, but {pauses} pause at step boundaries inside its epochs, where "
            "a resumed run would read the epoch again from its start: return it from "
            "_resume_loaders() with its own order (shuffle=True, or no sampler), where it "
            "resumes at any step, or pause between epochs with pause(path) after the "
            "epoch's work"
        )


def refuse_inside_epoch(trainer: Any) -> None:
    """Refuse a pause while a loader the trainer holds that resumes only at an epoch's
    start is inside an epoch (``epoch_in_progress``).

    Raises:
        UnsupportedResumeConfigurationError: naming the loader and the fix (332).
    """
    for label, value in _epoch_start_loaders(trainer):
        if value.epoch_in_progress:
            raise UnsupportedResumeConfigurationError(
                f"{type(trainer).__name__}.{label} ({type(value).__name__}) is inside an epoch "
                "and resumes only at an epoch's start: a run resumed from this pause would read "
                "the epoch again from its start; pause after the epoch's last batch, or return "
                "it from _resume_loaders() with its own order (shuffle=True, or no sampler) "
                "(the previous pause is kept)"
            )


def _epoch_start_loaders(trainer: Any) -> list[tuple[str, Any]]:
    """The loaders the trainer holds whose class says ``resumes_at_epoch_start_only``, but
    not one ``_resume_loaders()`` returns that says ``resumes_mid_epoch`` (its position
    inside the epoch is saved: ``ReuseDataLoader`` with its own order)."""
    held = [
        (label, value)
        for label, value in vars(trainer).items()
        if getattr(type(value), "resumes_at_epoch_start_only", False) is True
    ]
    if not held:
        return held
    try:
        returned = {id(loader) for loader in trainer._resume_loaders().values()}
    except Exception:  # noqa: BLE001 - a hook that cannot answer yet returns none of them
        returned = set()
    return [
        (label, value)
        for label, value in held
        if id(value) not in returned or getattr(value, "resumes_mid_epoch", False) is not True
    ]


def restore_foreign_loaders(
    trainer: Any, guard: Any, saved: Mapping[str, Any], location: str, collective: bool
) -> None:
    """Load the saved states of the loaders from elsewhere, before anything else is restored.

    Args:
        trainer: The trainer (``_resume_loaders()`` is called).
        guard: Its ``StepGuard``: locked only when putting a loader back fails too.
        saved: Loader name -> saved state (this rank's).
        location: The pause file, for messages.
        collective: Under a process group: restored on every rank or put back on every
            rank.

    Raises:
        LoaderStateError: a loader (on any rank) refused its state; every loader is
            back as it was (333).
        TrainerLockedError: putting a loader back failed as well (325).
    """
    error: Exception | None = None
    loaded: list[tuple[str, Any, Any]] = []
    for name, loader in resume_loaders(trainer).items():
        if is_library_loader(loader):
            continue
        try:
            previous = loader.state_dict()
            loader.load_state_dict(saved[name])
        except Exception as exc:  # noqa: BLE001 - another library's refusal, as a catalogue error
            error = LoaderStateError(
                f"{location}: loader {name!r} ({type(loader).__name__}) refused its saved state "
                f"({type(exc).__name__}: {exc}); nothing was restored"
            )
            error.__cause__ = exc
            break
        loaded.append((name, loader, previous))
    if collective:
        try:
            _distributed.agree(error, "resume()")
        except Exception as other:  # noqa: BLE001 - this rank raises its own error, if any
            error = error or other
    if error is None:
        return
    for name, loader, previous in reversed(loaded):
        try:
            loader.load_state_dict(previous)
        except Exception as exc:
            guard.locked_reason = (
                f"putting loader {name!r} back after {location} was refused failed "
                f"({type(exc).__name__}: {exc})"
            )
            raise TrainerLockedError(guard.locked_reason) from exc
    raise error
