"""``accelerator_state``: what an ``Accelerator`` carries from one micro-step to the next.

Inside ``with accelerator.accumulate(model)`` Accelerate counts micro-steps in
``Accelerator.step`` and decides from it whether this one syncs gradients and steps the
optimizer (``GradientState.sync_gradients``). A pause inside an accumulation window
must keep both, or the resumed window ends at another micro-step (the scheduler then
ends off by one). The gradients accumulated so far are saved by the trainer mixin for
every resume object, as at any pause (each process's own: a pause inside a window is
refused on another number of processes).

Accelerate internals used (accelerate 1.15): ``Accelerator.step`` (set back on resume),
``GradientState.plugin_kwargs`` (``sync_each_batch``), ``GradientState.num_steps``,
``adjust_scheduler`` and ``sync_with_dataloader``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import ResumeStateMismatchError
from ...state import AcceleratorStepSettings, AcceleratorStepState, is_int

__all__ = ["ACCELERATOR_FORMAT", "AcceleratorResumeState", "accelerator_state"]

ACCELERATOR_FORMAT = "trainer_resume.accelerate/1"
_KEYS = ("format", "step", "sync_gradients", "settings")
_SETTING_HINTS = {
    "num_steps": "gradient_accumulation_steps",
    "adjust_scheduler": "GradientAccumulationPlugin(adjust_scheduler=...)",
    "sync_with_dataloader": "GradientAccumulationPlugin(sync_with_dataloader=...)",
    "sync_each_batch": "GradientAccumulationPlugin(sync_each_batch=...)",
}


class AcceleratorResumeState:
    """The state ``accelerator_state(accelerator)`` returns: a resume object of its own.

    ``state_dict()`` holds ``Accelerator.step``, ``sync_gradients`` and the
    gradient-accumulation settings (an :class:`~trainer_resume.state.AcceleratorStepState`);
    ``load_state_dict()`` checks the state completely and refuses one saved with other
    accumulation settings (``ResumeStateMismatchError``, 330) before it changes anything.
    """

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def _settings(self) -> AcceleratorStepSettings:
        gradient_state = self.accelerator.gradient_state
        return {
            "num_steps": int(gradient_state.num_steps),
            "adjust_scheduler": bool(gradient_state.adjust_scheduler),
            "sync_with_dataloader": bool(gradient_state.sync_with_dataloader),
            "sync_each_batch": bool(gradient_state.plugin_kwargs.get("sync_each_batch", False)),
        }

    def state_dict(self) -> AcceleratorStepState:
        """``Accelerator.step``, ``sync_gradients`` and the accumulation settings, as plain data."""
        return {
            "format": ACCELERATOR_FORMAT,
            "step": int(self.accelerator.step),
            "sync_gradients": bool(self.accelerator.sync_gradients),
            "settings": self._settings(),
        }

    def validate_state_dict(self, state: Any) -> None:
        """Check ``state`` completely against this Accelerator; changes nothing.

        Raises:
            ResumeStateMismatchError: not a state of this kind, or saved with other
                gradient-accumulation settings (named, with the argument to change).
        """
        what = "the Accelerator's state"
        if not isinstance(state, Mapping) or sorted(state) != sorted(_KEYS):
            found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ResumeStateMismatchError(f"{what} must hold {list(_KEYS)}, found {found}")
        if state["format"] != ACCELERATOR_FORMAT:
            raise ResumeStateMismatchError(
                f"{what} has format {state['format']!r}, expected {ACCELERATOR_FORMAT!r}"
            )
        if not is_int(state["step"]) or state["step"] < 0:
            raise ResumeStateMismatchError(
                f"{what}['step'] must be an int >= 0, got {state['step']!r}"
            )
        if not isinstance(state["sync_gradients"], bool):
            raise ResumeStateMismatchError(
                f"{what}['sync_gradients'] must be a bool, got {state['sync_gradients']!r}"
            )
        saved = state["settings"]
        if not isinstance(saved, Mapping):
            raise ResumeStateMismatchError(f"{what}['settings'] must be a dict")
        for name, value in self._settings().items():
            if name not in saved or type(saved[name]) is not type(value) or saved[name] != value:
                raise ResumeStateMismatchError(
                    f"gradient accumulation setting {name!r} was {saved.get(name)!r} when the run "
                    f"paused and is {value!r} in this Accelerator; build it with "
                    f"{_SETTING_HINTS[name]} as in the paused run"
                )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` completely, then set ``Accelerator.step`` and ``sync_gradients``."""
        self.validate_state_dict(state)
        self.accelerator.step = state["step"]
        self.accelerator.sync_gradients = state["sync_gradients"]


def accelerator_state(accelerator: Any) -> AcceleratorResumeState:
    """What ``accelerator`` carries between steps, as a resume object.

    Return it from ``_resume_objects()`` beside the prepared model, optimizer and
    scheduler (:func:`~trainer_resume.adapters.accelerate.resume_objects` does that).

    Args:
        accelerator: The ``accelerate.Accelerator``.
    """
    return AcceleratorResumeState(accelerator)
