"""What a module's ``state_dict()`` leaves out and training depends on: its modes.

Which submodules are in eval mode (``module.training``), which parameters are frozen
(``requires_grad=False``) and which normalization layers do not track running statistics
(``track_running_stats=False``, as Lightning's ``BaseFinetuning`` freezes a BatchNorm).
A loop that freezes a layer or puts a BatchNorm in eval mode at some step (fine-tuning
schedules) resumed with every layer trainable and in train mode, from a fresh module, and
trained differently. A pause (of the mixin, or of the Lightning adapter) saves them under
canonical names (see :mod:`trainer_resume._module_names`), a resume checks them against
the live module before anything is loaded and sets them back; files of earlier releases
leave them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.modules.batchnorm import _NormBase

from ._module_names import ModuleNames
from .checks.pause_state import optional_entry
from .errors import CheckpointFormatError, ResumeStateMismatchError
from .state import ModuleModes

__all__ = ["MODES_KEY", "check_object_modes", "object_modes", "restore_object_modes"]

MODES_KEY = "module_modes"


def object_modes(objects: Mapping[str, Any]) -> dict[str, ModuleModes]:
    """Per module resume object: its submodules in eval mode, its frozen parameters and its
    normalization layers that track no running statistics."""
    modes: dict[str, ModuleModes] = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            names = ModuleNames(obj)
            evaluating = {
                names.prefixes.get(path, path)
                for path, module in obj.named_modules()
                if not module.training
            }
            frozen = {
                names.canonical(key)
                for key, param in obj.named_parameters()
                if not param.requires_grad
            }
            untracked = {
                names.prefixes.get(path, path)
                for path, module in obj.named_modules()
                if isinstance(module, _NormBase) and not module.track_running_stats
            }
            modes[name] = {
                "eval": sorted(evaluating),
                "frozen": sorted(frozen),
                "untracked": sorted(untracked),
            }
    return modes


def check_object_modes(checkpoint: Any, objects: Mapping[str, Any], location: str) -> None:
    """Refuse saved modes that name a submodule, parameter or normalization layer the live
    module lacks.

    Raises:
        CheckpointFormatError: the entry is malformed (321).
        ResumeStateMismatchError: a named submodule, parameter or normalization layer is
            not in the module (330).
    """
    for name, entry in optional_entry(checkpoint, MODES_KEY, location).items():
        obj = objects.get(name)
        if not isinstance(obj, torch.nn.Module):
            continue
        evaluating, frozen, untracked = _entry(entry, name, location)
        names = ModuleNames(obj)
        paths = {names.prefixes.get(path, path) for path, _ in obj.named_modules()}
        norms = {
            names.prefixes.get(path, path)
            for path, module in obj.named_modules()
            if isinstance(module, _NormBase)
        }
        parameters = {names.canonical(key) for key, _ in obj.named_parameters()}
        for path in evaluating:
            if path not in paths:
                raise ResumeStateMismatchError(
                    f"object {name!r}: submodule {path!r} was in eval mode when it paused, "
                    "and this module has no such submodule"
                )
        for path in untracked or ():
            if path not in norms:
                raise ResumeStateMismatchError(
                    f"object {name!r}: normalization layer {path!r} tracked no running "
                    "statistics when it paused, and this module has no such layer"
                )
        for key in frozen:
            if key not in parameters:
                raise ResumeStateMismatchError(
                    f"object {name!r}: parameter {key!r} was frozen (requires_grad=False) when "
                    "it paused, and this module has no such parameter"
                )


def restore_object_modes(saved: Any, objects: Mapping[str, Any]) -> None:
    """Set every module's submodules' ``training``, parameters' ``requires_grad`` and
    normalization layers' ``track_running_stats`` as saved (the last only where the file
    has them: earlier releases saved the first two)."""
    if saved is None:
        return
    for name, entry in saved.items():
        obj = objects.get(name)
        if not isinstance(obj, torch.nn.Module):
            continue
        evaluating, frozen = set(entry["eval"]), set(entry["frozen"])
        untracked = entry.get("untracked")
        stopping = set(untracked or ())
        names = ModuleNames(obj)
        modules = obj.named_modules(remove_duplicate=False)
        parameters = list(obj.named_parameters(remove_duplicate=False))
        # A module or parameter reached under several names (shared, tied) was saved under
        # its first one: it keeps its mode if any of its names has it.
        named = [(names.prefixes.get(path, path), module) for path, module in modules]
        in_eval = {id(module) for path, module in named if path in evaluating}
        stopped = {id(module) for path, module in named if path in stopping}
        held = {id(param) for key, param in parameters if names.canonical(key) in frozen}
        # Set directly, as the flags were: a module's own train() may do more than that.
        for _, module in named:
            module.training = id(module) not in in_eval
            if untracked is not None and isinstance(module, _NormBase):
                module.track_running_stats = id(module) not in stopped
        for _, param in parameters:
            param.requires_grad_(id(param) not in held)


def _entry(entry: Any, name: str, location: str) -> tuple[list[str], list[str], list[str] | None]:
    if isinstance(entry, Mapping):
        evaluating, frozen = entry.get("eval"), entry.get("frozen")
        untracked = entry.get("untracked")  # absent in earlier releases' files
        if all(
            isinstance(names, list) and all(isinstance(n, str) for n in names)
            for names in (evaluating, frozen, *([untracked] if untracked is not None else []))
        ):
            return evaluating, frozen, untracked  # type: ignore[return-value]
    raise CheckpointFormatError(f"{location}: entry {MODES_KEY!r}[{name!r}] is malformed")
