"""Canonical module names: a module's state saved under the names of the unwrapped module.

``torch.compile`` puts ``_orig_mod.`` in front of every name of the module it compiles,
``DistributedDataParallel`` and ``DataParallel`` put ``module.``, Lightning Fabric's
``_FabricModule`` (what ``fabric.setup`` returns) puts ``_forward_module.`` in front of its
parameter names, and activation checkpointing's ``checkpoint_wrapper`` puts
``_checkpoint_wrapped_module.`` into the parameter names of the block it wraps, wherever
that block sits. A state saved under
those names would load only into a module wrapped the same way. So the library saves
module state (and gradients) under canonical names, those of the unwrapped module, as
``torch.distributed.checkpoint.state_dict.get_model_state_dict`` names them, and maps
them onto the live module however it is wrapped when it loads.

The canonical name of a live name is found by walking the live module: a path part is
left out where it is a wrapper's own attribute (a compiled module's ``_orig_mod``, a
DDP or DataParallel's ``module``, a ``_FabricModule``'s ``_forward_module`` and
``_original_module``, ``_checkpoint_wrapped_module`` anywhere), so a submodule of the
user's that happens to be called ``module`` keeps its name. Fabric's wrapper is recognised
through ``sys.modules``: this module never imports Lightning.

Files written before these names (under the wrappers' names) are read too
(:func:`match_names`): ``_orig_mod`` and ``_checkpoint_wrapped_module`` are never the
names of a user's submodules and are left out wherever they occur (so is
``_forward_module``, which gradients saved from a ``_FabricModule`` carried); a ``module.`` in
front of every name (a wrapper at the root) is left out where the names then match
more of the live module's.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "ModuleNames",
    "canonical_parameters",
    "canonical_state",
    "describe_key_difference",
    "is_module_state",
    "live_state",
    "loading_module",
    "match_names",
    "non_persistent_buffers",
    "recorded_parameter_name",
    "strip_wrapper_names",
]

_COMPILED = "_orig_mod"  # torch.compile's OptimizedModule
_PARALLEL = "module"  # DistributedDataParallel, DataParallel
_CHECKPOINTED = "_checkpoint_wrapped_module"  # checkpoint_wrapper, also inside a path
# Lightning Fabric's _FabricModule: the module it runs forward through (the model, or the
# strategy's wrapper of it) and the model itself (the same module on one device).
_FABRIC_FORWARD, _FABRIC_ORIGINAL = "_forward_module", "_original_module"
_FABRIC_WRAPPERS = "lightning_fabric.wrappers"
# Never a user's submodule name.
_ALWAYS_WRAPPERS = frozenset((_COMPILED, _CHECKPOINTED, _FABRIC_FORWARD))
_MAX_NAMED = 3  # keys listed in one message; the rest are counted


def _is_compiled(module: nn.Module) -> bool:
    # No compiled module exists before dynamo is imported: a process that never
    # compiles does not pay for importing it.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)


def _is_fabric_module(module: nn.Module) -> bool:
    # Only Fabric's own code makes one, so it is imported already where one exists.
    wrappers = sys.modules.get(_FABRIC_WRAPPERS)
    fabric_module = getattr(wrappers, "_FabricModule", None)
    return isinstance(fabric_module, type) and isinstance(module, fabric_module)


def _holds_state(module: nn.Module) -> bool:
    """Whether ``module`` has parameters or buffers of its own (not its submodules')."""
    return any(value is not None for value in module._parameters.values()) or any(
        value is not None for value in module._buffers.values()
    )


def _wrapped_attribute(parent: nn.Module, child: str) -> bool:
    """Whether ``parent``'s submodule ``child`` is a wrapper's wrapped module (no name of its own).

    A wrapper with state of its own (a subclass adding a parameter) is part of the model:
    its names are kept, so its state neither collides with the model's nor goes missing.
    """
    if child == _CHECKPOINTED:
        return True
    if _holds_state(parent):
        return False
    if child == _PARALLEL:
        return isinstance(parent, (nn.parallel.DistributedDataParallel, nn.DataParallel))
    if child in (_FABRIC_FORWARD, _FABRIC_ORIGINAL):
        return _is_fabric_module(parent)
    return child == _COMPILED and _is_compiled(parent)


class ModuleNames:
    """The canonical name of every live name of one module's state and parameters."""

    def __init__(self, module: nn.Module) -> None:
        # Live path of every submodule -> its canonical path, walked as state_dict()
        # walks (every path of a shared submodule, not only the first). A key's path is
        # a live path, or the path state_dict() gives it where a wrapper leaves its own
        # part out of the keys below it (checkpoint_wrapper's hook; a _FabricModule's
        # state_dict(), which is its original module's, also under a compiled module).
        prefixes = {"": ""}
        keyed: dict[str, str] = {}
        # (module, live path, canonical path, key path: None where no state key is below)
        stack: list[tuple[nn.Module, str, str, str | None]] = [(module, "", "", "")]
        while stack:
            parent, live, canonical, key = stack.pop()
            fabric = _is_fabric_module(parent)
            for name, child in parent._modules.items():
                if child is None:
                    continue
                child_live = f"{live}.{name}" if live else name
                if _wrapped_attribute(parent, name):
                    child_canonical = canonical
                else:
                    child_canonical = f"{canonical}.{name}" if canonical else name
                child_key: str | None
                if key is None or (fabric and name == _FABRIC_FORWARD):
                    child_key = None  # a _FabricModule's state is its original module's
                elif name == _CHECKPOINTED or (fabric and name == _FABRIC_ORIGINAL):
                    child_key = key
                else:
                    child_key = f"{key}.{name}" if key else name
                prefixes[child_live] = child_canonical
                if child_key is not None:
                    keyed.setdefault(child_key, child_canonical)
                stack.append((child, child_live, child_canonical, child_key))
        # State keys carry key paths; a live path spelt the same (a Fabric module's own
        # _original_module beside the model's submodule of that name) never names a
        # parameter (named_parameters() lists each once, under _forward_module).
        prefixes.update(keyed)
        self.prefixes = prefixes
        self.wrapped = any(live != canonical for live, canonical in prefixes.items())

    def canonical(self, name: str) -> str:
        """The canonical name of a live state or parameter name (unknown paths as they are)."""
        if not self.wrapped:
            return name
        head, _, leaf = name.rpartition(".")
        prefix = self.prefixes.get(head)
        if prefix is not None:
            return f"{prefix}.{leaf}" if prefix else leaf
        # A path no submodule has (a state_dict hook renamed it): its longest known start
        # is renamed, the rest kept.
        rest = [leaf]
        while head:
            head, _, part = head.rpartition(".")
            rest.insert(0, part)
            prefix = self.prefixes.get(head)
            if prefix is not None:
                return ".".join([prefix, *rest] if prefix else rest)
        return name


def loading_module(module: nn.Module) -> nn.Module:
    """The module a saved state is loaded into: ``module`` without the wrappers at its root
    (compiled, DDP or DataParallel, Fabric's), which hold the same parameters and buffers
    (a wrapper with state of its own is kept: its state is part of the saved one).

    ``load_state_dict`` of a compiled ``_FabricModule`` fails on its own state (it walks the
    wrapper's submodules, where ``state_dict()`` gave the original module's names); the
    unwrapped module loads the same state under fewer names in every case.
    """
    while not _holds_state(module):
        if _is_compiled(module):
            inner = module._orig_mod
        elif isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            inner = module.module
        elif _is_fabric_module(module):
            inner = module._original_module
        else:
            return module
        if not isinstance(inner, nn.Module):
            return module
        module = inner
    return module


def canonical_state(module: nn.Module, state: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """``module.state_dict()`` (or ``state``, keyed as it) under canonical names.

    The state's ``_metadata`` (each submodule's version) is renamed too, the wrapped
    module's entry taking its wrapper's place. Returned as it is when nothing wraps.
    """
    if state is None:
        state = module.state_dict()
    names = ModuleNames(module)
    if not names.wrapped:
        return state
    renamed: Any = OrderedDict((names.canonical(key), value) for key, value in state.items())
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        renamed._metadata = OrderedDict(
            # Parents come before their children: the wrapped module's entry wins.
            (names.prefixes.get(prefix, prefix), value)
            for prefix, value in metadata.items()
        )
    return renamed


def canonical_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``module.named_parameters()`` (same order) under canonical names."""
    names = ModuleNames(module)
    return [(names.canonical(name), param) for name, param in module.named_parameters()]


def _without_wrappers(name: str) -> str:
    parts = name.split(".")
    kept = [part for part in parts if part not in _ALWAYS_WRAPPERS]
    return name if len(kept) == len(parts) else ".".join(kept)


def non_persistent_buffers(module: nn.Module) -> set[str]:
    """The live names (as ``named_buffers()`` gives them) of the buffers ``state_dict()``
    leaves out (``register_buffer(..., persistent=False)``), read without calling it."""
    return {
        f"{path}.{name}" if path else name
        for path, submodule in module.named_modules()
        for name in submodule._non_persistent_buffers_set
        if submodule._buffers.get(name) is not None
    }


def recorded_parameter_name(name: str) -> str:
    """A parameter name an optimizer recorded (``param_names``, from ``named_parameters()``
    of the module as the loop held it) without wrapper parts: compiled, checkpoint-wrapped,
    Fabric's, and a root ``module.`` (DDP), so a run paused wrapped matches one resumed
    unwrapped."""
    name = _without_wrappers(name)
    unrooted = _unrooted(name)
    return name if unrooted is None else unrooted


def _unrooted(name: str) -> str | None:
    if name == _PARALLEL:
        return ""
    return name[len(_PARALLEL) + 1 :] if name.startswith(f"{_PARALLEL}.") else None


def _earlier_names(
    saved: list[str], targets: Mapping[str, Any] | set[str]
) -> tuple[dict[str, str], bool]:
    """Saved names as an earlier release wrote them, read as canonical names; and whether a
    root ``module.`` was left out."""
    read = {name: _without_wrappers(name) for name in saved}
    unrooted = {name: _unrooted(value) for name, value in read.items()}
    if saved and all(value is not None for value in unrooted.values()):
        found = sum(value in targets for value in read.values())
        if sum(value in targets for value in unrooted.values()) > found:
            return {name: value for name, value in unrooted.items() if value is not None}, True
    return read, False


def match_names(saved: Iterable[str], targets: Mapping[str, Any] | set[str]) -> dict[str, str]:
    """Saved name -> the canonical name in ``targets`` it stands for, for every one that has one.

    A saved name that is a target stands for itself (files written with canonical
    names); otherwise it is read as an earlier release wrote it (see the module's
    docstring). Two saved names never stand for the same target.
    """
    names = list(saved)
    if all(name in targets for name in names):
        return {name: name for name in names}
    read, _ = _earlier_names(names, targets)
    matched: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        if name in targets and name not in taken:
            matched[name] = name
            taken.add(name)
    for name in names:
        target = read[name]
        if name not in matched and target in targets and target not in taken:
            matched[name] = target
            taken.add(target)
    return matched


def live_state(saved: Mapping[str, Any], module: nn.Module) -> Mapping[str, Any]:
    """A saved module state keyed by ``module``'s live names, for ``module.load_state_dict``.

    ``saved`` holds canonical names, or the wrappers' names of an earlier release.
    Names that match nothing stay as they are (``load_state_dict`` then names them,
    ``strict=False`` leaves them out). Returned as it is when nothing needs renaming.
    """
    names = ModuleNames(module)
    live_keys = list(module.state_dict())
    by_canonical = {names.canonical(key): key for key in live_keys}
    keys = list(saved)
    matched = match_names(keys, by_canonical)
    renamed_keys = [by_canonical[matched[key]] if key in matched else key for key in keys]
    if renamed_keys == keys:
        return saved
    renamed: Any = OrderedDict(zip(renamed_keys, saved.values()))
    metadata = getattr(saved, "_metadata", None)
    if metadata is not None:
        renamed._metadata = _live_metadata(metadata, names, keys, by_canonical)
    return renamed


def _live_metadata(
    metadata: Mapping[str, Any],
    names: ModuleNames,
    keys: list[str],
    by_canonical: Mapping[str, str],
) -> OrderedDict[str, Any]:
    # The saved prefixes read as the keys were (an earlier release's root `module.`
    # is left out of both), then handed to every live path with that canonical path.
    _, unrooted = _earlier_names(keys, by_canonical)
    canonical: dict[str, Any] = {}
    for prefix, value in metadata.items():
        read: str | None = _without_wrappers(prefix)
        if unrooted:
            read = _unrooted(read) if read else None  # the root wrapper's own entry
        if read is not None:
            canonical[read] = value
    return OrderedDict(
        (live, canonical[path]) for live, path in names.prefixes.items() if path in canonical
    )


def strip_wrapper_names(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A module state with ``_orig_mod`` and ``_checkpoint_wrapped_module`` left out of every
    name, without the module (an export): a ``module.`` may be a submodule's own name, so it stays."""
    keys = [_without_wrappers(str(key)) for key in state]
    if keys == list(state) or len(set(keys)) != len(keys):
        return state
    renamed: Any = OrderedDict(zip(keys, state.values()))
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        renamed._metadata = OrderedDict(
            (_without_wrappers(prefix), value) for prefix, value in metadata.items()
        )
    return renamed


def is_module_state(state: Any) -> bool:
    """Whether ``state`` looks like a module's ``state_dict``: a non-empty flat mapping of
    names to tensors (an optimizer's, a scheduler's or a GradScaler's holds other values)."""
    return (
        isinstance(state, Mapping)
        and bool(state)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    )


def describe_key_difference(
    checkpoint_only: list[str], live_only: list[str], *, here: str = "this model"
) -> str:
    """The names only one side has, the first of each side by side, and where one is the
    other under a prefix, that prefix (for a refusal's detail)."""
    parts = []
    if live_only:
        parts.append(f"missing from the checkpoint: {_listed(live_only)}")
    if checkpoint_only:
        parts.append(f"not in {here}: {_listed(checkpoint_only)}")
    if checkpoint_only and live_only:
        saved, live = checkpoint_only[0], live_only[0]
        parts.append(
            f"first differing keys: {saved!r} in the checkpoint, {live!r} in {here}"
            + _prefix_note(saved, live, checkpoint_only, live_only, here)
        )
    return "; ".join(parts)


def _prefix_note(
    saved: str, live: str, checkpoint_only: list[str], live_only: list[str], here: str
) -> str:
    if live.endswith(f".{saved}"):
        prefix, longer, shorter, side = live[: -len(saved)], live_only, checkpoint_only, here
    elif saved.endswith(f".{live}"):
        prefix, longer, shorter, side = (
            saved[: -len(live)],
            checkpoint_only,
            live_only,
            "the checkpoint",
        )
    elif live.startswith(saved) or saved.startswith(live):
        return " (one is the start of the other)"
    else:
        return ""
    every = len(longer) == len(shorter) and {
        name[len(prefix) :] for name in longer if name.startswith(prefix)
    } == set(shorter)
    scope = "every differing key" if every else "the first differing key"
    return (
        f" ({scope} has the prefix {prefix!r} more in {side}: a module of your own wraps "
        "the model on one side only; wrap it as it was when the pause was written)"
    )


def _listed(keys: list[str]) -> str:
    shown = ", ".join(repr(key) for key in keys[:_MAX_NAMED])
    return shown if len(keys) <= _MAX_NAMED else f"{shown} and {len(keys) - _MAX_NAMED} more"
