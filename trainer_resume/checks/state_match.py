"""Does a saved state fit the live object it is about to be loaded into?

``resume()`` runs these checks on every resume object before the first one is
loaded: ``Module.load_state_dict`` copies the tensors whose shapes match before it
complains about the others, and ``Optimizer.load_state_dict`` accepts moment
buffers of any shape. A refusal found half-way would leave a trainer that is
neither the old run nor the new one, so every mismatch is found first.

What is compared, per kind of object:

- ``torch.nn.Module``: the key sets, under canonical names (a compiled, DDP- or
  checkpoint-wrapped module is matched by the unwrapped module's names, see
  :mod:`trainer_resume._module_names`), and each tensor's shape and dtype;
- ``torch.optim.Optimizer``: the number of parameter groups, the number of
  parameters in each, and each saved per-parameter tensor against the live state
  of that parameter (or, for a fresh optimizer, against the parameter's shape);
- a GradScaler: what ``restore_grad_scaler_state`` would refuse;
- an object with ``validate_state_dict(state)`` (the adapters' state objects): what it
  raises (a ``ResumeError`` of the same class, any other error as a mismatch);
- anything else: the shape and dtype of every tensor both states hold at the
  same place (their key sets may legitimately differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from .._module_names import (
    ModuleNames,
    describe_key_difference,
    match_names,
    recorded_parameter_name,
)
from ..amp import validate_grad_scaler_state
from ..errors import ResumeError, ResumeStateMismatchError

__all__ = ["check_module_state", "check_object_states", "check_optimizer_state"]


def check_object_states(
    objects: Mapping[str, Any], states: Mapping[str, Any], scalers: tuple[type, ...]
) -> None:
    """Raise ``ResumeStateMismatchError`` naming the first state that does not fit its object.

    Args:
        objects: Name -> live resume object.
        states: Name -> the state saved for it (same names, already checked).
        scalers: The GradScaler classes of this torch.
    """
    for name, obj in objects.items():
        where = f"object {name!r} ({type(obj).__name__})"
        saved = states[name]
        if isinstance(obj, torch.nn.Module):
            _check_module(where, saved, obj)
        elif isinstance(obj, torch.optim.Optimizer):
            _check_optimizer(where, saved, obj)
        elif isinstance(obj, scalers):
            try:
                validate_grad_scaler_state(obj, saved)
            except (TypeError, ValueError) as error:
                raise ResumeStateMismatchError(f"{where}: {error}") from error
        elif callable(getattr(obj, "validate_state_dict", None)):
            try:
                obj.validate_state_dict(saved)
            except ResumeError as error:
                raise type(error)(f"{where}: {error.detail or error.message}") from error
            except Exception as error:
                raise ResumeStateMismatchError(
                    f"{where}: {type(error).__name__}: {error}"
                ) from error
        else:
            _check_common_tensors(where, saved, obj.state_dict())


def check_module_state(
    where: str, saved: Any, module: torch.nn.Module, *, strict: bool = True
) -> None:
    """Raise ``ResumeStateMismatchError`` unless ``saved`` loads into ``module`` (through
    ``live_state``) without a change of key set (``strict``), shape or dtype.

    ``strict=False``: as ``load_state_dict(strict=False)``, only the tensors both hold.
    """
    _check_module(where, saved, module, strict=strict)


def check_optimizer_state(where: str, saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """Raise ``ResumeStateMismatchError`` unless ``saved`` fits ``optimizer``'s parameter groups
    and each parameter's live state (or shape)."""
    _check_optimizer(where, saved, optimizer)


def _check_module(where: str, saved: Any, module: torch.nn.Module, *, strict: bool = True) -> None:
    if not isinstance(saved, Mapping):
        raise ResumeStateMismatchError(
            f"{where}: the checkpoint holds a {type(saved).__name__}, not a state dict"
        )
    names = ModuleNames(module)
    live = {names.canonical(key): value for key, value in module.state_dict().items()}
    matched = match_names(saved, live)
    if strict:
        found = set(matched.values())
        missing = [key for key in live if key not in found]
        unexpected = [key for key in saved if key not in matched]
        if missing or unexpected:
            raise ResumeStateMismatchError(
                f"{where}: {describe_key_difference(unexpected, missing)}"
            )
    for key, target in matched.items():
        _check_tensor(f"{where}: {target!r}", saved[key], live[target])


def _check_optimizer(where: str, saved: Any, optimizer: torch.optim.Optimizer) -> None:
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    per_param = saved.get("state") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list) or not isinstance(per_param, Mapping):
        raise ResumeStateMismatchError(f"{where}: the checkpoint holds no optimizer state dict")
    live_groups = optimizer.param_groups
    if len(groups) != len(live_groups):
        raise ResumeStateMismatchError(
            f"{where}: {len(groups)} parameter groups in the checkpoint, {len(live_groups)} in "
            "this optimizer; build it with the paused run's parameter groups (and add any "
            "group the paused run added before its pause)"
        )
    for index, (group, live_group) in enumerate(zip(groups, live_groups)):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, list) or len(params) != len(live_group["params"]):
            count = len(params) if isinstance(params, list) else "no"
            raise ResumeStateMismatchError(
                f"{where}: parameter group {index} has {count} parameters in the checkpoint, "
                f"{len(live_group['params'])} in this optimizer"
            )
        _check_parameter_names(where, index, group.get("param_names"), live_group)
    # The same pairing of saved ids and live parameters Optimizer.load_state_dict makes.
    parameters = dict(
        zip(
            chain.from_iterable(g["params"] for g in groups),
            chain.from_iterable(g["params"] for g in live_groups),
        )
    )
    for param_id, entries in per_param.items():
        param = parameters.get(param_id)
        if param is None:
            raise ResumeStateMismatchError(
                f"{where}: state for parameter id {param_id!r}, which no group lists"
            )
        if not isinstance(entries, Mapping):
            continue
        live_entries = optimizer.state.get(param, {})
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor):
                continue
            label = f"{where}: state {key!r} of parameter {param_id!r}"
            live = live_entries.get(key)
            if isinstance(live, torch.Tensor):
                _check_tensor(label, value, live)
            elif not _fits_parameter(value, param):
                raise ResumeStateMismatchError(
                    f"{label} has shape {list(value.shape)}, the parameter {list(param.shape)}"
                )


def _check_parameter_names(where: str, index: int, saved: Any, live_group: Any) -> None:
    """Where both optimizers recorded their parameters' names (built from
    ``named_parameters()``), the state pairs with parameters by position only: the same
    position must hold the same parameter, or its moments load into another one."""
    live = live_group.get("param_names")
    if not isinstance(saved, list) or not isinstance(live, list) or len(saved) != len(live):
        return
    for position, (old, new) in enumerate(zip(saved, live)):
        if recorded_parameter_name(str(old)) != recorded_parameter_name(str(new)):
            raise ResumeStateMismatchError(
                f"{where}: parameter group {index}, position {position}, holds {old!r} in the "
                f"checkpoint and {new!r} in this optimizer: its state would load into another "
                "parameter; build the optimizer's groups with their parameters in the paused "
                "run's order"
            )


def _fits_parameter(value: torch.Tensor, param: torch.Tensor) -> bool:
    # Moment buffers have the parameter's shape; factored ones (Adafactor) keep its
    # dimensions with some reduced to 1. Other layouts cannot be judged without a
    # live state, so they pass.
    if is_lazy(param) or value.dim() != param.dim() or value.dim() == 0:
        return True
    return all(saved in (1, live) for saved, live in zip(value.shape, param.shape))


def _check_common_tensors(where: str, saved: Any, live: Any, path: str = "") -> None:
    if isinstance(live, torch.Tensor):
        _check_tensor(f"{where}: {path or 'state'}", saved, live)
    elif isinstance(live, Mapping) and isinstance(saved, Mapping):
        for key, value in live.items():
            if key in saved:
                _check_common_tensors(where, saved[key], value, f"{path}[{key!r}]")
    elif (
        isinstance(live, (list, tuple))
        and isinstance(saved, (list, tuple))
        and len(live) == len(saved)
    ):
        for index, (old, new) in enumerate(zip(saved, live)):
            _check_common_tensors(where, old, new, f"{path}[{index}]")


def _check_tensor(where: str, saved: Any, live: Any) -> None:
    if not isinstance(live, torch.Tensor):
        return
    if not isinstance(saved, torch.Tensor):
        raise ResumeStateMismatchError(
            f"{where} is a {type(saved).__name__} in the checkpoint, a tensor here"
        )
    # A lazy module's parameter not yet run (nn.LazyLinear): loading gives it the saved shape.
    if not is_lazy(live) and saved.shape != live.shape:
        raise ResumeStateMismatchError(
            f"{where} has shape {list(saved.shape)} in the checkpoint, {list(live.shape)} here"
        )
    if saved.dtype != live.dtype:
        raise ResumeStateMismatchError(
            f"{where} has dtype {saved.dtype} in the checkpoint, {live.dtype} here"
        )
