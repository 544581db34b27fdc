"""Whether a sharded model's gradients at a pause are an open window's partial sums.

FSDP2 reduce-scatters every micro-batch's gradients (with gradient sync on, the only
way a pause can save them, see sharded/detect.py): each rank's ``.grad`` is its shard of
the window's sum so far, averaged over the ranks. With as many ranks a resume puts them
back exactly. With another number the window's remaining micro-steps would add
gradients averaged over another number of ranks, and its steps count other samples, so
such a pause is refused on another world size (330), as a DDP window is (distributed.py).

A gradient holds no window when an optimizer step has applied it and it is unchanged
since (a loop that zeroes gradients at the start of its step, as torchtitan's does), or
when it is all zeros (``zero_grad(set_to_none=False)``): such pauses resume on any number
of ranks. So, once a trainer with a sharded model starts training, every optimizer step
in the process records the sharded gradients it stepped on (the tensor and its version
counters; a process-wide step post hook, which also sees optimizers made later). A pause
whose sharded models hold any other nonzero gradient marks its rank's file
(``SHARDED_WINDOW_KEY``); the resume refuses another world size if any rank's file is
marked. A resume records the gradients it restores as stepped on unless the pause was
marked, so a pause right after it says the same.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

from ..sharded.detect import ShardedObjects
from ._gradient_liveness import run_uncompiled

__all__ = ["restore_window", "watch_optimizer_steps", "window_open"]

# id(parameter) -> (the parameter, the sharded gradient an optimizer last stepped on, its
# version counters), weakly held (tensors compare elementwise: no WeakKeyDictionary).
_STEPPED: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor], Any]] = {}
_LOCK = threading.Lock()
_installed: list[Any] = []
_pruned_size = 0


def _record(param: torch.Tensor, grad: torch.Tensor) -> None:
    global _pruned_size
    _STEPPED[id(param)] = (weakref.ref(param), weakref.ref(grad), _versions(grad))
    if len(_STEPPED) > 2 * _pruned_size + 1024:  # forget parameters that are gone
        for key in [k for k, entry in _STEPPED.items() if entry[0]() is None]:
            del _STEPPED[key]
        _pruned_size = len(_STEPPED)


def _versions(grad: torch.Tensor) -> tuple[int, int]:
    # A DTensor's in-place accumulation may go to its local tensor (FSDP2) or through it.
    local = getattr(grad, "_local_tensor", None)
    return grad._version, -1 if local is None else local._version


def _after_step(optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
    with _LOCK:
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is not None and type(grad) is not torch.Tensor:  # sharded: DTensor
                    _record(param, grad)


def watch_optimizer_steps(sharded: ShardedObjects) -> None:
    """Install the process's step hook once, when a trainer with a sharded model starts."""
    if not sharded.models or _installed:
        return
    with _LOCK:
        if not _installed:
            register = torch_optimizer.register_optimizer_step_post_hook
            # Not traced into a compiled optimizer step (its graph would guard on it).
            _installed.append(register(run_uncompiled(_after_step)))


def _sharded_gradients(
    objects: Mapping[str, Any], names: Iterable[str]
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    for name in names:
        module = objects.get(name)
        if isinstance(module, torch.nn.Module):
            for param in module.parameters():
                if param.grad is not None:
                    yield param, param.grad


def window_open(objects: Mapping[str, Any], sharded: ShardedObjects) -> bool:
    """Whether this rank's sharded models hold a nonzero gradient no optimizer step applied."""
    with _LOCK:
        for param, grad in _sharded_gradients(objects, sharded.models):
            entry = _STEPPED.get(id(param))
            if (
                entry is not None
                and entry[0]() is param
                and entry[1]() is grad
                and entry[2] == _versions(grad)
            ):
                continue  # stepped on, unchanged since
            local = getattr(grad, "_local_tensor", grad)
            if bool(local.count_nonzero()):
                return True
    return False


def restore_window(objects: Mapping[str, Any], names: Iterable[str], inside: bool) -> None:
    """After a resume restored the sharded gradients: stepped on, unless inside a window."""
    if inside:
        return
    with _LOCK:
        for param, grad in _sharded_gradients(objects, names):
            _record(param, grad)
