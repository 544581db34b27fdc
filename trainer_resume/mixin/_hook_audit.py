"""Forgotten hooks, found early: warnings and errors that name the missing piece.

A trainer that holds a scheduler its ``_resume_objects()`` does not return, or a
step method without ``@training_step`` while signals are armed, resumes silently
differently or never pauses. These checks look at the trainer itself:

- :func:`audit_trainer` (once, at the first step or pause): stateful attributes no
  hook returns (and torch ``DataLoader`` attributes that shuffle or stream, which a
  resume would start over, or keep persistent workers, which a resume would start
  again), and extra state without the hook that loads it; at the next step
  boundary, tensors held in attributes (directly or in dicts and lists) that changed
  and that no hook returns (:func:`warn_changed_tensors`);
- :func:`warn_if_no_step` (a watcher armed by ``pause_on_signal``): no
  ``@training_step`` call started, so a signal's request can never be written;
- :func:`warn_request_without_step`: a pause was requested (a signal, another
  thread) while no ``@training_step`` call has run yet;
- :func:`stale_iterators` / :func:`name_stale_iterators` (around ``resume()``):
  iterators over the restored loaders that ``_rebuild_resume_iterators()`` did not
  replace get an error naming that hook.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from blake3 import blake3
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from .._module_names import ModuleNames, non_persistent_buffers
from ..checks.hook_results import loader_view
from ..errors import UnsavedStateWarning

__all__ = [
    "audit_trainer",
    "name_stale_iterators",
    "stale_iterators",
    "warn_if_no_step",
    "warn_request_without_step",
]


Audit = Callable[[Any], "Audit | None"]


def audit_trainer(trainer: Any, excluded: Iterable[str], base: type) -> Audit | None:
    """Warn about state a pause would leave out (run once per trainer).

    Args:
        trainer: The trainer.
        excluded: Attribute names deliberately left out (``excluded_attributes``).
        base: ``TrainingResumeMixin``, to tell overridden hooks from the defaults.

    Returns:
        The second look, for the next step boundary: it warns about the tensors held
        by the trainer (not returned by any hook) that changed since this one.
    """
    try:
        objects = list(trainer._resume_objects().values())
        returned = list(trainer._resume_loaders().values())
        # A framework's wrapper read through a view saves the loader inside it.
        loaders = returned + [getattr(loader_view(loader), "loader", loader) for loader in returned]
    except Exception:  # noqa: BLE001 - pause() calls the same hooks and reports their errors
        return None
    covered = _reachable(objects, loaders)
    tensors = {
        id(tensor)
        for value in objects
        if isinstance(value, torch.nn.Module)
        for tensor in _tensors(value)
    }
    name = type(trainer).__name__
    skipped = set(excluded)
    for label, held in _attributes(trainer, skipped):
        if id(held) in covered or _wraps_saved_module(held, tensors):
            continue
        # A framework's wrapper around a library loader (Fabric's) is judged by the loader.
        value = getattr(loader_view(held), "loader", held)
        if value is not held and id(value) in covered:
            continue
        if _has_state(value):
            what = "has state that no hook returns: pause() does not save it and resume() does not restore it"
            fix = "return it from _resume_objects() (or _resume_loaders())"
        elif _restarts(value, covered):
            what = (
                "is a loader that no hook returns and that a resumed run starts over, "
                "in another order or from its first batch"
            )
            fix = (
                "build it as trainer_resume.loaders.ResumableDataLoader(..., resumable=True) "
                "and return it from _resume_loaders()"
            )
        elif _keeps_workers(value, covered):
            what = (
                "is a loader with persistent workers that no hook returns: their generators "
                "carry on from one pass to the next, and the main process's torch generator is "
                "drawn from (for their seed) only when they start, which a resumed run does again"
            )
            fix = "build it with persistent_workers=False (an evaluation loader)"
        else:
            continue
        covered.add(id(held))  # the same object under two names is reported once
        covered.add(id(value))
        around = "" if value is held else f" around a {type(value).__name__}"
        warnings.warn(
            f"{name}.{label} ({type(held).__name__}{around}) {what}, so a resumed run would differ; "
            f"{fix}, or name it in _initialize_training_resume(..., excluded_attributes=...) "
            "if leaving it out is intended",
            UnsavedStateWarning,
            stacklevel=4,
        )
    overrides = type(trainer)._load_resume_extra_state is not base._load_resume_extra_state
    if not overrides:
        try:
            extra = trainer._resume_extra_state()
        except Exception:  # noqa: BLE001 - reported by pause()
            extra = {}
        if extra:
            warnings.warn(
                f"{name}._resume_extra_state() returns {sorted(map(str, extra))} but {name} does not "
                "implement _load_resume_extra_state(state): resume() will refuse its pause files",
                UnsavedStateWarning,
                stacklevel=4,
            )
    before = held_tensors(trainer, skipped)
    modules = {
        key: value
        for key, value in _named_objects(trainer).items()
        if isinstance(value, torch.nn.Module)
    }
    buffers = {k: v for k, v in unsaved_buffers(modules).items() if k not in skipped}
    if not before and not buffers:
        return None

    def second_look(trainer: Any) -> None:
        warn_changed_tensors(trainer, skipped, before)
        warn_changed_buffers(name, modules, buffers)

    return second_look


def unsaved_buffers(modules: dict[str, torch.nn.Module]) -> dict[str, bytes]:
    """Digest of every buffer of the returned modules that ``state_dict()`` leaves out
    (``register_buffer(..., persistent=False)``): ``"object.buffer"`` (the buffer under
    the unwrapped module's name) -> digest."""
    found: dict[str, bytes] = {}
    for object_name, module in modules.items():
        # Named as the unwrapped module names them (a wrapper's part left out).
        names = ModuleNames(module)
        left_out = non_persistent_buffers(module)
        for buffer_name, buffer in module.named_buffers():
            if buffer_name not in left_out:
                continue
            digest = _digest(buffer)
            if digest is not None:
                found[f"{object_name}.{names.canonical(buffer_name)}"] = digest
    return found


def warn_changed_buffers(
    trainer_name: str, modules: dict[str, torch.nn.Module], before: dict[str, bytes]
) -> None:
    """Warn once about each non-persistent buffer whose content changed since ``before``."""
    for label, digest in unsaved_buffers(modules).items():
        if label in before and before[label] != digest:
            object_name, _, buffer_name = label.partition(".")
            warnings.warn(
                f"{trainer_name}._resume_objects()[{object_name!r}] has a buffer {buffer_name!r} "
                "that is not persistent (register_buffer(..., persistent=False)) and changed "
                "between steps: state_dict() leaves it out, so pause() does not save it and a "
                "resumed run would differ; register it with persistent=True, or return it from "
                "_resume_extra_state() (and restore it in _load_resume_extra_state), or name "
                f"{label!r} in _initialize_training_resume(..., excluded_attributes=...) if it "
                "is a cache that every run computes alike",
                UnsavedStateWarning,
                stacklevel=5,  # warn_changed_buffers <- second look <- @training_step <- caller
            )


def _named_objects(trainer: Any) -> dict[str, Any]:
    try:
        return dict(trainer._resume_objects())
    except Exception:  # noqa: BLE001 - reported by pause()
        return {}


# Containers walked for held tensors: a dict of EMA weights, a list of running sums.
_HELD_DEPTH = 3


def held_tensors(trainer: Any, skipped: set[str]) -> dict[str, bytes]:
    """Digest of every tensor the trainer holds in an attribute (directly or in dicts,
    lists and tuples) that no hook covers: label -> BLAKE3 digest of its bytes.

    The content is digested, not the version counter: ``t.data.copy_()`` changes a
    tensor without moving its version, and ``d["ema"] = d["ema"] * 0.9`` replaces it.
    """
    covered = _covered_tensors(trainer)
    found: dict[str, bytes] = {}
    for label, value in vars(trainer).items():
        if label in skipped or label.startswith("_training_resume"):
            continue
        for path, tensor in _tensors_in(label, value, _HELD_DEPTH):
            if id(tensor) in covered or isinstance(tensor, torch.nn.Parameter):
                continue
            digest = _digest(tensor)
            if digest is not None:
                found[path] = digest
    return found


def warn_changed_tensors(trainer: Any, skipped: set[str], before: dict[str, bytes]) -> None:
    """Warn once about each held tensor whose content changed since ``before`` was taken."""
    name = type(trainer).__name__
    after = held_tensors(trainer, skipped)
    for label, digest in after.items():
        if label in before and before[label] != digest:
            attribute = label.split("[", 1)[0]
            warnings.warn(
                f"{name}.{label} is a tensor that changed between steps and no hook returns it: "
                "pause() does not save it and resume() does not restore it, so a resumed run would "
                "differ; return it from _resume_extra_state() (and restore it in "
                f"_load_resume_extra_state), or name {attribute!r} in "
                "_initialize_training_resume(..., excluded_attributes=...) if leaving it out is "
                "intended",
                UnsavedStateWarning,
                stacklevel=5,  # warn_changed_tensors <- second look <- @training_step <- caller
            )


def _covered_tensors(trainer: Any) -> set[int]:
    # Tensors a resume restores: the objects' and loaders' states and the extra state.
    # (The regular checkpoint is saved but not restored, apart from shared keys, which
    # are resume objects.)
    covered: set[int] = set()
    sources: list[Any] = []
    for hook in ("_resume_objects", "_resume_loaders"):
        try:
            sources.extend(getattr(trainer, hook)().values())
        except Exception:  # noqa: BLE001 - reported by pause()
            pass
    try:
        sources.append(trainer._resume_extra_state())
    except Exception:  # noqa: BLE001 - reported by pause()
        pass
    for source in sources:
        if isinstance(source, torch.nn.Module):
            covered.update(id(tensor) for tensor in _tensors(source))
        elif isinstance(source, torch.optim.Optimizer):
            for state in source.state.values():
                covered.update(id(v) for v in state.values() if isinstance(v, torch.Tensor))
        else:
            covered.update(id(tensor) for _, tensor in _tensors_in("", source, _HELD_DEPTH))
    return covered


def _tensors_in(label: str, value: Any, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield label, value
    elif depth and isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors_in(f"{label}[{key!r}]", item, depth - 1)
    elif depth and isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _tensors_in(f"{label}[{index}]", item, depth - 1)


def _digest(tensor: torch.Tensor) -> bytes | None:
    try:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return blake3(flat.numpy()).digest()
    except (RuntimeError, TypeError, ValueError):  # sparse, quantized, meta: not judged
        return None


def _reachable(objects: list[Any], loaders: list[Any]) -> set[int]:
    # Objects whose state is part of a returned object's state: submodules, and what a
    # loader's position covers (its dataset, sampler and batch sampler).
    covered = {id(value) for value in objects + loaders}
    for value in objects:
        if isinstance(value, torch.nn.Module):
            covered.update(id(module) for module in value.modules())
    for loader in loaders:
        for attribute in ("dataset", "sampler", "batch_sampler"):
            part = getattr(loader, attribute, None)
            if part is not None:
                covered.add(id(part))
                covered.add(id(getattr(part, "sampler", None)))
    return covered


def _tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _wraps_saved_module(value: Any, saved_tensors: set[int]) -> bool:
    # A wrapper (DistributedDataParallel, torch.compile) around a returned module: every
    # parameter and buffer it has is saved through the module it wraps.
    if not isinstance(value, torch.nn.Module):
        return False
    own = [id(tensor) for tensor in _tensors(value)]
    return bool(own) and all(tensor in saved_tensors for tensor in own)


def _attributes(trainer: Any, skipped: set[str]) -> Iterator[tuple[str, Any]]:
    for label, value in vars(trainer).items():
        if label in skipped or label.startswith("_training_resume"):
            continue
        yield label, value
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                yield f"{label}[{index}]", item
        elif isinstance(value, dict):
            for key, item in value.items():
                yield f"{label}[{key!r}]", item


def _restarts(value: Any, covered: set[int]) -> bool:
    """A torch ``DataLoader`` without a state of its own whose position matters: it
    shuffles (its sampler draws an order), or it streams an ``IterableDataset``. One that
    reads a returned loader's dataset (a framework's wrapper around it) is saved with it."""
    if not _loader_like(value) or id(getattr(value, "dataset", None)) in covered:
        return False
    if isinstance(value.dataset, IterableDataset):
        return True
    batch_sampler = getattr(value, "batch_sampler", None)
    samplers = (getattr(value, "sampler", None), getattr(batch_sampler, "sampler", None))
    return any(_shuffles(sampler) for sampler in samplers)


def _loader_like(value: Any) -> bool:
    """A torch ``DataLoader``, or a framework's wrapper that carries its attributes
    (Fabric's copies them): its dataset and sampler say whether it restarts."""
    return isinstance(value, DataLoader) or (
        not isinstance(value, type)
        and hasattr(value, "dataset")
        and hasattr(value, "sampler")
        and hasattr(value, "batch_sampler")
        and callable(getattr(value, "__iter__", None))
    )


def _keeps_workers(value: Any, covered: set[int]) -> bool:
    """A loader without a state of its own that keeps its workers between passes: a torch
    ``DataLoader``, or a framework's wrapper with its attributes (Fabric's). Not one whose
    class says ``keyed_samples`` (``ReuseDataLoader``): its samples are built under their
    own seeds, and its workers' seeds are drawn from no global generator."""
    return (
        getattr(type(value), "keyed_samples", False) is not True
        and getattr(value, "persistent_workers", False) is True
        and isinstance(getattr(value, "num_workers", 0), int)
        and value.num_workers > 0
        and id(getattr(value, "dataset", None)) not in covered
        and not isinstance(value, type)
    )


def _shuffles(sampler: Any) -> bool:
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    return isinstance(sampler, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler))


def _has_state(value: Any) -> bool:
    if isinstance(value, type) or not (
        callable(getattr(value, "state_dict", None))
        and callable(getattr(value, "load_state_dict", None))
    ):
        return False
    try:
        state = value.state_dict()
    except Exception:  # noqa: BLE001 - an object that cannot report its state here is not judged
        return False
    try:
        return len(state) > 0
    except TypeError:
        return state is not None


def warn_if_no_step(trainer_name: str, guard: Any, landings_at_arming: int, seconds: float) -> None:
    """Warn when no ``@training_step`` call (or ``pause_if_requested``) happened since signals were armed."""
    if guard.landings != landings_at_arming:
        return
    warnings.warn(
        f"{trainer_name}: pause signals are armed (pause_on_signal) but no @training_step call has "
        f"started in {seconds:g} s: a signal only records a request, which is written when a "
        "@training_step call ends or by pause_if_requested(); decorate the training step with "
        "@training_step, or a SIGTERM will not pause this run",
        UnsavedStateWarning,
        stacklevel=2,
    )


def warn_request_without_step(trainer_name: str, how: str) -> None:
    """Warn that a pause was requested while no ``@training_step`` call has run yet."""
    warnings.warn(
        f"{trainer_name}: a pause was requested ({how}) but no @training_step call has run yet: "
        "the pause is written when a @training_step call ends, or by pause_if_requested(); if "
        "the training step is not decorated with @training_step, this run will not pause",
        UnsavedStateWarning,
        stacklevel=3,
    )


def stale_iterators(trainer: Any) -> dict[str, Any]:
    """The trainer's attributes holding a live iterator of a resumable loader."""
    return {
        label: value
        for label, value in vars(trainer).items()
        if callable(getattr(value, "invalidate", None)) and getattr(value, "alive", False) is True
    }


def name_stale_iterators(trainer: Any, before: dict[str, Any]) -> None:
    """Give iterators ``_rebuild_resume_iterators()`` left in place an error naming that hook."""
    name = type(trainer).__name__
    for label, iterator in before.items():
        # Still the same object, and no longer alive: its loader was restored under it.
        if vars(trainer).get(label) is iterator and getattr(iterator, "alive", True) is False:
            iterator.invalidate(
                f"resume() restored the loaders and {name}.{label} still holds an iterator from before; "
                f"recreate it in _rebuild_resume_iterators() (for example self.{label} = iter(loader))"
            )
