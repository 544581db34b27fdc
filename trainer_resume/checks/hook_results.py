"""What a trainer's hooks return, checked when training starts (first step, or ``resume()``).

A resume object or loader that cannot save its state would otherwise fail at the
worst moment: inside the pause (no pause file), or inside ``resume()`` (a pause
file that cannot be resumed), with another library's raw exception. So every
object ``_resume_objects()`` returns must have ``state_dict()`` and
``load_state_dict()``, and every loader ``_resume_loaders()`` returns is one of:

- the library's own (``ResumableDataLoader``: it also has ``validate_state_dict``,
  so ``resume()`` checks its state before anything changes);
- a loader from elsewhere with ``state_dict()`` / ``load_state_dict()`` (torchdata's
  ``Stateful`` protocol, e.g. ``StatefulDataLoader``, or a streaming library's own
  loader) that the user declared with ``declare_no_random_draws`` (its samples draw
  no random numbers: its protocol saves the position, not what its workers draw; see
  ``_declarations``), whose state must read back through
  ``torch.load(weights_only=True)``; ``resume()`` restores such loaders before
  anything else, so one that rejects its state leaves the trainer as it was.

Anything else is refused with ``UnsupportedResumeConfigurationError`` (332) naming
the object, its type, the wrapper that replaced a resumable loader (when the
trainer still holds that loader) and the fix. An adapter whose framework wraps
loaders adds its own fix with :func:`register_loader_hint`; one whose framework wraps
a library loader without changing its batches (Lightning Fabric's
``setup_dataloaders``) has the wrapper read through the loader it wraps with
:func:`register_loader_view`, and the library works with the returned loaders as
:func:`resume_loaders` gives them. A framework's wrapper met before its adapter was
imported is refused with the import as the fix. :func:`check_loader` is the one rule
for a loader; later rules about loaders from elsewhere extend it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .._declarations import declared_no_random_draws
from ..errors import UnsupportedResumeConfigurationError
from .weights_only import refused_entry

__all__ = [
    "LoaderHint",
    "LoaderView",
    "ObjectsCheck",
    "check_loader",
    "check_resume_loaders",
    "check_resume_objects",
    "is_library_loader",
    "loader_view",
    "register_loader_hint",
    "register_loader_view",
    "register_objects_check",
    "resume_loaders",
]

# Says how to make ``loader`` resumable when it is a wrapper its framework made, else None.
LoaderHint = Callable[[Any], "str | None"]
# ``loader`` read through the library loader it wraps (an object with that loader's
# methods), when it is a wrapper its framework made around one, else None.
LoaderView = Callable[[Any], Any]
# What is wrong with the resume objects as a whole (an object of a framework returned
# without another one its state depends on), as the end of a refusal, else None.
ObjectsCheck = Callable[[Mapping[str, Any]], "str | None"]

_HINTS: list[LoaderHint] = []
_VIEWS: list[LoaderView] = []
_OBJECTS_CHECKS: list[ObjectsCheck] = []

# Frameworks whose loader wrappers an adapter reads (or names the fix for), by the
# wrapper's top-level package: a wrapper met before the adapter is imported names it.
_ADAPTERS = {
    "accelerate": "trainer_resume.adapters.accelerate",
    "lightning_fabric": "trainer_resume.adapters.fabric",
}

_FIX = (
    "return a trainer_resume.loaders.ResumableDataLoader(..., resumable=True) (the DataLoader "
    "drop-in), or a loader with state_dict() and load_state_dict() (torchdata's Stateful "
    "protocol, e.g. torchdata.stateful_dataloader.StatefulDataLoader) declared with "
    "trainer_resume.declare_no_random_draws(loader) if its samples draw no random numbers"
)


def register_loader_hint(hint: LoaderHint) -> None:
    """Add a fix to the refusal of a loader whose position cannot be saved.

    ``hint(loader)`` returns the sentence that names the fix for a loader its
    framework made (``"this is accelerate's DataLoaderShard; use
    trainer_resume.adapters.accelerate.prepare_loader"``), or ``None`` for any other
    loader. The first hint that answers replaces the general fix. A loader a hint
    answers for is refused even when it has ``state_dict()`` / ``load_state_dict()``:
    the adapter knows its framework's state does not bring it back to the same samples.
    Registering the same function twice has no effect.
    """
    if not callable(hint):
        raise TypeError(f"a loader hint must be callable, got {type(hint).__name__}")
    if hint not in _HINTS:
        _HINTS.append(hint)


def register_loader_view(view: LoaderView) -> None:
    """Have a framework's loader wrapper read through the library loader it wraps.

    ``view(loader)`` returns, for a wrapper its framework made around a library loader
    that it iterates without changing the batches (other than moving them to a device),
    an object with that loader's ``state_dict()``, ``validate_state_dict()``,
    ``load_state_dict()`` and ``epoch_ended``, and ``loader``, the loader inside; ``None``
    for any other loader. The first view that answers is used wherever the library
    reads the loaders ``_resume_loaders()`` returns (:func:`resume_loaders`). Where the
    wrapper keeps part of the position itself, the view's ``wrapper_keeps`` says what
    (else it is empty or absent), and returning the loader inside instead of the
    wrapper is refused. Registering the same function twice has no effect.
    """
    if not callable(view):
        raise TypeError(f"a loader view must be callable, got {type(view).__name__}")
    if view not in _VIEWS:
        _VIEWS.append(view)


def register_objects_check(check: ObjectsCheck) -> None:
    """Add a check of everything ``_resume_objects()`` returns, run when training starts.

    ``check(objects)`` returns what is wrong, completing ``"<Trainer>._resume_objects() "``
    (``"returns 'model', set up by ..., but not its GradScaler; return it too"``), or
    ``None``; the first answer is refused (332). For adapters whose framework keeps part
    of an object's state elsewhere. Registering the same function twice has no effect.
    """
    if not callable(check):
        raise TypeError(f"an objects check must be callable, got {type(check).__name__}")
    if check not in _OBJECTS_CHECKS:
        _OBJECTS_CHECKS.append(check)


def loader_view(loader: Any) -> Any:
    """``loader`` as the library reads it: a registered view of a framework's wrapper, else itself."""
    for view in _VIEWS:
        seen = view(loader)
        if seen is not None:
            return seen
    return loader


def resume_loaders(trainer: Any) -> Mapping[str, Any]:
    """What ``trainer._resume_loaders()`` returns, each loader as :func:`loader_view` reads it.

    The one way the library reads a trainer's loaders: its checks, the step
    boundaries, pauses and resumes all see a framework's wrapper as its view.
    """
    loaders = trainer._resume_loaders()
    if not _VIEWS:
        return loaders
    return {name: loader_view(loader) for name, loader in loaders.items()}


def is_library_loader(loader: Any) -> bool:
    """A loader of this library: it checks a state before loading it (``validate_state_dict``)."""
    return callable(getattr(loader, "validate_state_dict", None))


def _has_state_methods(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def check_resume_objects(objects: Mapping[str, Any], owner: str) -> None:
    """Refuse a resume object without ``state_dict()`` / ``load_state_dict()``, and objects
    a registered check refuses (:func:`register_objects_check`).

    Raises:
        UnsupportedResumeConfigurationError: naming the object and its type, or what the
            check found (332).
    """
    for name, obj in objects.items():
        if not _has_state_methods(obj):
            raise UnsupportedResumeConfigurationError(
                f"{owner}._resume_objects() returns {name!r} ({_type_name(obj)}), which has no "
                "state_dict() and load_state_dict(), so a pause cannot save it; return objects with "
                "both (model, optimizer, scheduler, GradScaler) and keep plain values in "
                "_resume_extra_state()"
            )
    for check in _OBJECTS_CHECKS:
        problem = check(objects)
        if problem:
            raise UnsupportedResumeConfigurationError(f"{owner}._resume_objects() {problem}")


def check_resume_loaders(
    loaders: Mapping[str, Any], owner: str, holders: Mapping[str, Any]
) -> None:
    """Check every loader ``_resume_loaders()`` returns (see :func:`check_loader`), and
    refuse a framework's wrapper the trainer holds over a returned loader's dataset.

    The wrapper (``accelerator.prepare(loader)``) is then what the loop iterates: the
    returned loader never moves, so its saved position would restart the epoch. A
    wrapper read through a view whose loader inside is returned instead is refused too
    where the wrapper keeps part of the position (the view's ``wrapper_keeps``).

    Raises:
        UnsupportedResumeConfigurationError: as :func:`check_loader`, or naming the
            wrapper, the loader it shadows and the fix (332).
    """
    for name, loader in loaders.items():
        check_loader(name, loader, owner, holders)
    returned = {id(loader) for loader in loaders.values()}
    for label, value in holders.items():
        if id(value) in returned:
            continue
        _refuse_inner_loader(label, value, loaders, owner)
        hint = _hint(value)
        if hint is None:
            continue
        dataset = getattr(value, "dataset", None)
        for name, loader in loaders.items():
            if dataset is not None and getattr(loader, "dataset", None) is dataset:
                raise UnsupportedResumeConfigurationError(
                    f"{owner}.{label} ({_type_name(value)}) reads the dataset of the loader "
                    f"{name!r} that {owner}._resume_loaders() returns: the loop's batches come from "
                    f"the wrapper, whose position is not saved, and {name!r} never moves; {hint}"
                )


def _refuse_inner_loader(label: str, value: Any, loaders: Mapping[str, Any], owner: str) -> None:
    seen = loader_view(value)
    keeps = getattr(seen, "wrapper_keeps", None) if seen is not value else None
    if not keeps:
        return
    for name, loader in loaders.items():
        if loader is getattr(seen, "loader", None):
            raise UnsupportedResumeConfigurationError(
                f"{owner}.{label} ({_type_name(value)}) is the loader the loop iterates, and "
                f"{name!r} that {owner}._resume_loaders() returns is the loader inside it: "
                f"{keeps}; return {owner}.{label} itself"
            )


def check_loader(name: str, loader: Any, owner: str, holders: Mapping[str, Any]) -> None:
    """Refuse a loader a pause could not save, or whose state could not be read back.

    Args:
        name: The loader's name in ``_resume_loaders()``.
        loader: The loader.
        owner: The trainer's class name, for the message.
        holders: The trainer's attributes (``vars(trainer)``): a library loader held
            there over the same dataset names the one this loader replaced.

    Raises:
        UnsupportedResumeConfigurationError: the loader has no state, its
            ``state_dict()`` fails, it is a loader from elsewhere not declared with
            ``declare_no_random_draws``, or its state holds a value weights-only loading
            refuses (332).
    """
    where = f"{owner}._resume_loaders() returns {name!r} ({_type_name(loader)})"
    if not _has_state_methods(loader):
        _refuse_stateless(where, "it has no state_dict() and load_state_dict()", loader, holders)
    try:
        state = loader.state_dict()
    except Exception as error:  # noqa: BLE001 - any failure here would be the pause's
        reason = f"its state_dict() raised {type(error).__name__}: {error}"
        _refuse_stateless(where, reason, loader, holders, error)
    if is_library_loader(loader):
        return  # its state is plain data by construction, and resume() validates it
    if _hint(loader) is not None:
        # A wrapper whose own state resumes other samples (accelerate's DataLoaderShard
        # over a StatefulDataLoader): its adapter's fix, not a silently different resume.
        reason = "the state its framework gives it does not bring back the same samples"
        _refuse_stateless(where, reason, loader, holders)
    if not declared_no_random_draws(loader):
        raise UnsupportedResumeConfigurationError(
            f"{where}, a loader from elsewhere: its state_dict() and load_state_dict() save its "
            "position, but not the random numbers its samples draw (its workers are reseeded at "
            "each iter()), so a resume would differ wherever a sample draws one (a random "
            "augmentation); return a trainer_resume.loaders.ResumableDataLoader(..., "
            "resumable=True) (the DataLoader drop-in, which replays them), or, if its samples "
            "draw no random numbers, declare it with trainer_resume.declare_no_random_draws("
            "loader)"
        )
    problem = refused_entry(state, "its state_dict()")
    if problem is not None:
        raise UnsupportedResumeConfigurationError(
            f"{where}, whose state cannot be read back by torch.load(weights_only=True) ({problem}), "
            "so its pause file could not be resumed; give the loader a state of tensors, numbers, "
            f"str, None, lists and dicts, or {_FIX}"
        )


def _refuse_stateless(
    where: str,
    reason: str,
    loader: Any,
    holders: Mapping[str, Any],
    cause: BaseException | None = None,
) -> None:
    replaced = _replaced_loader(loader, holders)
    wrapper = (
        f"; it replaced the resumable loader {replaced[0]} ({type(replaced[1]).__name__}) "
        "by its own wrapper"
        if replaced is not None
        else ""
    )
    fix = _hint(loader) or _adapter_fix(loader) or _FIX
    error = UnsupportedResumeConfigurationError(
        f"{where}, whose position cannot be saved ({reason}){wrapper}; {fix}"
    )
    raise error from cause


def _hint(loader: Any) -> str | None:
    return next((text for text in (hint(loader) for hint in _HINTS) if text), None)


def _adapter_fix(loader: Any) -> str | None:
    package = type(loader).__module__.partition(".")[0]
    adapter = _ADAPTERS.get(package)
    if adapter is None or adapter in sys.modules:
        return None
    return (
        f"it is {package}'s own loader: import {adapter} before training starts, which accepts "
        f"what it can resume of {package}'s loaders and names the fix for the rest"
    )


def _replaced_loader(loader: Any, holders: Mapping[str, Any]) -> tuple[str, Any] | None:
    # A library loader the foreign one wraps, or one the trainer holds over the same dataset.
    for label, value in _attributes(loader, depth=2):
        if is_library_loader(value):
            return f"{type(loader).__name__}.{label}", value
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return None
    for label, value in holders.items():
        if (
            value is not loader
            and is_library_loader(value)
            and getattr(value, "dataset", None) is dataset
        ):
            return f"self.{label}", value
    return None


def _attributes(value: Any, depth: int, prefix: str = "") -> Iterator[tuple[str, Any]]:
    try:
        items: Iterable[tuple[str, Any]] = list(vars(value).items())
    except TypeError:  # no __dict__
        return
    for label, item in items:
        yield prefix + label, item
        if depth > 1 and not isinstance(item, (str, bytes, int, float)):
            yield from _attributes(item, depth - 1, f"{prefix}{label}.")
