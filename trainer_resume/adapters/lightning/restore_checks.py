"""A checkpoint checked against the LightningModule before Lightning restores anything.

Lightning 2.6 restores a fit's checkpoint in this order: the checkpoint IO's
``load_checkpoint``, the LightningModule (a strict ``load_state_dict``, which
copies every tensor whose shape matches before it complains about the others),
the callbacks' ``on_load_checkpoint``, then, after the strategy created the
optimizers and ``on_fit_start`` ran, the loops, optimizers and schedulers. A
refusal in a callback's ``on_load_checkpoint`` comes after the module changed.

So the checks run in the checkpoint IO (``PauseFileReader``, installed by
``ResumeCallback``): every tensor of the module (keys under canonical names, shapes,
dtypes, as ``strict_loading`` asks) and, since the optimizers do not exist yet with the
default strategies, the number of parameters each saved optimizer covers. The
optimizers are checked exactly once they exist (``on_fit_start``, before
Lightning loads them); should that refuse, the module is put back from the
:class:`ModuleSnapshot` taken before Lightning restored it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytorch_lightning as pl
import torch

from ...checks.state_match import check_module_state, check_optimizer_state
from ...errors import ResumeStateMismatchError

__all__ = ["ModuleSnapshot", "check_module_fits", "check_optimizers_fit"]


def check_module_fits(
    checkpoint: Mapping[str, Any], pl_module: pl.LightningModule, source: str
) -> None:
    """Refuse a checkpoint whose ``state_dict`` would not load into ``pl_module`` unchanged.

    Raises:
        ResumeStateMismatchError: no ``state_dict``, or a key, shape or dtype differs (330).
    """
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise ResumeStateMismatchError(f"{source} holds no 'state_dict' of a LightningModule")
    check_module_state(
        f"{source}: {type(pl_module).__name__}",
        state,
        pl_module,
        strict=bool(getattr(pl_module, "strict_loading", True)),
    )


def check_optimizers_fit(
    checkpoint: Mapping[str, Any],
    pl_module: pl.LightningModule,
    optimizers: Sequence[torch.optim.Optimizer],
    source: str,
) -> None:
    """Refuse saved optimizer states that do not fit: exactly against ``optimizers`` when
    they exist, else by the number of the module's parameters they cover.

    Raises:
        ResumeStateMismatchError: no ``optimizer_states`` to restore, another number
            of optimizers, or a state that does not fit its optimizer (330).
    """
    states = checkpoint.get("optimizer_states")
    if not isinstance(states, list):
        raise ResumeStateMismatchError(
            f"{source} holds no optimizer states (a weights-only checkpoint?): a fit cannot "
            "resume from it; pass it to LightningModule.load_from_checkpoint instead"
        )
    if optimizers:
        if len(states) != len(optimizers):
            raise ResumeStateMismatchError(
                f"{source} holds {len(states)} optimizer state(s), configure_optimizers "
                f"returned {len(optimizers)}"
            )
        for index, (state, optimizer) in enumerate(zip(states, optimizers)):
            check_optimizer_state(
                f"{source}: optimizer {index} ({type(optimizer).__name__})", state, optimizer
            )
        return
    parameters = sum(1 for _ in pl_module.parameters())
    for index, state in enumerate(states):
        groups = state.get("param_groups") if isinstance(state, Mapping) else None
        if not isinstance(groups, list) or not all(
            isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in groups
        ):
            raise ResumeStateMismatchError(f"{source}: optimizer {index} holds no parameter groups")
        covered = sum(len(group["params"]) for group in groups)
        if covered > parameters:
            raise ResumeStateMismatchError(
                f"{source}: optimizer {index} holds the state of {covered} parameters, "
                f"{type(pl_module).__name__} has {parameters}"
            )


class ModuleSnapshot:
    """A copy of a module's state in host memory, to put back after a late refusal."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._state = {
            key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
            for key, value in module.state_dict().items()
        }

    def restore(self, module: torch.nn.Module) -> None:
        """Copy the saved values back into ``module`` (in place, on its devices)."""
        module.load_state_dict(self._state, strict=True)
