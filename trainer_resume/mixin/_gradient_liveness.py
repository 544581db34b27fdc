"""Which gradients are spent: what a pause of a ``spent_gradients="drop"`` trainer may drop.

A trainer initialised with ``spent_gradients="drop"`` declares that its loop never reads
a spent gradient (a read before ``zero_grad()``, a loss weighted by the last gradient
norm, leaves no trace a hook could see); the tracking below is installed by the first
such trainer of the process and tells which gradients it may then leave out.

At a step boundary a parameter's ``.grad`` is either *live* (written by a backward
after the last ``optimizer.step()`` of some optimizer that owns it: the partial sum of
an accumulation window) or *spent* (every owning optimizer has stepped on it since).
A spent gradient is restored as ``None``, which is exact when the loop sets it to
``None`` before its next backward adds to it (``zero_grad()`` first, the tutorials'
and nanoGPT's order): the resumed run then meets ``None`` where the uninterrupted run
met ``None`` too. It is not exact when the loop keeps it: a backward that adds to it
(a loop that never zeroes) or an in-place zero (``zero_grad(set_to_none=False)``:
an optimizer step then moves a parameter no backward reached with a zero gradient,
and skips it with ``None``). So a spent gradient is dropped only after the loop was
seen to set that parameter's spent gradient to ``None`` before a backward, and never
once a backward was seen to find one still there.

What is seen, and how:

- every ``optimizer.step()`` in the process (one optimizer step post hook, installed
  by :func:`track_gradients`) records, per parameter, the gradient it stepped on (a
  weak reference and its version counter) and the optimizer;
- the first backward into a parameter after such a step (a hook on the parameter,
  run before the gradient is accumulated) finds its ``.grad`` set to ``None`` with
  the spent tensor gone (``cleared``: no one can read it again), or finds a gradient
  there or the spent tensor still held elsewhere (``kept``, for good: the hook is
  then let go of at the next step, as it has nothing left to see, and put back when a
  resume restores the gradient, :func:`forget_parameters`). A weak
  reference callback would see the spent tensor freed without running at every
  backward, but not whether ``.grad`` went to ``None`` or to a new (zero) tensor:
  read from the callback of ``p.grad = None``, ``.grad`` is a slot torch has not
  cleared yet (a crash, torch 2.13). Hence the hook;
- at the pause, :func:`spent_parameters` takes the gradients that are still the
  tensor last stepped on, unchanged since (same version), stepped on by every owning
  optimizer (those seen stepping and those among the resume objects), and whose
  parameter was ``cleared`` and never ``kept``.

Anything else is live and saved: the gradient of a parameter no optimizer owns, or
of one an owning optimizer has not stepped on (also one created after the last step),
a gradient written or changed after the step (a backward, a skipped ``GradScaler``
step, ``no_sync``), one restored by a resume (:func:`forget_parameters`), those of a
parameter sharded by FSDP2 (FSDP2 writes them, where no hook sees it) and all of them
on a torch without the hooks.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer
from torch.utils.hooks import unserializable_hook

from ..sharded.detect import first_dtensor

__all__ = [
    "forget_parameters",
    "run_uncompiled",
    "spent_parameters",
    "stepping_optimizer",
    "track_gradients",
]


class _Record:
    """What was seen of one parameter's gradient.

    Written under ``_Tracker.lock``, but for its parameter's hook: that writes
    ``pending``, ``cleared`` and ``kept`` alone (see :func:`_before_accumulate_hook`).
    """

    __slots__ = ("cleared", "grad", "hook", "kept", "param", "pending", "stepped", "version")

    def __init__(self, param: torch.Tensor) -> None:
        self.param = weakref.ref(param)
        self.grad: weakref.ref[torch.Tensor] | None = None  # the gradient last stepped on
        self.version = -1  # its version counter then
        # the optimizers that stepped on it (their serials; a set shared, never changed)
        self.stepped: frozenset[int] = frozenset()
        self.pending = False  # stepped on, and no backward has reached the parameter since
        self.cleared = False  # a backward after a step found None and the spent tensor gone
        self.kept = False  # a backward after a step found a gradient (or the spent one held)
        self.hook: Any = None  # the handle of its parameter's hook, while it has one

    def forget(self) -> None:
        self.grad, self.version, self.stepped = None, -1, frozenset()
        self.pending = self.cleared = self.kept = False


class _Tracker:
    """Every optimizer step and first backward after it, per parameter, for the whole process."""

    def __init__(self) -> None:
        # Hooks run on the training thread (and autograd's device threads); a pause may
        # read from another thread.
        self.lock = threading.Lock()
        self.records: dict[int, _Record] = {}
        # id -> (the optimizer, its serial, the set holding its serial alone, shared by the
        # records it alone stepped on): a serial is never reused, where an id may be once
        # its optimizer is gone.
        self.optimizers: dict[int, tuple[weakref.ref[Any], int, frozenset[int]]] = {}
        self.handle: Any = None
        # after_step as torch.compile runs it apart (made with the hook: torch._dynamo
        # loads on first use, and importing the library does not need it).
        self.untraced_step_hook: Any = None
        self._serials = itertools.count()
        self._pruned_size = 0

    def serial(self, optimizer: Any) -> int | None:
        """The serial of an optimizer seen stepping, else ``None``."""
        entry = self.optimizers.get(id(optimizer))
        return None if entry is None or entry[0]() is not optimizer else entry[1]

    def _new_stepper(self, optimizer: Any) -> tuple[weakref.ref[Any], int, frozenset[int]]:
        serial = next(self._serials)
        entry = (weakref.ref(optimizer), serial, frozenset((serial,)))
        self.optimizers[id(optimizer)] = entry
        return entry

    def after_step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        # Runs at every optimizer step: one pass over the parameters, and for each the
        # fewest Python operations (no allocation but the weak reference to a new
        # gradient; the set of steppers is shared until a second owner steps).
        if _compiling():  # traced by torch.compile: run apart, see run_uncompiled
            return self.untraced_step_hook(optimizer, args, kwargs)  # type: ignore[no-any-return]
        with self.lock:
            entry = self.optimizers.get(id(optimizer))
            if entry is None or entry[0]() is not optimizer:
                entry = self._new_stepper(optimizer)
            _, stepper, only = entry
            records = self.records
            ref = weakref.ref
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    record = records.get(id(param))
                    if record is None or record.param() is not param:
                        record = self._record(param)
                        if record is None:
                            continue
                    if record.kept:
                        # Kept for good: its gradients are always saved, and its hook (a
                        # Python call at every backward) has nothing left to see.
                        if record.hook is not None:
                            record.hook.remove()
                            record.hook = None
                        continue
                    last = record.grad
                    if last is not None and last() is grad and record.version == grad._version:
                        if stepper not in record.stepped:  # another owner, the same gradient
                            record.stepped = record.stepped | only
                    else:
                        record.grad, record.version = ref(grad), grad._version
                        record.stepped = only
                        record.pending = True

    def _record(self, param: torch.Tensor) -> _Record | None:
        record = self.records.get(id(param))
        if record is not None and record.param() is param:
            return record
        if not param.requires_grad or first_dtensor(param, "") is not None:
            return None  # no backward reaches it, or FSDP2 writes its gradient
        record = _Record(param)
        self.records[id(param)] = record
        _watch(param, record)
        if len(self.records) > 2 * self._pruned_size + 1024:
            self._prune()
        return record

    def _prune(self) -> None:
        self.records = {key: r for key, r in self.records.items() if r.param() is not None}
        self.optimizers = {key: o for key, o in self.optimizers.items() if o[0]() is not None}
        self._pruned_size = len(self.records)


_TRACKER = _Tracker()
_INSTALL = threading.Lock()


def run_uncompiled(function: Any) -> Any:
    """``function`` run as it is by torch.compile where it would trace it: a call from code
    being traced then breaks the graph there and runs it at every call, instead of tracing
    its reads (a lock, weak references, the record's flags) into the graph once."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return function if disable is None else disable(function)


def _never_compiling() -> bool:
    return False


# The hooks run at every step (the step hook) and every backward (a parameter's hook), so
# they ask whether torch.compile is tracing them and go to their run_uncompiled form only
# then: a wrapper that leaves the compiler aside costs several times their own work per call.
# A torch without the question has them wrapped always.
_compiling: Any = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_ALWAYS_WRAPPED = _compiling is None
if _ALWAYS_WRAPPED:
    _compiling = _never_compiling


def _before_accumulate_hook(param: torch.Tensor, record: _Record) -> Any:
    """The hook that sees the first backward into ``param`` after a step, for ``record``.

    A hook on a leaf runs before its gradient is accumulated; it holds the parameter
    weakly, so the hook keeps nothing alive. It runs at every backward into the
    parameter, so it is one frame over its own record (a parameter keeps its record for
    life): nothing to do, the common case, is the compiler's question and one attribute
    read.

    It takes no lock (at the first backward after each step a lock cost about as much
    as the rest of its work): every write is one store, and whatever runs between them
    it records no more than it saw. A second hook of the same parameter that runs after
    the accumulation sees a gradient and sets ``kept``, which wins over ``cleared``; a
    step recorded meanwhile on another thread holds its gradient, so this hook sets
    ``kept`` or leaves that step's ``pending`` to the next backward. A pause reads the
    fields under the lock, each written whole.
    """
    owner = weakref.ref(param)

    def hook(grad: torch.Tensor) -> None:
        if compiling():  # traced by torch.compile: run apart, see run_uncompiled
            return untraced(grad)  # type: ignore[no-any-return]
        if not record.pending:
            return
        live = owner()
        if live is None:
            return
        record.pending = False
        spent = record.grad() if record.grad is not None else None
        if live.grad is None and spent is None:
            record.cleared = True
        else:
            record.kept = True

    compiling = _compiling
    untraced = run_uncompiled(hook)
    # Pickling the parameter leaves the hook out, and torch need not warn about it.
    return unserializable_hook(untraced if _ALWAYS_WRAPPED else hook)


def _watch(param: torch.Tensor, record: _Record) -> None:
    """Hook ``param`` for ``record`` (a parameter that takes no hook is kept: never seen,
    never dropped)."""
    try:
        record.hook = param.register_hook(_before_accumulate_hook(param, record))
    except RuntimeError:
        record.kept = True


def track_gradients() -> bool:
    """Install the process's optimizer step hook once; ``False`` where torch has none."""
    with _INSTALL:
        if _TRACKER.handle is None:
            register = getattr(torch_optimizer, "register_optimizer_step_post_hook", None)
            if register is None:
                return False
            _TRACKER.untraced_step_hook = run_uncompiled(_TRACKER.after_step)
            hook = _TRACKER.untraced_step_hook if _ALWAYS_WRAPPED else _TRACKER.after_step
            _TRACKER.handle = register(hook)
    return True


def stepping_optimizer(optimizer: Any) -> Any:
    # A wrapper (Accelerate's AcceleratedOptimizer) steps the torch optimizer it holds.
    inner = getattr(optimizer, "optimizer", None)
    while isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
        optimizer, inner = inner, getattr(inner, "optimizer", None)
    return optimizer


def spent_parameters(
    parameters: Iterable[torch.Tensor], optimizers: Iterable[Any]
) -> frozenset[int]:
    """The ``id`` of each of ``parameters`` whose gradient a pause may restore as ``None``.

    Args:
        parameters: The parameters whose gradients a pause saves.
        optimizers: The resume objects' optimizers: they own parameters too, also
            before they step.
    """
    tracker = _TRACKER
    if tracker.handle is None:
        return frozenset()
    with tracker.lock:
        candidates = [entry[0]() for entry in tracker.optimizers.values()]
        candidates += [stepping_optimizer(o) for o in optimizers]
        owners: dict[int, set[int]] = {}
        for optimizer in {id(o): o for o in candidates if o is not None}.values():
            stepper = tracker.serial(optimizer)
            for group in optimizer.param_groups:
                for param in group["params"]:
                    # An owner never seen stepping (-1) has not stepped on any gradient.
                    owners.setdefault(id(param), set()).add(-1 if stepper is None else stepper)
        spent = set()
        for param in parameters:
            grad, record = param.grad, tracker.records.get(id(param))
            if (
                grad is not None
                and record is not None
                and record.param() is param
                and record.cleared
                and not record.kept
                and record.grad is not None
                and record.grad() is grad
                and record.version == grad._version
                and owners.get(id(param))
                and owners[id(param)] <= record.stepped
            ):
                spent.add(id(param))
        return frozenset(spent)


def forget_parameters(params: Iterable[torch.Tensor]) -> None:
    """Forget what was seen of these parameters (their gradients were just restored);
    one whose hook was let go of (kept) is hooked again."""
    tracker = _TRACKER
    with tracker.lock:
        for param in params:
            record = tracker.records.get(id(param))
            if record is not None and record.param() is param:
                record.forget()
                if record.hook is None:
                    _watch(param, record)
