"""Which resume objects are sharded (DTensor parameters), paired model with optimizer.

A DTensor holds only this rank's shard of a parameter. Written into an ordinary
pause file it would be resumed on every rank from rank 0's shards: silently wrong.
So a model with DTensor parameters, and each optimizer over them, goes through
``torch.distributed.checkpoint``; a DTensor anywhere else in a pause is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UnsupportedResumeConfigurationError

__all__ = [
    "SHARDED_STATE",
    "ShardedObjects",
    "first_dtensor",
    "refuse_dtensors",
    "refuse_unreduced_gradients",
    "sharded_objects",
    "unreduced_gradient",
]

# What a rank file holds in place of a state written through torch.distributed.checkpoint.
SHARDED_STATE = {"written_by": "torch.distributed.checkpoint"}


@dataclass(frozen=True)
class ShardedObjects:
    """Sharded models by resume-object name, each with the names of its optimizers.

    Attributes:
        models: model name -> names of the optimizers over its parameters whose
            state is written through DCP (an optimizer that has not stepped yet has
            no sharded state and is paused like any other object).
    """

    models: dict[str, list[str]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Every object name whose state goes through DCP."""
        return [name for model, optimizers in self.models.items() for name in (model, *optimizers)]

    def __bool__(self) -> bool:
        return bool(self.models)


def _is_dtensor(value: Any) -> bool:
    # No DTensor exists before its module is imported: a process that never shards
    # a model does not pay for importing it (nor do builds without torch.distributed).
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def _fix() -> str:
    return (
        "return each model sharded by fully_shard / DTensor and its optimizer from "
        "_resume_objects() (they are paused through torch.distributed.checkpoint) and keep "
        "DTensors out of the regular checkpoint, extra state and other objects"
    )


def sharded_objects(objects: Mapping[str, Any]) -> ShardedObjects:
    """Find the models with DTensor parameters and pair each optimizer with its model.

    Raises:
        UnsupportedResumeConfigurationError: an optimizer holds DTensor parameters
            that are not all parameters of one sharded model among ``objects``.
    """
    models: dict[str, list[str]] = {}
    parameters: dict[str, set[int]] = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module) and any(_is_dtensor(p) for p in obj.parameters()):
            models[name] = []
            parameters[name] = {id(p) for p in obj.parameters()}
    for name, obj in objects.items():
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        params = [p for group in obj.param_groups for p in group["params"]]
        if not any(_is_dtensor(p) for p in params):
            continue
        owners = [model for model, ids in parameters.items() if all(id(p) in ids for p in params)]
        if not owners:
            raise UnsupportedResumeConfigurationError(
                f"optimizer {name!r} has DTensor parameters that are not all parameters of one "
                f"sharded model among the resume objects {sorted(models)}; {_fix()}"
            )
        # No state yet: get_state_dict would create it by taking a step, which changes
        # the run; its state_dict() holds no tensor, so the rank file takes it.
        if obj.state:
            models[owners[0]].append(name)
    for name in models:
        _check_backend(name, objects[name])
    return ShardedObjects(models)


def _check_backend(name: str, model: torch.nn.Module) -> None:
    # Written for NCCL as for gloo, but NCCL moves CUDA tensors only: say so before
    # a collective fails deep inside DCP (tested on CPU with gloo only).
    dist = torch.distributed
    if not dist.is_initialized() or "nccl" not in dist.get_backend():
        return
    devices = {p.device.type for p in model.parameters()}
    if not torch.cuda.is_available() or "cuda" not in devices:
        raise UnsupportedResumeConfigurationError(
            f"model {name!r} is sharded on {sorted(devices)} under an NCCL process group"
            f"{'' if torch.cuda.is_available() else ' without a CUDA device'}: NCCL moves CUDA "
            "tensors only; shard the model on each rank's CUDA device (torch.cuda.set_device("
            "local_rank) before init_process_group) or use gloo for a CPU model"
        )


def unreduced_gradient(objects: Mapping[str, Any], sharded: ShardedObjects) -> str | None:
    """Where a sharded model holds gradients FSDP2 has not reduce-scattered yet, else ``None``.

    With ``set_requires_gradient_sync(False)`` (FSDP2's ``no_sync``) the micro-batches'
    gradients accumulate unsharded inside FSDP2, not in the parameters' ``.grad``, so a
    pause cannot save them. Reads FSDP2's internals, checked against torch 2.13:
    ``FSDPModule._get_fsdp_state()._fsdp_param_group.fsdp_params`` and each
    ``FSDPParam``'s ``unsharded_accumulated_grad`` and ``_unsharded_param.grad``.
    """
    for name in sharded.models:
        for label, module in objects[name].named_modules():
            get_state = getattr(module, "_get_fsdp_state", None)
            if get_state is None:
                continue
            group = getattr(get_state(), "_fsdp_param_group", None)
            for param in getattr(group, "fsdp_params", ()):
                unsharded = getattr(param, "_unsharded_param", None)
                if (
                    getattr(param, "unsharded_accumulated_grad", None) is not None
                    or getattr(unsharded, "grad", None) is not None
                ):
                    return f"{name}.{label}" if label else name
    return None


def refuse_unreduced_gradients(objects: Mapping[str, Any], sharded: ShardedObjects) -> None:
    """Refuse a pause of a sharded model that holds gradients FSDP2 has not reduced.

    Raises:
        UnsupportedResumeConfigurationError: naming the module (332).
    """
    where = unreduced_gradient(objects, sharded)
    if where is not None:
        raise UnsupportedResumeConfigurationError(
            f"the sharded model {where!r} holds gradients FSDP2 has not reduce-scattered yet "
            "(set_requires_gradient_sync(False) inside a gradient-accumulation window): a pause "
            "cannot save them; keep gradient sync on for every micro-batch (the sharded "
            "gradients then add up in each parameter's .grad, which a pause saves)"
        )


def first_dtensor(value: Any, where: str) -> str | None:
    """The path (``where``, then keys) of the first DTensor in nested state, else ``None``."""
    if _is_dtensor(value):
        return where
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_dtensor(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def refuse_dtensors(state: Any, where: str) -> None:
    """Raise ``UnsupportedResumeConfigurationError`` when nested state holds a DTensor.

    Raises:
        UnsupportedResumeConfigurationError: names the first DTensor's path.
    """
    found = first_dtensor(state, where)
    if found is not None:
        raise UnsupportedResumeConfigurationError(
            f"{found} is a DTensor (a shard of a model sharded by fully_shard or DTensor): a pause "
            f"file would hold only this rank's shard and resume every rank from it; {_fix()}"
        )
