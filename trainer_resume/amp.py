"""Restore an AMP ``GradScaler`` to a step boundary, also after a failed step.

``GradScaler.load_state_dict`` restores the scale and growth tracker only. A step
that raised half-way leaves more behind: the scaler's per-optimizer records (stage
"unscaled" or with found-inf tensors, so the repeated step raises "unscale_() has
already been called" or reuses stale inf checks) and, for optimizers that do their
own scaling (``fused=True``), the ``grad_scale`` / ``found_inf`` attributes the
scaler sets on the optimizer and deletes only after a successful ``step`` (the next
step would multiply the scale into the stale one). :func:`restore_grad_scaler_state`
clears both, so training continues exactly from the restored boundary.
"""

from __future__ import annotations

import numbers
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["restore_grad_scaler_state", "validate_grad_scaler_state"]

# Keys of GradScaler.state_dict() for an enabled scaler (torch >= 1.6).
_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_FLOAT_KEYS = ("scale", "growth_factor", "backoff_factor")
_INT_KEYS = ("growth_interval", "_growth_tracker")
# Attributes GradScaler.step sets on optimizers with _step_supports_amp_scaling (torch >= 2.0).
_OPTIMIZER_TEMPORARIES = ("grad_scale", "found_inf")


def restore_grad_scaler_state(
    scaler: Any,
    state: dict[str, Any],
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
) -> None:
    """Load ``state`` into ``scaler`` and clear what an interrupted AMP step left behind.

    After this call the scaler is as it was right after the ``update()`` that
    preceded ``state_dict()``: no per-optimizer stage or found-inf records, and no
    ``grad_scale`` / ``found_inf`` attributes on ``optimizers``. Restore the model and
    optimizer states too, and zero the gradients before repeating the step (as the
    usual loop does): gradients are not part of any of these states.

    Works with ``torch.amp.GradScaler`` for any device and with
    ``torch.cuda.amp.GradScaler``.

    Args:
        scaler: The ``GradScaler`` to restore.
        state: ``scaler.state_dict()`` saved at the boundary to return to.
        optimizers: The optimizer or optimizers stepped through ``scaler``.

    Raises:
        TypeError: ``state`` is not a dict, ``scaler`` is not a GradScaler, or
            ``optimizers`` holds something other than optimizers.
        ValueError: ``state`` lacks a key or holds a value of the wrong type, or
            it was saved from an enabled scaler and ``scaler`` is disabled (or the
            reverse). Nothing is changed when an error is raised.
    """
    if not (
        callable(getattr(scaler, "load_state_dict", None))
        and callable(getattr(scaler, "is_enabled", None))
    ):
        raise TypeError(f"scaler must be a torch GradScaler, got {type(scaler).__name__}")
    optimizer_list = _optimizer_list(optimizers)
    _validate(scaler, state)

    scaler.load_state_dict(state)
    if scaler.is_enabled():
        _reset_per_optimizer_states(scaler)
    for optimizer in optimizer_list:
        for name in _OPTIMIZER_TEMPORARIES:
            if name in vars(optimizer):
                delattr(optimizer, name)


def validate_grad_scaler_state(scaler: Any, state: Any) -> None:
    """Raise what :func:`restore_grad_scaler_state` would raise for ``state``; changes nothing.

    Raises:
        TypeError: ``state`` is not a dict, or the scaler is not a torch GradScaler.
        ValueError: ``state`` lacks a key, holds a value of the wrong type, or does not
            match whether ``scaler`` is enabled.
    """
    _validate(scaler, state)


def _optimizer_list(optimizers: Any) -> list[torch.optim.Optimizer]:
    items = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers
    if not isinstance(items, Iterable):
        raise TypeError(
            f"optimizers must be an optimizer or an iterable of optimizers, got {type(optimizers).__name__}"
        )
    result = list(items)
    for item in result:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(
                f"optimizers must hold torch.optim.Optimizer instances, got {type(item).__name__}"
            )
    return result


def _validate(scaler: Any, state: Any) -> None:
    if not isinstance(state, dict):
        raise TypeError(f"GradScaler state must be a dict, got {type(state).__name__}")
    if not scaler.is_enabled():
        if state:
            raise ValueError(
                "the GradScaler state was saved from an enabled scaler but this scaler is disabled; "
                "resuming would not scale gradients as the saved run did"
            )
        return
    if getattr(scaler, "_per_optimizer_states", None) is None:
        raise TypeError(
            f"{type(scaler).__name__} has no _per_optimizer_states; only torch GradScaler (torch >= 2.1) is supported"
        )
    if not state:
        raise ValueError(
            "the GradScaler state is empty (saved from a disabled scaler) but this scaler is enabled"
        )
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"GradScaler state lacks {', '.join(missing)}")
    for key in _FLOAT_KEYS:
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"GradScaler state {key!r} must be a number, got {value!r}")
    for key in _INT_KEYS:
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"GradScaler state {key!r} must be an int, got {value!r}")


def _reset_per_optimizer_states(scaler: Any) -> None:
    records = scaler._per_optimizer_states
    # The same fresh records GradScaler.update() installs.
    factory = getattr(records, "default_factory", None) or _fresh_record_factory()
    scaler._per_optimizer_states = defaultdict(factory)


def _fresh_record_factory() -> Callable[[], dict[str, Any]]:
    try:  # torch >= 2.3
        from torch.amp.grad_scaler import _refresh_per_optimizer_state
    except ImportError:  # torch 2.1, 2.2
        from torch.cuda.amp.grad_scaler import _refresh_per_optimizer_state
    return _refresh_per_optimizer_state
