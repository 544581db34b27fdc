"""The metrics a Lightning ``fit`` has logged so far, carried across a pause.

Lightning keeps the last logged value of every metric (``trainer.callback_metrics``,
``logged_metrics``, ``progress_bar_metrics``) and callbacks read them later: a
``ModelCheckpoint`` or ``EarlyStopping`` monitoring ``val_loss`` at a training step,
the validation end reading the training loss. Lightning's checkpoint does not hold
them, so a resumed fit would start with none. The pause file keeps them and the
resumed fit starts with them.

What it does not carry are the running epoch-level accumulations of training
metrics (``self.log(..., on_epoch=True)`` in ``training_step``): Lightning's
metric objects have no saveable state. Their names are recorded, and the resumed
fit warns that their values for the interrupted epoch cover only the batches
after the resume. A torchmetrics ``Metric`` of the module logged as itself, whose
states are all persistent (``metric.persistent(True)``), accumulates in the module's
own state, which the pause saves: it is exact, and not named, unless the pause leaves
its epoch's end to the resumed fit.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from ...state import cpu_state

__all__ = ["epoch_metrics_in_progress", "logged_metrics_state", "restore_logged_metrics"]

_KINDS = ("callback", "logged", "progress_bar")


def logged_metrics_state(trainer: pl.Trainer) -> dict[str, dict[str, Any]]:
    """The trainer's last logged metrics, as CPU copies."""
    return {
        "callback": cpu_state(dict(trainer.callback_metrics)),
        "logged": cpu_state(dict(trainer.logged_metrics)),
        "progress_bar": cpu_state(dict(trainer.progress_bar_metrics)),
    }


def restore_logged_metrics(trainer: pl.Trainer, state: Any, device: torch.device) -> None:
    """Make ``state`` (from :func:`logged_metrics_state`) the trainer's last logged metrics."""
    if not isinstance(state, dict):
        return
    connector = trainer._logger_connector

    def on_device(values: Any) -> dict[str, Any]:
        if not isinstance(values, dict):
            return {}
        return {
            key: value.to(device) if isinstance(value, torch.Tensor) else value
            for key, value in values.items()
        }

    connector._callback_metrics = on_device(state.get("callback"))
    connector._logged_metrics = on_device(state.get("logged"))
    connector._progress_bar_metrics = on_device(state.get("progress_bar"))


def epoch_metrics_in_progress(trainer: pl.Trainer, *, epoch_end: bool = False) -> list[str]:
    """Names of the training metrics whose epoch-level value is being accumulated.

    With the epoch's end left to the resumed fit (``epoch_end``), a metric the module
    saves is named too: the resumed fit, which logs nothing before that end, neither
    computes nor resets it there.
    """
    results = getattr(trainer.fit_loop.epoch_loop, "_results", None) or {}
    names = set()
    for metric in results.values():
        meta = getattr(metric, "meta", None)
        if meta is not None and meta.on_epoch and getattr(metric, "_update_count", 0):
            if epoch_end or not _saved_with_module(trainer, metric):
                names.add(str(meta.name))
    return sorted(names)


def _saved_with_module(trainer: pl.Trainer, metric: Any) -> bool:
    """Whether a logged result is a metric of the module whose every state its
    ``state_dict()`` holds (a torchmetrics ``Metric`` made persistent)."""
    if getattr(metric, "is_tensor", True):
        return False
    value = getattr(metric, "value", None)
    persistent = getattr(value, "_persistent", None)
    module = trainer.lightning_module
    return (
        isinstance(value, torch.nn.Module)
        and isinstance(persistent, dict)
        and bool(persistent)
        and all(persistent.values())
        and any(value is submodule for submodule in module.modules())
    )
