"""The gradients a pause carries from one step to the next (the accumulation rule).

A ``@training_step`` may be one micro-batch of a gradient-accumulation window, so a
pause, a resume point or a ``checkpoint()`` may land while ``.grad`` holds the window's
partial sum. Such gradients are part of the state that moves between steps: every
parameter of every module and optimizer among the resume objects has its ``.grad`` saved
when it is set, ``None`` otherwise, validated against the live parameters before
``resume()`` changes anything, and assigned back as part of the restore. A trainer
initialised with ``spent_gradients="drop"`` declares that its loop never reads a
gradient once every optimizer that owns it has stepped on it: such a spent gradient,
which the loop is known to set to ``None`` before its next backward, is then saved as
``None`` too (see :mod:`._gradient_liveness`). The default saves it: a loop may read the
last step's gradients before its ``zero_grad()`` (a loss weighted by the last gradient
norm), which no hook sees. With nothing to save, nothing is saved, so files written
before this rule stay resumable; restoring such a file leaves every gradient ``None``,
as the loop that wrote it would have made it before its next backward.

This is exact for every loop style (``zero_grad()`` first,
``zero_grad(set_to_none=True)`` after the optimizer step, ``zero_grad()`` at a window's
start, a loop that never zeroes), pauses at once, needs no knowledge of the window's
length and no collective under DDP: each rank saves its own gradients, also under
``no_sync``. Parameters that are DTensors (FSDP2) are left to the sharded path
(:mod:`trainer_resume.sharded`).

Saved layout, by resume-object name (see :class:`~trainer_resume.state.PauseCheckpoint`):

- a ``torch.nn.Module``: ``{parameter name: tensor or None}``, in
  ``named_parameters()`` order, under canonical names (those of the unwrapped module,
  see :mod:`trainer_resume._module_names`; a file with the wrappers' names is read too);
- a ``torch.optim.Optimizer``: ``[[tensor or None per parameter] per group]``.

Adapters (Accelerate, the HF Trainer) reuse :func:`collect_gradients`,
:func:`check_gradients` and :func:`restore_gradients` for the objects they save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from .._module_names import canonical_parameters, describe_key_difference, match_names
from ..errors import ResumeStateMismatchError
from ..state import GRADIENTS_KEY
from ._gradient_liveness import forget_parameters, spent_parameters

__all__ = [
    "GRADIENTS_KEY",
    "check_gradients",
    "collect_gradients",
    "gradient_parameters",
    "restore_gradients",
]

Copy = Callable[[Any, dict], Any]


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"


def gradient_parameters(
    objects: Mapping[str, Any], skipped: frozenset[str] | set[str] = frozenset()
) -> Iterator[tuple[str, Any, list[list[tuple[str, torch.nn.Parameter]]]]]:
    """The parameters whose gradients are saved, by object: ``(name, kind, groups)``.

    ``kind`` is ``"module"`` (one group of ``(parameter name, parameter)``) or
    ``"optimizer"`` (one group per parameter group, named by position). Objects in
    ``skipped`` (written through the sharded path) and objects holding DTensor
    parameters are left out.
    """
    for name, obj in objects.items():
        if name in skipped:
            continue
        if isinstance(obj, torch.nn.Module):
            groups = [canonical_parameters(obj)]
            kind = "module"
        elif isinstance(obj, torch.optim.Optimizer):
            groups = [
                [(str(index), param) for index, param in enumerate(group["params"])]
                for group in obj.param_groups
            ]
            kind = "optimizer"
        else:
            continue
        if any(_is_dtensor(param) for group in groups for _, param in group):
            continue
        yield name, kind, groups


def collect_gradients(
    objects: Mapping[str, Any],
    copy: Copy,
    memo: dict[Any, Any],
    *,
    skipped: frozenset[str] | set[str] = frozenset(),
    drop_spent: bool = False,
) -> dict[str, Any] | None:
    """The gradients to save, or ``None`` when no parameter's gradient is needed.

    Every gradient that is set is saved; with ``drop_spent``, one that is spent (see
    :mod:`._gradient_liveness`) is saved as ``None``.

    Args:
        objects: The resume objects (name -> object).
        copy: How tensors are copied (``to_cpu`` for a pause, the host buffers'
            copy for a resume point), called with ``memo``.
        memo: Shared with the rest of the snapshot, so a gradient met twice (a
            module and its optimizer) is saved once.
        skipped: Objects written through the sharded path.
        drop_spent: The trainer's ``spent_gradients="drop"``: the loop never reads a
            gradient once it is spent.
    """
    entries = list(gradient_parameters(objects, skipped))
    params = [param for _, _, groups in entries for group in groups for _, param in group]
    if all(param.grad is None for param in params):
        return None
    optimizers = [obj for obj in objects.values() if isinstance(obj, torch.optim.Optimizer)]
    spent = spent_parameters(params, optimizers) if drop_spent else frozenset()
    if all(param.grad is None or id(param) in spent for param in params):
        return None
    saved: dict[str, Any] = {}
    for name, kind, groups in entries:
        grads = [
            [(label, None if id(param) in spent else param.grad) for label, param in group]
            for group in groups
        ]
        copied = copy([[grad for _, grad in group] for group in grads], memo)
        if kind == "module":
            saved[name] = {label: grad for (label, _), grad in zip(grads[0], copied[0])}
        else:
            saved[name] = copied
    return saved


def check_gradients(
    saved: Any, objects: Mapping[str, Any], skipped: frozenset[str] | set[str] = frozenset()
) -> None:
    """Refuse saved gradients that do not fit the live parameters (before anything changes).

    Raises:
        ResumeStateMismatchError: an object is missing or unknown, a parameter name
            or count differs, or a gradient's shape or dtype is not its parameter's.
    """
    if saved is None:
        return
    if not isinstance(saved, Mapping):
        raise ResumeStateMismatchError(
            f"the checkpoint's gradients are a {type(saved).__name__}, not a mapping of objects"
        )
    live = {name: (kind, groups) for name, kind, groups in gradient_parameters(objects, skipped)}
    if set(saved) != set(live):
        missing, unknown = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise ResumeStateMismatchError(
            f"gradients: the checkpoint has them for {sorted(map(str, saved))}, this trainer's "
            f"modules and optimizers are {sorted(live)} (missing: {missing}, not here: {unknown})"
        )
    for name, (kind, groups) in live.items():
        where = f"gradients of object {name!r}"
        entry = saved[name]
        if kind == "module":
            names = [label for label, _ in groups[0]]
            entry = _canonical_entry(entry, names)
            if not isinstance(entry, Mapping) or list(entry) != names:
                raise ResumeStateMismatchError(
                    f"{where}: the checkpoint names other parameters than this module's"
                    + _name_difference(entry, names)
                )
            pairs = [(f"parameter {label!r}", entry[label], param) for label, param in groups[0]]
        else:
            if (
                not isinstance(entry, list)
                or len(entry) != len(groups)
                or any(
                    not isinstance(part, list) or len(part) != len(group)
                    for part, group in zip(entry, groups)
                )
            ):
                raise ResumeStateMismatchError(
                    f"{where}: the checkpoint's parameter groups differ from this optimizer's"
                )
            pairs = [
                (f"group {index} parameter {label}", part[int(label)], param)
                for index, (part, group) in enumerate(zip(entry, groups))
                for label, param in group
            ]
        for label, grad, param in pairs:
            if grad is None:
                continue
            if not isinstance(grad, torch.Tensor):
                raise ResumeStateMismatchError(
                    f"{where}: {label} is a {type(grad).__name__}, not a tensor"
                )
            # A lazy module's parameter not run yet takes the saved shape when it loads.
            shape_differs = not is_lazy(param) and grad.shape != param.shape
            if shape_differs or grad.dtype != param.dtype:
                raise ResumeStateMismatchError(
                    f"{where}: {label} has a gradient of shape {list(grad.shape)} and dtype "
                    f"{grad.dtype} in the checkpoint, the parameter "
                    f"{'(not materialized)' if is_lazy(param) else list(param.shape)} and {param.dtype}"
                )


def restore_gradients(
    saved: Mapping[str, Any] | None,
    objects: Mapping[str, Any],
    skipped: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Give every saved parameter its saved ``.grad`` (``None`` where none was saved).

    Call after :func:`check_gradients` accepted ``saved``. A gradient goes to its
    parameter's device; one tensor is never shared by two parameters.
    """
    # Saved tensor -> (parameter, its new gradient): a module and its optimizer name the
    # same parameters, and the file holds each gradient once.
    assigned: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    restored: list[torch.Tensor] = []
    for name, kind, groups in gradient_parameters(objects, skipped):
        entry = saved.get(name) if saved is not None else None
        if kind == "module":
            entry = _canonical_entry(entry, [label for label, _ in groups[0]])
        for index, group in enumerate(groups):
            for label, param in group:
                restored.append(param)
                grad = None
                if entry is not None:
                    grad = entry[label] if kind == "module" else entry[index][int(label)]
                if grad is None:
                    param.grad = None
                    continue
                previous = assigned.get(id(grad))
                if previous is not None and previous[0] is param:
                    value = previous[1]
                else:
                    value = grad.detach().to(param.device)
                    if previous is not None:  # another parameter has this tensor already
                        value = value.clone()
                    assigned.setdefault(id(grad), (param, value))
                param.grad = value
    # What the loop did to the replaced gradients says nothing of the restored ones.
    forget_parameters(restored)


def _canonical_entry(entry: Any, names: list[str]) -> Any:
    """A module's saved gradients keyed by the canonical ``names`` (an earlier release saved
    them under the wrappers' names); anything that does not match all of them as it is."""
    if not isinstance(entry, Mapping) or list(entry) == names:
        return entry
    matched = match_names(entry, set(names))
    if len(matched) != len(entry):
        return entry
    return {matched[label]: grad for label, grad in entry.items()}


def _name_difference(entry: Any, names: list[str]) -> str:
    if not isinstance(entry, Mapping):
        return ""
    saved = [str(label) for label in entry]
    difference = describe_key_difference(
        [label for label in saved if label not in names],
        [label for label in names if label not in entry],
        here="this module",
    )
    return f" ({difference})" if difference else " (the same names in another order)"
