"""DistributedDataParallel's record of an open accumulation window, carried by a pause.

With ``find_unused_parameters=True`` DDP's reducer marks, in every backward, each
parameter whose gradient accumulator ran while its ``.grad`` was set (its *locally used
map*), also under ``no_sync()``. The window's synced backward all-reduces that map: a
parameter no rank marked keeps its local gradient instead of the average. A resumed
run's fresh reducer starts with the map empty, so a parameter that got its gradient only
before the pause would be treated as unused, and the ranks would continue differently
from the uninterrupted run. So:

- when training starts (the first ``@training_step``, a pause before it, ``resume()``),
  every DDP wrapper the trainer holds (a resume object, an attribute, an entry of a list,
  tuple or dict attribute, or a module inside one, e.g. under ``torch.compile``) gets a
  hook on each of its parameters' gradient accumulators, the nodes the reducer hooks, and
  a forward hook that tells synced forwards from ``no_sync`` ones. The record is the map:
  marked where the reducer marks, cleared where the reducer's synced backward ends. A
  wrapper first met at a pause is seen from its next synced backward on; a pause before
  that, while its parameters hold gradients, is refused (359);
- a pause saves each rank's record under canonical parameter names while a window is
  open (:func:`collect_windows`);
- ``resume()`` checks the record against the wrappers the trainer holds before anything
  changes (:func:`check_windows`) and, once the gradients are restored, marks the same
  parameters in the fresh reducer through the reducer's own hook
  (``Reducer._autograd_hook``, which marks exactly where ``.grad`` is set), as the
  uninterrupted run's reducer had them (:func:`restore_windows`).

``static_graph=True`` keeps no per-window map after its first iteration (torch fixes
the used set there), so there is nothing to carry; but a fresh static-graph DDP cannot
start under ``no_sync()`` (torch's reducer fails on it). A pause inside such a window
resumes exactly when the next micro-step syncs; when it runs under ``no_sync()``, its
forward refuses with :class:`~trainer_resume.errors.DDPWindowError` (359) instead.

Wrappers without unused-parameter detection (neither option) all-reduce every gradient
and need nothing; nor do those whose gradients torch reduces elsewhere (the Python
reducer of compiled autograd, ``delay_all_reduce_named_params`` for all parameters).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .._module_names import canonical_parameters
from ..errors import DDPWindowError, ResumeStateMismatchError
from ..state import DDP_WINDOW_KEY, DDPWindowState

__all__ = ["DDP_WINDOW_KEY", "check_windows", "collect_windows", "restore_windows", "watch_windows"]


class _Window:
    """What one DDP wrapper's reducer has recorded of the window it is in (see the module)."""

    def __init__(
        self, ddp: DistributedDataParallel, params: list[nn.Parameter], *, seen: bool
    ) -> None:
        self.lock = threading.Lock()  # hooks run on autograd's threads
        self.static = bool(ddp.static_graph)
        self.params = params  # in the reducer's order: its variable index is the position
        self.index = {id(param): index for index, param in enumerate(params)}
        self.used: set[int] = set()  # the reducer's locally used map (find_unused_parameters)
        self.open = False  # a backward reached a parameter since the last synced one ended
        self.expecting = False  # a synced forward ran: its backward ends in the reducer's finalize
        self.clearing = False  # the end of this synced backward is queued
        self.refusal: str | None = None  # static graph: refuse a no_sync forward (the pause file)
        # Hooked before the window began (when training started, or in resume()); one first
        # met at a pause is seen from its next synced backward on.
        self.seen = seen

    def accumulated(self, index: int) -> None:
        with self.lock:
            if self.expecting:
                if not self.clearing:
                    self.clearing = True
                    torch.autograd.Variable._execution_engine.queue_callback(self.synced)
                return
            self.open = True
            if not self.static and self.params[index].grad is not None:
                self.used.add(index)

    def synced(self) -> None:
        # The reducer's finalize_backward empties its map at the end of the synced backward.
        with self.lock:
            self.used.clear()
            self.open = self.expecting = self.clearing = False
            self.seen = True

    def forwarded(self, ddp: DistributedDataParallel) -> None:
        if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            with self.lock:
                self.expecting = True  # DDP's _post_forward called prepare_for_backward

    def before_forward(self, ddp: DistributedDataParallel) -> None:
        location = self.refusal
        if location is None or not torch.is_grad_enabled():
            return
        if ddp.require_backward_grad_sync:
            self.refusal = None
            return
        raise DDPWindowError(
            f"{location} was paused inside a gradient-accumulation window of a "
            "DistributedDataParallel(static_graph=True), and the first forward after the resume "
            "runs under no_sync(): a fresh static-graph DDP learns its graph from its first synced "
            "backward and cannot start under no_sync() (torch's reducer fails on it); resume from a "
            "pause taken at a window's end (or before its synced micro-step), or wrap the model "
            "with find_unused_parameters=True and without static_graph, whose windows resume anywhere"
        )


_WINDOWS: weakref.WeakKeyDictionary[DistributedDataParallel, _Window] = weakref.WeakKeyDictionary()
_INSTALL = threading.Lock()


def _reducer_parameters(ddp: DistributedDataParallel) -> list[nn.Parameter]:
    # DistributedDataParallel._build_params_for_reducer: the reducer's variable indices.
    ignored = ddp.parameters_to_ignore
    seen: set[int] = set()
    params = []
    for module_name, module in ddp.module.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if (
                param.requires_grad
                and f"{module_name}.{name}" not in ignored
                and id(param) not in seen
            ):
                seen.add(id(param))
                params.append(param)
    return params


def _detects_unused(ddp: DistributedDataParallel) -> bool:
    if getattr(ddp, "_use_python_reducer", False) or getattr(
        ddp, "_delay_all_reduce_all_params", False
    ):
        return False
    if getattr(ddp, "reducer", None) is None:
        return False
    return bool(ddp.static_graph or ddp.find_unused_parameters)


def _window(ddp: DistributedDataParallel, *, seen: bool = True) -> _Window:
    """The wrapper's record, its hooks installed on first use (``seen``: before a window)."""
    with _INSTALL:
        window = _WINDOWS.get(ddp)
        if window is not None:
            return window
        window = _Window(ddp, _reducer_parameters(ddp), seen=seen)
        for index, param in enumerate(window.params):
            _accumulator(param).register_hook(_accumulated_hook(window, index))
        ddp.register_forward_pre_hook(_forward_hook(window, before=True))
        ddp.register_forward_hook(_forward_hook(window, before=False))
        _WINDOWS[ddp] = window
        return window


def _accumulator(param: nn.Parameter) -> Any:
    """The parameter's gradient accumulator node (the one the reducer holds and hooks)."""
    edge = getattr(torch.autograd.graph, "get_gradient_edge", None)
    if edge is not None:
        return edge(param).node
    with torch.enable_grad():  # torch before 2.2
        return param.view_as(param).grad_fn.next_functions[0][0]


def _accumulated_hook(window: _Window, index: int) -> Any:
    # A post hook of the accumulator node: it runs where the reducer's own hook runs.
    def hook(grad_inputs: Any, grad_outputs: Any) -> None:
        window.accumulated(index)

    return hook


def _forward_hook(window: _Window, *, before: bool) -> Any:
    if before:

        def pre(ddp: DistributedDataParallel, args: Any) -> None:
            window.before_forward(ddp)

        return pre

    def post(ddp: DistributedDataParallel, args: Any, output: Any) -> None:
        window.forwarded(ddp)

    return post


def _candidates(trainer: Any) -> Iterator[Any]:
    try:
        yield from trainer._resume_objects().values()
    except Exception:  # noqa: BLE001 - the hook's own failure is reported where it is checked
        pass
    for value in vars(trainer).values():
        yield value
        if isinstance(value, (list, tuple)):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()


def _wrappers(trainer: Any) -> list[DistributedDataParallel]:
    """The DDP wrappers with unused-parameter detection that the trainer holds."""
    found: dict[int, DistributedDataParallel] = {}
    for value in _candidates(trainer):
        if not isinstance(value, nn.Module):
            continue
        for module in value.modules():
            if isinstance(module, DistributedDataParallel) and _detects_unused(module):
                found.setdefault(id(module), module)
    return list(found.values())


def watch_windows(trainer: Any) -> None:
    """Hook every DDP wrapper with unused-parameter detection that the trainer holds (once each)."""
    for ddp in _wrappers(trainer):
        _window(ddp)


def _owners(objects: Mapping[str, Any]) -> dict[int, tuple[str, str]]:
    """``id(parameter)`` -> (resume object, canonical name), for the module objects."""
    owners: dict[int, tuple[str, str]] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            for label, param in canonical_parameters(obj):
                owners.setdefault(id(param), (name, label))
    return owners


def collect_windows(trainer: Any, objects: Mapping[str, Any]) -> dict[str, DDPWindowState] | None:
    """Each module object's open DDP window (this rank's record), or ``None`` when none is open."""
    owners = _owners(objects)
    saved: dict[str, DDPWindowState] = {}
    for ddp in _wrappers(trainer):
        window = _window(ddp, seen=False)
        with window.lock:
            seen, is_open = window.seen, window.open
            used = {id(window.params[index]) for index in window.used}
        if not seen:
            _refuse_unseen(window, owners)
        if not is_open:
            continue
        for param in window.params:
            owner = owners.get(id(param))
            if owner is None:  # not saved by any resume object, nor is its gradient
                continue
            entry = saved.setdefault(owner[0], {"static_graph": window.static, "used": []})
            if id(param) in used:
                entry["used"].append(owner[1])
    for name, entry in saved.items():  # in the module's parameter order
        order = {
            label: index for index, (label, _) in enumerate(canonical_parameters(objects[name]))
        }
        entry["used"].sort(key=order.__getitem__)
    return saved or None


def _refuse_unseen(window: _Window, owners: Mapping[int, tuple[str, str]]) -> None:
    # A wrapper first met at this pause: the window its gradients may be in began unseen.
    held = sorted({owners[id(p)][0] for p in window.params if id(p) in owners})
    if held and any(p.grad is not None for p in window.params if id(p) in owners):
        raise DDPWindowError(
            f"the DistributedDataParallel wrapper of {held[0]!r} was not held by the trainer when "
            "training started, so the parameters its reducer found used in the window its "
            "gradients are in were not seen; build the wrapper and hold it in an attribute before "
            "the first @training_step (it is seen from its next synced backward on, so a pause "
            "after the window's end is exact)"
        )


def _live(
    trainer: Any, objects: Mapping[str, Any]
) -> dict[str, tuple[DistributedDataParallel, _Window]]:
    """Module object name -> the held DDP wrapper that holds its parameters."""
    owners = _owners(objects)
    live: dict[str, tuple[DistributedDataParallel, _Window]] = {}
    for ddp in _wrappers(trainer):
        window = _window(ddp)
        for param in window.params:
            owner = owners.get(id(param))
            if owner is not None:
                live.setdefault(owner[0], (ddp, window))
    return live


def check_windows(saved: Any, trainer: Any, objects: Mapping[str, Any], location: str) -> None:
    """Refuse a saved window record this trainer cannot carry on (before anything changes).

    Raises:
        ResumeStateMismatchError: the record is malformed or names what the objects lack.
        DDPWindowError: no DDP wrapper with the same setting holds the module, or the live
            wrapper's reducer has a record of its own the restored one does not cover.
    """
    saved = {} if saved is None else saved
    if not isinstance(saved, Mapping):
        raise ResumeStateMismatchError(
            f"{location}: the DDP window record is a {type(saved).__name__}, not a mapping"
        )
    live = _live(trainer, objects)
    name = type(trainer).__name__
    for key, entry in saved.items():
        obj = objects.get(key)
        if not isinstance(obj, nn.Module):
            raise ResumeStateMismatchError(
                f"{location}: the DDP window record names {key!r}, which is not a module among "
                "the resume objects"
            )
        if (
            not isinstance(entry, Mapping)
            or not isinstance(entry.get("static_graph"), bool)
            or not isinstance(entry.get("used"), list)
        ):
            raise ResumeStateMismatchError(
                f"{location}: the DDP window record of {key!r} lacks static_graph or used"
            )
        labels = {label for label, _ in canonical_parameters(obj)}
        unknown = [label for label in entry["used"] if label not in labels]
        if unknown:
            raise ResumeStateMismatchError(
                f"{location}: the DDP window record of {key!r} names parameters the module "
                f"lacks: {unknown[:3]}"
            )
        setting = "static_graph=True" if entry["static_graph"] else "find_unused_parameters=True"
        held = live.get(key)
        if held is not None and entry["used"] and not hasattr(held[0].reducer, "_autograd_hook"):
            raise DDPWindowError(
                f"{location} was paused inside a gradient-accumulation window of {key!r} wrapped by "
                f"DistributedDataParallel({setting}), and this torch {torch.__version__} has no "
                "Reducer._autograd_hook to mark the parameters its reducer found used; resume with "
                "the torch release that paused it, or from a pause at a window's end"
            )
        if held is None or held[1].static != entry["static_graph"]:
            raise DDPWindowError(
                f"{location} was paused inside a gradient-accumulation window of "
                f"{key!r} wrapped by DistributedDataParallel({setting}), whose reducer's record "
                f"of the parameters used in the window moves with the pause, but {name} holds no "
                f"such wrapper of {key!r}; wrap it the same way before resume() and hold the "
                "wrapper in an attribute (self.model = DistributedDataParallel(...)) or return it "
                "from _resume_objects()"
            )
    for key, (_, window) in live.items():
        with window.lock:
            expecting, used = window.expecting, set(window.used)
        entry = saved.get(key)
        restored = set() if entry is None else set(entry["used"])
        names = dict(_parameter_names(objects[key]))
        stale = sorted(names[id(window.params[index])] for index in used)
        if expecting or not set(stale) <= restored:
            raise DDPWindowError(
                f"{location}: {key!r} is wrapped by a DistributedDataParallel that is itself "
                "inside an accumulation window (its reducer marked "
                f"{stale[:3]} used since its last synced backward"
                + (", and a synced forward waits for its backward" if expecting else "")
                + "), a record torch gives no way to clear; resume into a trainer with a fresh "
                "DistributedDataParallel wrapper (a new process, or a new trainer)"
            )


def _parameter_names(module: nn.Module) -> Iterator[tuple[int, str]]:
    for label, param in canonical_parameters(module):
        yield id(param), label


def restore_windows(saved: Any, trainer: Any, objects: Mapping[str, Any], location: str) -> None:
    """Mark the saved used parameters in the live reducers (after :func:`check_windows`
    accepted ``saved`` and the gradients are restored)."""
    saved = {} if saved is None else saved
    for key, (ddp, window) in _live(trainer, objects).items():
        entry = saved.get(key)
        window.refusal = location if entry is not None and entry["static_graph"] else None
        if entry is None:
            continue
        params = dict(canonical_parameters(objects[key]))
        with window.lock:
            window.open = True
        for label in entry["used"]:
            index = window.index.get(id(params[label]))
            if index is None or params[label].grad is None:
                continue  # the reducer marks a parameter only where its gradient is set
            ddp.reducer._autograd_hook(index)  # marks it; it expects no hooks before a forward
            with window.lock:
                window.used.add(index)
