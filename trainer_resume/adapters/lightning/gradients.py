"""The gradients a manually optimized ``LightningModule`` holds at a pause.

Under ``automatic_optimization=False`` the loop steps its optimizers itself, and may
accumulate gradients over several batches by hand; Lightning cannot tell where such
a window ends, so a pause cannot wait for it, and Lightning's checkpoint holds no
gradient. The pause saves them instead (under the parameters' canonical names, so a
compiled module resumes them too) and the resumed fit puts them back before its
first batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..._module_names import canonical_parameters
from ...errors import ResumeStateMismatchError

__all__ = ["held_gradients", "restore_gradients"]


def held_gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of every gradient ``module``'s parameters hold, by canonical name."""
    return {
        name: parameter.grad.detach().to("cpu", copy=True)
        for name, parameter in canonical_parameters(module)
        if parameter.grad is not None
    }


def restore_gradients(module: torch.nn.Module, gradients: Mapping[str, Any], source: str) -> None:
    """Put the saved gradients back (a parameter without one keeps none).

    Raises:
        ResumeStateMismatchError: a saved gradient names a parameter ``module`` lacks,
            or has another shape (330); nothing is changed then.
    """
    parameters = dict(canonical_parameters(module))
    for name, gradient in gradients.items():
        parameter = parameters.get(name)
        if parameter is None or not isinstance(gradient, torch.Tensor):
            raise ResumeStateMismatchError(
                f"{source}: the pause holds a gradient of parameter {name!r}, which this "
                "module does not have; resume with the module the paused fit trained"
            )
        if gradient.shape != parameter.shape:
            raise ResumeStateMismatchError(
                f"{source}: the saved gradient of {name!r} has shape {tuple(gradient.shape)}, "
                f"the parameter {tuple(parameter.shape)} here"
            )
    for name, parameter in parameters.items():
        saved = gradients.get(name)
        parameter.grad = (
            saved.to(device=parameter.device, dtype=parameter.dtype) if saved is not None else None
        )
