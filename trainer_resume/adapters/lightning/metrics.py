"""The metrics a Lightning ``fit`` has logged so far, carried across a pause.

Lightning keeps the last logged value of every metric (``trainer.callback_metrics``,
``logged_metrics``, ``progress_bar_metrics``) and callbacks read them later: a
``ModelCheckpoint`` or ``EarlyStopping`` monitoring ``val_loss`` at a training step,
the validation end reading the training loss. Lightning's checkpoint does not hold
them, so a resumed fit would start with none. The pause file keeps them and the
resumed fit starts with them.

The running epoch-level accumulations of training metrics (``self.log(...,
on_epoch=True)`` in the training hooks) are carried too, per rank
(:func:`epoch_results_state`): a logged tensor's sum (or extreme) and batch count, and
for a torchmetrics ``Metric`` of the module logged as itself, whose states are all
persistent (``metric.persistent(True)``), its entry (its states are the module's own,
which the pause saves). The resumed fit registers each entry as the module's
``self.log`` call would have, with the accumulation the paused fit had reached, before
it trains or ends the interrupted epoch: the epoch's value covers every batch, and a
callback monitoring it decides as in the uninterrupted fit. What cannot be carried (a
metric that is not saved with the module, or any torchmetrics metric under several
processes, whose states differ by rank where the module's state is rank 0's; one synced
over a process group of the user's) is named, and the resumed fit warns that its value
for the interrupted epoch covers only the batches after the resume.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from ...state import cpu_state

__all__ = [
    "epoch_metrics_in_progress",
    "epoch_results_state",
    "logged_metrics_state",
    "restore_epoch_results",
    "restore_logged_metrics",
]

_KINDS = ("callback", "logged", "progress_bar")


def logged_metrics_state(trainer: pl.Trainer) -> dict[str, dict[str, Any]]:
    """This rank's last logged metrics, as CPU copies."""
    return {
        "callback": cpu_state(dict(trainer.callback_metrics)),
        "logged": cpu_state(dict(trainer.logged_metrics)),
        "progress_bar": cpu_state(dict(trainer.progress_bar_metrics)),
    }


def restore_logged_metrics(trainer: pl.Trainer, state: Any, device: torch.device) -> None:
    """Make ``state`` the trainer's last logged metrics: :func:`logged_metrics_state` by
    rank (this rank's taken), or one for all ranks (earlier releases' files: rank 0's)."""
    if isinstance(state, list):
        state = state[trainer.global_rank] if len(state) == trainer.world_size else None
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


def _in_progress(trainer: pl.Trainer) -> list[tuple[str, Any]]:
    """The training results whose epoch-level value is being accumulated: ``(key, result)``."""
    results = getattr(trainer.fit_loop.epoch_loop, "_results", None) or {}
    return [
        (key, result)
        for key, result in results.items()
        if getattr(result, "meta", None) is not None
        and result.meta.on_epoch
        and not result.has_reset
        and getattr(result, "_update_count", 0)
    ]


def epoch_metrics_in_progress(trainer: pl.Trainer) -> list[str]:
    """Names of the training metrics whose epoch-level accumulation a pause cannot carry
    (see :func:`epoch_results_state`)."""
    return sorted(
        str(result.meta.name)
        for _, result in _in_progress(trainer)
        if _carried(trainer, result) is None
    )


def epoch_results_state(trainer: pl.Trainer) -> list[dict[str, Any]]:
    """This rank's epoch-level accumulations of training metrics that a pause carries:
    per logged key, the arguments of its ``self.log`` call and its accumulation (plain
    data; tensors on the CPU)."""
    entries = []
    for key, result in _in_progress(trainer):
        entry = _carried(trainer, result)
        if entry is None:
            continue
        entry["key"] = key
        entry["updates"] = int(result._update_count)
        cache = result._forward_cache  # the last step value, logged again at later steps
        entry["step_value"] = (
            cache.detach().cpu().clone() if isinstance(cache, torch.Tensor) else None
        )
        if result.is_tensor:
            entry["value"] = result.value.detach().cpu().clone()
            if result.meta.is_mean_reduction:
                entry["batch_size"] = result.cumulated_batch_size.detach().cpu().clone()
        entries.append(entry)
    return entries


def _carried(trainer: pl.Trainer, result: Any) -> dict[str, Any] | None:
    """The ``self.log`` arguments that register ``result`` again, or ``None`` where its
    accumulation cannot be carried."""
    meta = result.meta
    sync = meta.sync
    reduce = getattr(meta.reduce_fx, "__name__", None)
    if (
        sync.group is not None  # a process group of the user's: not saved
        or meta.dataloader_idx is not None
        or reduce not in ("mean", "sum", "max", "min")
        or meta.reduce_fx is not getattr(torch, reduce)  # Python's own sum, max or min
    ):
        return None
    if not result.is_tensor and (
        meta.metric_attribute is None
        or not _saved_with_module(trainer, result)
        # The module's state is rank 0's in the pause, its metrics' states each rank's own.
        or trainer.world_size > 1
    ):
        return None
    return {
        "fx": meta.fx,
        "name": meta.name,
        "prog_bar": bool(meta.prog_bar),
        "logger": bool(meta.logger),
        "on_step": bool(meta.on_step),
        "reduce_fx": reduce,
        "enable_graph": bool(meta.enable_graph),
        "add_dataloader_idx": bool(meta.add_dataloader_idx),
        "sync_dist": bool(sync.should),
        "rank_zero_only": bool(sync.rank_zero_only),
        "metric_attribute": meta.metric_attribute,
    }


def restore_epoch_results(
    trainer: pl.Trainer, entries: Any, device: torch.device, *, mid_epoch: bool
) -> None:
    """Register ``entries`` (from :func:`epoch_results_state`) in the fit's training
    results as their ``self.log`` calls did, holding the accumulations they had.

    ``mid_epoch``: the resumed fit's first batch goes on with the interrupted epoch.
    Lightning resets a hook's logged tensors at its first call in an epoch's first
    batch; that batch is not the epoch's first, so it is told so.
    """
    if mid_epoch:
        trainer._logger_connector._first_loop_iter = False
    results = trainer.fit_loop.epoch_loop._results
    module = trainer.lightning_module
    for entry in entries:
        attribute = entry["metric_attribute"]
        value: Any = (
            module.get_submodule(attribute) if attribute is not None else entry["value"].to(device)
        )
        results.log(
            entry["fx"],
            entry["name"],
            value,
            prog_bar=entry["prog_bar"],
            logger=entry["logger"],
            on_step=entry["on_step"],
            on_epoch=True,
            reduce_fx=getattr(torch, entry["reduce_fx"]),
            enable_graph=entry["enable_graph"],
            # As LightningModule.log passes them.
            sync_dist=entry["sync_dist"],
            sync_dist_fn=trainer.strategy.reduce,
            add_dataloader_idx=entry["add_dataloader_idx"],
            batch_size=1,
            metric_attribute=attribute,
            rank_zero_only=entry["rank_zero_only"],
        )
        result = results[entry["key"]]
        if result.is_tensor:  # the accumulation the paused fit had reached, not the call's
            result.value = entry["value"].to(device)
            if "batch_size" in entry:
                result.cumulated_batch_size = entry["batch_size"].to(device)
        result._update_count = entry["updates"]
        result._computed = None
        step_value = entry.get("step_value")
        result._forward_cache = step_value.to(device) if step_value is not None else None


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
