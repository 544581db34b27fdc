"""The last step boundary: what a pause saves of the state that moves between steps.

A training loop often fetches the next batch outside the step
(``trainer.step(next(batches))``), and a pause may come from another thread at
any moment. Read live, such a pause would count a batch fetched after the last
step as delivered (it would never be trained on after the resume) and could catch
the main-process generators in the middle of a fetch. So the loader positions
and the main-process RNG are recorded at every boundary, and a pause saves those:

- loader positions: at the end of ``_initialize_training_resume()`` (the boundary
  before the first step), of every outermost ``@training_step`` and of ``resume()``;
  a batch delivered after that is delivered again after the resume;
- main-process RNG: at the end of every outermost ``@training_step``, of
  ``resume()`` and of every outermost ``@serialized_training`` call (work between
  steps, such as an evaluation that draws random numbers, is not repeated after a
  resume). Before the first step it is read live (the rest of ``__init__`` may
  still draw from it), never in the middle of an ``rng_scope``.

Everything else a pause saves (objects, extra state, step count) changes only
inside steps and serialized calls, under the training lock, so it is read live.
Recording costs a few microseconds per loader plus a raw copy of the generators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .rng import random_state, random_state_snapshot
from .state import RandomState, cpu_state

__all__ = [
    "Boundary",
    "boundary_loader_states",
    "boundary_random_state",
    "record_boundary",
    "record_random_state",
    "rng_device",
]


class Boundary:
    """Loader states and a deferred RNG state, as of one step boundary."""

    __slots__ = ("loaders", "random")

    def __init__(self, loaders: dict[str, Any] | None, random: Callable[[], RandomState] | None) -> None:
        # None: not known at this boundary, read live by a pause.
        self.loaders = loaders
        self.random = random


def rng_device() -> int | None:
    """The CUDA device whose generator is part of the main-process RNG state, if any."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def record_boundary(trainer: Any, guard: Any, *, initial: bool = False) -> None:
    """Record the trainer's loader positions and RNG as the last step boundary.

    Args:
        trainer: The trainer (its ``_resume_loaders()`` hook is called).
        guard: Its ``StepGuard``; ``guard.boundary`` is replaced.
        initial: The boundary before the first step, recorded at initialisation:
            the RNG is left to be read live.
    """
    states: dict[str, Any] | None
    try:
        states = {name: cpu_state(loader.state_dict()) for name, loader in trainer._resume_loaders().items()}
    except Exception:  # noqa: BLE001 - the same calls raise again, to the caller, when a pause reads live
        # A hook or loader that cannot answer here (not implemented, loaders not built
        # yet at initialisation, a loader that is not resumable) answers the same at
        # pause(), which then reports it; training itself goes on as before.
        states = None
    guard.boundary = Boundary(states, None if initial else random_state_snapshot(rng_device()))


def record_random_state(guard: Any) -> None:
    """Move the boundary's RNG to now (after work between steps), keeping its loader positions."""
    if guard.boundary is not None:
        guard.boundary.random = random_state_snapshot(rng_device())


def boundary_loader_states(trainer: Any, guard: Any) -> dict[str, Any]:
    """The loader states a pause saves: the last boundary's, else the live ones."""
    boundary = guard.boundary
    if boundary is not None and boundary.loaders is not None:
        return boundary.loaders
    return {name: cpu_state(loader.state_dict()) for name, loader in trainer._resume_loaders().items()}


def boundary_random_state(guard: Any) -> RandomState:
    """The main-process RNG state a pause saves: the last boundary's, else the live one."""
    boundary = guard.boundary
    if boundary is not None and boundary.random is not None:
        return boundary.random()
    return random_state(rng_device())
