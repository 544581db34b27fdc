"""``_initialize_training_resume``: a trainer's settings and its step guard, wired once.

It also starts watching optimizer steps (:mod:`._gradient_liveness`). The guard gets
the boundary check (:func:`~._landing.pause_at_step_boundary`), the trainer's resume
points, and two one-shot checks for the first step: the audit for forgotten hooks and
the refusal of what the hooks return. The end of the call is the boundary before the
first step.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from ..durable import validate_key
from ..resume_points import ResumePoints
from ..sharded.detect import refuse_unreduced_gradients, sharded_objects
from ..signature import sign_config, warn_if_ignoring_nothing
from ._boundary import record_boundary
from ._ddp_window import watch_windows
from ._gradient_liveness import track_gradients
from ._hook_audit import audit_trainer
from ._landing import pause_at_step_boundary
from ._pause import refuse_sharded_url
from ._pause_request import SIGNALS_ATTRIBUTE
from ._settings import SETTINGS_ATTRIBUTE, Settings
from ._sharded_window import watch_optimizer_steps
from ._step_guard import GUARD_ATTRIBUTE, StepGuard
from ._training_start import check_at_training_start, refuse_epoch_start_loaders

if TYPE_CHECKING:
    from . import TrainingResumeMixin

__all__ = ["initialize"]


def initialize(
    trainer: TrainingResumeMixin,
    config: Any,
    *,
    version: str,
    key: bytes | None,
    resume_points: ResumePoints | None,
    excluded_attributes: Iterable[str],
    config_ignore: Collection[str],
    base: type,
    scheduler_steps: str = "convert",
    spent_gradients: str = "save",
) -> None:
    """The body of ``_initialize_training_resume`` (arguments and errors as documented there).

    Args:
        base: ``TrainingResumeMixin``, to tell overridden hooks from the defaults.
    """
    if not isinstance(version, str) or not version:
        raise TypeError(f"version must be a non-empty str, got {version!r}")
    key = validate_key(key)
    excluded = frozenset(excluded_attributes)
    if isinstance(excluded_attributes, str) or not all(isinstance(name, str) for name in excluded):
        raise TypeError(f"excluded_attributes must be attribute names, got {excluded_attributes!r}")
    if scheduler_steps not in ("convert", "keep"):
        raise ValueError(f"scheduler_steps must be 'convert' or 'keep', got {scheduler_steps!r}")
    if spent_gradients not in ("save", "drop"):
        raise ValueError(f"spent_gradients must be 'save' or 'drop', got {spent_gradients!r}")
    if resume_points is not None and not isinstance(resume_points, ResumePoints):
        raise TypeError(f"resume_points must be a ResumePoints, got {type(resume_points).__name__}")
    if spent_gradients == "drop":
        # From here on every optimizer step is seen, so a pause can tell spent gradients.
        track_gradients()
    signed = sign_config(config, ignore=config_ignore)
    warn_if_ignoring_nothing(signed, stacklevel=4)
    trainer.__dict__[SETTINGS_ATTRIBUTE] = Settings(
        version, signed, key, scheduler_steps, spent_gradients
    )
    if GUARD_ATTRIBUTE not in trainer.__dict__:
        trainer.__dict__[GUARD_ATTRIBUTE] = StepGuard(pause_at_step_boundary)
    guard: StepGuard = trainer.__dict__[GUARD_ATTRIBUTE]
    guard.check_every_boundary = bool(trainer._pause_check_every_step)
    if resume_points is not None:
        resume_points.attach(trainer)
    guard.points = resume_points

    def first_boundary(trainer: TrainingResumeMixin) -> Any:
        # When training starts: the first micro-batch of a window shows where the
        # gradients of a sharded model go, before any pause could need them.
        try:
            objects = trainer._resume_objects()
        except Exception:  # noqa: BLE001 - pause() calls the same hook and reports it
            objects = {}
        refuse_unreduced_gradients(objects, sharded_objects(objects))
        return audit_trainer(trainer, excluded, base)

    def start(trainer: TrainingResumeMixin) -> None:
        check_at_training_start(trainer)
        armed = SIGNALS_ATTRIBUTE in trainer.__dict__
        refuse_epoch_start_loaders(
            trainer,
            "resume points"
            if guard.points is not None
            else "signals (pause_on_signal())"
            if armed
            else None,
        )
        sharded = sharded_objects(trainer._resume_objects())
        if guard.points is not None:  # sharded points are directories every rank writes to
            refuse_sharded_url(guard.points.directory, sharded)
        # Before the first backward: DDP's record of a window is seen from its start,
        # and a sharded model's optimizer steps, which close its windows.
        watch_windows(trainer)
        watch_optimizer_steps(sharded)

    guard.audit = first_boundary
    guard.start_check = start
    record_boundary(trainer, guard)
