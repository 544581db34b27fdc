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
loaders adds its own fix with :func:`register_loader_hint`. :func:`check_loader`
is the one rule for a loader; later rules about loaders from elsewhere extend it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .._declarations import declared_no_random_draws
from ..errors import UnsupportedResumeConfigurationError
from .weights_only import refused_entry

__all__ = [
    "LoaderHint",
    "check_loader",
    "check_resume_loaders",
    "check_resume_objects",
    "is_library_loader",
    "register_loader_hint",
]

# Says how to make ``loader`` resumable when it is a wrapper its framework made, else None.
LoaderHint = Callable[[Any], "str | None"]

_HINTS: list[LoaderHint] = []

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
    """Refuse a resume object without ``state_dict()`` / ``load_state_dict()``.

    Raises:
        UnsupportedResumeConfigurationError: naming the object and its type (332).
    """
    for name, obj in objects.items():
        if not _has_state_methods(obj):
            raise UnsupportedResumeConfigurationError(
                f"{owner}._resume_objects() returns {name!r} ({_type_name(obj)}), which has no "
                "state_dict() and load_state_dict(), so a pause cannot save it; return objects with "
                "both (model, optimizer, scheduler, GradScaler) and keep plain values in "
                "_resume_extra_state()"
            )


def check_resume_loaders(
    loaders: Mapping[str, Any], owner: str, holders: Mapping[str, Any]
) -> None:
    """Check every loader ``_resume_loaders()`` returns (see :func:`check_loader`), and
    refuse a framework's wrapper the trainer holds over a returned loader's dataset.

    The wrapper (``accelerator.prepare(loader)``) is then what the loop iterates: the
    returned loader never moves, so its saved position would restart the epoch.

    Raises:
        UnsupportedResumeConfigurationError: as :func:`check_loader`, or naming the
            wrapper, the loader it shadows and the fix a hint gives (332).
    """
    for name, loader in loaders.items():
        check_loader(name, loader, owner, holders)
    returned = {id(loader) for loader in loaders.values()}
    for label, value in holders.items():
        hint = None if id(value) in returned else _hint(value)
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
    error = UnsupportedResumeConfigurationError(
        f"{where}, whose position cannot be saved ({reason}){wrapper}; {_hint(loader) or _FIX}"
    )
    raise error from cause


def _hint(loader: Any) -> str | None:
    return next((text for text in (hint(loader) for hint in _HINTS) if text), None)


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
