"""What a ``transformers.Trainer`` carries from one optimizer step to the next, as plain data.

Besides the model, optimizer, scheduler and scaler (resume objects of their own), the
Trainer's loop keeps:

- ``TrainerState``: ``global_step``, ``epoch``, ``log_history``, ``total_flos``,
  ``num_input_tokens_seen``, the best metric and checkpoint, the states of the
  stateful callbacks it records, and the rest of its fields;
- ``TrainerControl`` (its flags) and the state of every callback that exports one
  (``ExportableState``, e.g. ``EarlyStoppingCallback``'s patience counter);
- the loss bookkeeping between two logs: the loss summed since the last log
  (``Trainer._tr_loss``), the sum of every logged loss (``_total_loss_scalar``), the
  step of the last log (``_globalstep_last_logged``), where this ``train()`` call
  started (``_initial_global_step``, ``_initial_num_input_tokens_seen``: the final
  ``train_loss`` averages from there) and the FLOPs not yet added to the state
  (``current_flos``);
- where the epoch loop stands: the epoch the next step belongs to and how many of
  its batches were delivered.

These are Trainer internals (transformers 5.24): the attribute names above, which
``Trainer._inner_training_loop`` sets before ``on_train_begin`` and ``_run_epoch``
and ``_maybe_log_save_evaluate`` update. :func:`capture` takes them at a pause,
:func:`check` refuses a saved state that does not fit this trainer before anything
changes, :func:`restore` puts them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from transformers.trainer_callback import ExportableState, TrainerControl, TrainerState

from ...errors import CheckpointFormatError, ResumeStateMismatchError
from ...state import is_int

__all__ = ["EXTRA_KEY", "LOOP_FORMAT", "Position", "capture", "check", "position", "restore"]

LOOP_FORMAT = "trainer_resume.transformers/1"
# The entry of the pause file's extra state that holds all of this.
EXTRA_KEY = "transformers"

_KEYS = ("format", "position", "trainer_state", "control", "callbacks", "bookkeeping")
_BOOKKEEPING: dict[str, tuple[type, ...]] = {
    "_tr_loss": (torch.Tensor,),
    "_total_loss_scalar": (float, int),
    "_globalstep_last_logged": (int,),
    "_initial_global_step": (int,),
    "_initial_num_input_tokens_seen": (int,),
    "current_flos": (float, int),
}
_CONTROL_FLAGS = tuple(field.name for field in dataclasses.fields(TrainerControl))
_STATE_FIELDS = tuple(field.name for field in dataclasses.fields(TrainerState))


class Position:
    """Where the epoch loop stands: the epoch of the next step and its batches delivered."""

    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int, batches: int) -> None:
        self.epoch = epoch
        self.batches = batches


def _plain(value: Any) -> Any:
    # What users log may hold NumPy numbers; a pause file holds plain data only.
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _exportable(trainer: Any) -> list[Any]:
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ExportableState)]


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def capture(trainer: Any, where: Position) -> dict[str, Any]:
    """The loop's state at an optimizer-step end, for ``_resume_extra_state()``."""
    return {
        "format": LOOP_FORMAT,
        "position": {"epoch": where.epoch, "batches": where.batches},
        "trainer_state": {name: _plain(getattr(trainer.state, name)) for name in _STATE_FIELDS},
        "control": {name: bool(getattr(trainer.control, name)) for name in _CONTROL_FLAGS},
        "callbacks": [
            {"type": _type_name(cb), "state": _plain(cb.state())} for cb in _exportable(trainer)
        ],
        "bookkeeping": {name: _plain(getattr(trainer, name)) for name in _BOOKKEEPING},
    }


def _require(condition: bool, text: str) -> None:
    if not condition:
        raise CheckpointFormatError(f"the pause file's Trainer state: {text}")


def _is_count(value: Any) -> bool:
    return is_int(value) and value >= 0


def position(saved: Any, accumulation: int) -> Position:
    """The saved loop position, checked.

    Args:
        saved: The ``transformers`` entry of the pause file's extra state.
        accumulation: ``gradient_accumulation_steps`` of this run: a pause lands at
            an optimizer step's end, so an epoch resumes after whole windows.

    Raises:
        CheckpointFormatError: not a Trainer state of this format (321).
        ResumeStateMismatchError: the position lies inside an accumulation window of
            this run (saved with another ``gradient_accumulation_steps``; 330).
    """
    _require(isinstance(saved, Mapping), f"is a {type(saved).__name__}, not a dict")
    _require(
        saved.get("format") == LOOP_FORMAT, f"format {saved.get('format')!r} is not {LOOP_FORMAT!r}"
    )
    _require(
        sorted(saved) == sorted(_KEYS), f"holds {sorted(map(str, saved))}, not {sorted(_KEYS)}"
    )
    where = saved["position"]
    _require(
        isinstance(where, Mapping)
        and sorted(where) == ["batches", "epoch"]
        and all(_is_count(where[key]) for key in where),
        "'position' must hold the counts 'epoch' and 'batches'",
    )
    if where["batches"] % accumulation:
        raise ResumeStateMismatchError(
            f"the run paused after batch {where['batches']} of its epoch, inside a window of "
            f"gradient_accumulation_steps={accumulation}: it was paused with another "
            "gradient_accumulation_steps; resume it with the paused run's arguments"
        )
    return Position(where["epoch"], where["batches"])


def check(saved: Any, trainer: Any) -> None:
    """Refuse a saved loop state that does not fit ``trainer`` (nothing is changed).

    Raises:
        CheckpointFormatError: malformed (321).
        ResumeStateMismatchError: other ``TrainerState`` fields (another transformers
            release), other stateful callbacks, or callbacks built with other
            arguments (330).
    """
    position(saved, trainer.args.gradient_accumulation_steps)
    state = saved["trainer_state"]
    _require(isinstance(state, Mapping), "'trainer_state' is not a dict")
    if list(state) != list(_STATE_FIELDS):
        raise ResumeStateMismatchError(
            f"the pause file's TrainerState has the fields {list(state)}, this transformers' "
            f"has {list(_STATE_FIELDS)}: resume with the transformers release that paused"
        )
    control = saved["control"]
    _require(
        isinstance(control, Mapping)
        and list(control) == list(_CONTROL_FLAGS)
        and all(isinstance(flag, bool) for flag in control.values()),
        f"'control' must hold the bools {list(_CONTROL_FLAGS)}",
    )
    bookkeeping = saved["bookkeeping"]
    _require(
        isinstance(bookkeeping, Mapping) and list(bookkeeping) == list(_BOOKKEEPING),
        f"'bookkeeping' must hold {list(_BOOKKEEPING)}",
    )
    for name, kinds in _BOOKKEEPING.items():
        value = bookkeeping[name]
        _require(
            isinstance(value, kinds) and not isinstance(value, bool),
            f"bookkeeping[{name!r}] is a {type(value).__name__}",
        )
    _require(bookkeeping["_tr_loss"].dim() == 0, "bookkeeping['_tr_loss'] is not a scalar")
    _check_callbacks(saved["callbacks"], _exportable(trainer))


def _check_callbacks(saved: Any, live: list[Any]) -> None:
    _require(isinstance(saved, list), "'callbacks' is not a list")
    for entry in saved:
        _require(
            isinstance(entry, Mapping)
            and sorted(entry) == ["state", "type"]
            and isinstance(entry["state"], Mapping)
            and isinstance(entry["state"].get("args", {}), Mapping)
            and isinstance(entry["state"].get("attributes", {}), Mapping),
            "a callback entry must hold its 'type' and its state()",
        )
    names = [_type_name(cb) for cb in live]
    if [entry["type"] for entry in saved] != names:
        raise ResumeStateMismatchError(
            f"the paused run had the stateful callbacks {[entry['type'] for entry in saved]}, this "
            f"trainer has {names}: pass the same callbacks as the paused run"
        )
    for entry, callback in zip(saved, live):
        arguments = _plain(callback.state().get("args", {}))
        if dict(entry["state"].get("args", {})) != arguments:
            raise ResumeStateMismatchError(
                f"callback {entry['type']} was built with {dict(entry['state'].get('args', {}))} in "
                f"the paused run and with {arguments} here: build it as the paused run did"
            )


def restore(saved: Mapping[str, Any], trainer: Any) -> None:
    """Put a checked loop state back into ``trainer`` (its state, control, callbacks, bookkeeping)."""
    for name, value in saved["trainer_state"].items():
        setattr(trainer.state, name, value)
    for name, flag in saved["control"].items():
        setattr(trainer.control, name, flag)
    for entry, callback in zip(saved["callbacks"], _exportable(trainer)):
        for name, value in entry["state"].get("attributes", {}).items():
            setattr(callback, name, value)
    bookkeeping = dict(saved["bookkeeping"])
    # A copy: the Trainer sums into it in place.
    bookkeeping["_tr_loss"] = bookkeeping["_tr_loss"].to(trainer.args.device, copy=True)
    for name, value in bookkeeping.items():
        setattr(trainer, name, value)
