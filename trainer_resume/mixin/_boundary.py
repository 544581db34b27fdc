"""The last step boundary: where a pause takes the loader positions from.

A training loop often fetches the next batch outside the step
(``trainer.step(next(batches))``), and a pause may come from another thread at
any moment. Read live, such a pause would count a batch fetched after the last
step as delivered, and it would never be trained on after the resume. So the
loader positions are recorded at every boundary, at the end of
``_initialize_training_resume()`` (the boundary before the first step), of every
outermost ``@training_step`` and of ``resume()``, and a pause saves those: a batch
delivered after the boundary is delivered again after the resume. An epoch the loop
left part-way after the boundary (``loader.end_epoch()``, a new ``iter(loader)``)
delivered nothing, so a pause built after that holds the next epoch's start; states
built for an earlier pause or point at the boundary are built again
(``state.deferred_revision()``).

The main-process RNG is read at the pause itself: a resumable loader's fetch
leaves the generators as it found them, and a capture never sees the middle of a
fetch (``random_state`` waits for any ``rng_scope`` in progress). Objects, extra
state and the step count change only inside steps and serialized calls, under the
training lock, so they are read live too. Recording is cheap: a
``ResumableDataLoader`` records its delivered position (``deferred_state_dict()``:
integers and references to what its delivered batches left), and its state is built
only when a pause or resume point is taken at that boundary; a loader from elsewhere
has its ``state_dict()`` copied at every boundary.

A boundary also records whether a returned loader delivered its epoch's last batch
in the step that just ended. A loop's epoch-end work (``scheduler.step()``,
validation) runs after that step and before the next one, and a pause written at
this boundary would resume at the next epoch without it; so the mixin lands a
pause or resume point requested here at the next boundary instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..checks.hook_results import resume_loaders
from ..difference import first_difference
from ..rng import random_state
from ..state import Deferred, RandomState, built, cpu_state, deferred_revision, now

__all__ = [
    "boundary_loader_states",
    "boundary_random_state",
    "loader_epoch_ended",
    "loader_positions",
    "record_boundary",
    "refresh_after_epoch_end",
    "refresh_boundary",
    "rng_device",
]


def rng_device() -> int | None:
    """The CUDA device whose generator is part of the main-process RNG state, if any."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def record_boundary(trainer: Any, guard: Any) -> None:
    """Record the trainer's loader positions as the last step boundary.

    Args:
        trainer: The trainer (its loaders read through ``resume_loaders``).
        guard: Its ``StepGuard``; its ``boundary_*`` attributes are replaced.
    """
    # It runs after every step: one pass, one call per ResumableDataLoader.
    positions: dict[str, Deferred] | None = {}
    ended: tuple[str, ...] = ()
    try:
        others = None
        for name, loader in resume_loaders(trainer).items():
            # Looked up on the class, as deferred_state_dict (see _position).
            record = getattr(type(loader), "boundary_record", None)
            if record is not None:
                positions[name], seen = record(loader)  # type: ignore[index]
                if seen:
                    ended = (*ended, name)
            else:
                positions[name] = _position(loader)  # type: ignore[index]
                others = [(name, loader)] if others is None else [*others, (name, loader)]
                _count_boundary(loader)
        # After state_dict(): over an IterableDataset it reads on to know a pass ended.
        if others is not None:
            ended = (*ended, *(name for name, loader in others if loader_epoch_ended(loader)))
    except Exception:  # noqa: BLE001 - the same calls raise again, to the caller, when a pause reads live
        # A hook or loader that cannot answer here (not implemented, loaders not built
        # yet at initialisation, a loader that is not resumable) answers the same at
        # pause(), which then reports it; training itself goes on as before.
        positions, ended = None, ()
    # Plain stores, not an object: this runs after every step (under the training lock,
    # as every reader of them).
    guard.boundary_positions = positions
    guard.boundary_ended = ended
    guard.boundary_states = None


def _count_boundary(view: Any) -> None:
    """A framework's view of a library loader (Fabric's, Accelerate's) saves the view's
    position; the loader inside still counts the boundary, by which it tells an epoch a
    loop left part-way (warned about) from a look at a batch."""
    inner = getattr(view, "loader", None)
    record = getattr(type(inner), "boundary_record", None) if inner is not None else None
    if record is not None:
        record(inner)


def loader_positions(trainer: Any) -> dict[str, tuple[Any, Any, Deferred]] | None:
    """Each returned loader (as the hook returns it, and as the library reads it) and its
    position now; ``None`` where a hook or loader cannot answer (as a boundary records it
    then)."""
    try:
        returned = dict(trainer._resume_loaders())
        return {
            name: (returned.get(name), loader, _current_position(loader))
            for name, loader in resume_loaders(trainer).items()
        }
    except Exception:  # noqa: BLE001 - the same calls raise again, to the caller, at pause()
        return None


def refresh_boundary(guard: Any, before: Any, after: Any) -> None:
    """After serialized work between steps (``@serialized_training``): a loader it read
    from (validation) or put in place (a curriculum's next loader) is recorded where it is
    now, as if a boundary came after it; every other loader keeps the last step
    boundary's position, so a batch fetched for the next step stays undelivered.

    Args:
        guard: The trainer's ``StepGuard``.
        before, after: :func:`loader_positions` at the start and the end of the work.
    """
    positions = guard.boundary_positions
    if positions is None or before is None or after is None:
        return
    moved = {
        name: position
        for name, (loader, _, position) in after.items()
        if name not in before
        or before[name][0] is not loader
        or not _same(before[name][2], position)
    }
    if moved:
        guard.boundary_positions = {**positions, **moved}
        guard.boundary_states = None
    for name in moved:  # an epoch it read to its end ended in this work, not in a step
        view = after[name][1]
        record = getattr(type(view), "boundary_record", None)
        if record is not None:
            record(view)


def refresh_after_epoch_end(trainer: Any, guard: Any) -> None:
    """At ``pause_if_requested(epoch_end_done=True)`` after a step that ended a loader's
    epoch, where a pause or point may be written: a loader the epoch-end work read (a validation pass that is not
    ``@serialized_training``) or put in place is recorded where it is now; a loader whose
    epoch ended at that boundary keeps its position there (a batch the loop fetched for
    the next epoch stays undelivered)."""
    positions = guard.boundary_positions
    if positions is None or not guard.boundary_ended:
        return
    after = loader_positions(trainer)
    if after is None:
        return
    before = {
        name: entry
        if name in guard.boundary_ended and _refers_to(positions.get(name, ()), entry[1])
        else (entry[0], entry[1], positions.get(name))
        for name, entry in after.items()
    }
    refresh_boundary(guard, before, after)


def _refers_to(position: Deferred, loader: Any) -> bool:
    """Whether a ``ResumableDataLoader``'s recorded position is this loader's (another
    loader's: the work replaced it; a loader from elsewhere records no reference)."""
    return not any(isinstance(item, DataLoader) for item in position) or any(
        item is loader for item in position
    )


def _current_position(loader: Any) -> Deferred:
    # The position alone: an epoch's end is the next step boundary's to report.
    record = getattr(type(loader), "boundary_record", None)
    return record(loader, False)[0] if record is not None else _position(loader)


def _same(a: Any, b: Any) -> bool:
    """Two recorded positions of one loader are the same place: containers alike item by
    item, numbers and strings equal, states (dicts, tensors) equal in value, anything else
    the same object (a deferred state refers to what the delivered batches left)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float, str, bytes)):
        return bool(a == b)
    if isinstance(a, (Mapping, torch.Tensor)):
        return first_difference(a, b) is None
    return False


def _position(loader: Any) -> Deferred:
    """The loader's position now, as a :data:`~trainer_resume.state.Deferred` state (a CPU copy).

    A loader with ``deferred_state_dict()`` (looked up on its class: a wrapper's
    ``__getattr__`` would answer for the loader inside) records a few integers now and
    builds the state only when a pause or resume point is taken; any other loader's
    ``state_dict()`` is copied now.
    """
    deferred = getattr(type(loader), "deferred_state_dict", None)
    if deferred is not None:
        return (deferred(loader),)
    return now(cpu_state(loader.state_dict()))


def loader_epoch_ended(loader: Any) -> bool:
    """Whether ``loader`` says it just delivered its epoch's last batch.

    A ``ResumableDataLoader`` says so through ``epoch_ended``; a loader from elsewhere
    may have the same attribute (an adapter's wrapper); one without it is never seen
    at an epoch's end.
    """
    try:
        return getattr(loader, "epoch_ended", False) is True
    except Exception:  # noqa: BLE001 - a wrapper's __getattr__ that raises: no epoch end seen
        return False


def boundary_loader_states(trainer: Any, guard: Any) -> dict[str, Any]:
    """The loader states a pause saves: the last boundary's (built on first use, then kept
    for the next pause or resume point at that boundary), else the live ones."""
    positions = guard.boundary_positions
    if positions is not None:
        # Built again where a position now builds another state (an epoch the loop left
        # part-way after an earlier pause or point at this boundary was built).
        revision = deferred_revision()
        kept = guard.boundary_states
        if kept is None or kept[0] != revision:
            kept = guard.boundary_states = (
                revision,
                {name: built(d) for name, d in positions.items()},
            )
        return kept[1]
    return {
        name: cpu_state(loader.state_dict()) for name, loader in resume_loaders(trainer).items()
    }


def boundary_random_state() -> RandomState:
    """The main-process RNG state a pause saves: now, never inside another thread's ``rng_scope``."""
    return random_state(rng_device())
