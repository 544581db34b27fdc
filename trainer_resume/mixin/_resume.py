"""The resume path: read, check on every rank, then restore in order, the RNG last.

:func:`resume_from`, the body of ``resume()`` and ``resume_latest()``, refuses a
finished run, reads the pause file (or opens a sharded pause directory) and checks it
completely (see :mod:`._resume_checks`); under a process group every rank restores or
none does. Then the shards are read, the loaders from elsewhere restored (put back
when one refuses), and the objects, scalers, library loaders, extra state, iterators,
gradients and RNG restored. A failure part-way locks the trainer, naming what failed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .. import distributed as _distributed
from .._module_names import live_state, loading_module
from ..amp import restore_grad_scaler_state
from ..checks.hook_results import is_library_loader, resume_loaders
from ..errors import TrainerLockedError
from ..finished import refuse_if_finished
from ..module_modes import MODES_KEY, restore_object_modes
from ..rng import restore_random_state
from ..sharded.buffers import restore_rank_buffers
from ..sharded.manifest import is_pause_directory
from ..state import (
    DDP_WINDOW_KEY,
    GRADIENTS_KEY,
    RANK_BUFFERS_KEY,
    SHARDED_WINDOW_KEY,
    PauseCheckpoint,
    StrPath,
)
from ._boundary import record_boundary, rng_device
from ._ddp_window import restore_windows
from ._gradients import restore_gradients
from ._hook_audit import name_stale_iterators, stale_iterators
from ._resume_checks import GRAD_SCALERS, check_pause_checkpoint, check_sharded, rank_checkpoint
from ._settings import settings_of
from ._sharded_window import restore_window
from ._step_guard import StepGuard
from ._training_start import restore_foreign_loaders

if TYPE_CHECKING:
    from ..sharded.read import ShardedPause
    from . import TrainingResumeMixin

__all__ = ["check_resumable_at", "read_and_check", "resume_from"]


def resume_from(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    path: StrPath,
    read: Callable[[], Any] | None = None,
    *,
    base: type,
) -> None:
    """The body of ``resume()`` (under the lock, between steps).

    Args:
        read: Gives the pause file already read (``resume_latest``).
        base: ``TrainingResumeMixin``, to tell overridden hooks from the defaults.
    """
    location = os.fspath(path)
    collective = _distributed.is_distributed()
    # Every rank checks the file: restore everywhere or nowhere.
    with _distributed.agreed("resume()", collective):
        checkpoint, states, opened = read_and_check(trainer, path, read, base=base)
    # Every rank reads its shards before any state changes; a failure is raised on
    # every rank with nothing restored (collective, see ShardedPause.load).
    staged = opened.load(trainer._resume_objects()) if opened is not None else None
    # Then the loaders from elsewhere, which check a state only by loading it: one that
    # refuses is put back with every other, and nothing else changed.
    restore_foreign_loaders(trainer, guard, checkpoint["loaders"], location, collective)
    _restore(trainer, guard, checkpoint, states, location, opened, staged)


def check_resumable_at(trainer: TrainingResumeMixin, path: StrPath, *, base: type) -> None:
    """The body of ``check_resumable()``: the checks of ``resume()``, agreed by every rank."""
    with _distributed.agreed("check_resumable()", _distributed.is_distributed()):
        read_and_check(trainer, path, base=base)


def read_and_check(
    trainer: TrainingResumeMixin,
    path: StrPath,
    read: Callable[[], Any] | None = None,
    *,
    base: type,
) -> tuple[PauseCheckpoint, dict[str, Any], ShardedPause | None]:
    """Read a pause (file or sharded directory) and check it against the trainer; change nothing.

    Runs no collective: under a process group the caller agrees on the outcome.

    Returns:
        This rank's part of the checkpoint, the objects' saved states and the opened
        sharded pause (``None`` for a file).
    """
    location = os.fspath(path)
    key = settings_of(trainer, "resume()").key
    refuse_if_finished(location, key=key)
    opened = None
    if read is not None:
        loaded: Any = read()
    elif is_pause_directory(path):
        from ..sharded.read import open_pause  # imports torch.distributed.checkpoint

        opened = open_pause(path, key=key)
        loaded = opened.checkpoint
    else:
        loaded = trainer._load_pause_checkpoint(path)
    check_sharded(trainer, opened, location)
    checkpoint = rank_checkpoint(trainer, loaded, location)
    states = check_pause_checkpoint(
        trainer,
        checkpoint,
        location,
        sharded=opened.names if opened is not None else (),
        base=base,
    )
    return checkpoint, states, opened


def _restore(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    checkpoint: PauseCheckpoint,
    states: dict[str, Any],
    location: str,
    opened: ShardedPause | None = None,
    staged: Mapping[str, Any] | None = None,
) -> None:
    objects = trainer._resume_objects()
    scalers = [name for name, obj in objects.items() if isinstance(obj, GRAD_SCALERS)]
    optimizers = [obj for obj in objects.values() if isinstance(obj, torch.optim.Optimizer)]
    sharded = opened.names if opened is not None else []
    stage = "objects"
    iterators = stale_iterators(trainer)  # live now; restoring the loaders ends them
    try:
        if opened is not None and staged is not None:
            stage = "sharded objects"
            opened.apply(objects, staged)
            restore_rank_buffers(checkpoint.get(RANK_BUFFERS_KEY), objects)
        for name, obj in objects.items():
            if name not in scalers and name not in sharded:
                stage = f"object {name!r}"
                state = states[name]
                if isinstance(obj, torch.nn.Module):  # saved under canonical names
                    obj = loading_module(obj)
                    state = live_state(state, obj)
                obj.load_state_dict(state)
        # Scalers after the optimizers: their per-optimizer bookkeeping refers to them.
        for name in scalers:
            stage = f"GradScaler {name!r}"
            restore_grad_scaler_state(objects[name], states[name], optimizers)
        for name, loader in resume_loaders(trainer).items():
            if is_library_loader(loader):  # the others were restored first
                stage = f"loader {name!r}"
                loader.load_state_dict(checkpoint["loaders"][name])
        if checkpoint["extra"]:  # the hook receives only what was saved
            restored = dict(trainer._resume_loaders())
            stage = "extra state"
            trainer._load_resume_extra_state(checkpoint["extra"])
            # A loader the hook put in place (a curriculum's next phase) was not restored
            # above: the saved position is its own (the pause took it from the loader the
            # hook returned then).
            replaced = {
                name
                for name, loader in trainer._resume_loaders().items()
                if loader is not restored.get(name)
            }
            for name, loader in resume_loaders(trainer).items():
                if name in replaced:
                    stage = f"loader {name!r} (put in place by _load_resume_extra_state)"
                    loader.load_state_dict(checkpoint["loaders"][name])
        stage = "iterators"
        trainer._rebuild_resume_iterators()
        name_stale_iterators(trainer, iterators)
        stage = "module modes"
        restore_object_modes(checkpoint.get(MODES_KEY), objects)
        stage = "gradients"
        restore_gradients(checkpoint.get(GRADIENTS_KEY), objects, set(sharded))
        restore_window(objects, sharded, bool(checkpoint.get(SHARDED_WINDOW_KEY)))
        # After the gradients: DDP's reducer marks a parameter used only where one is set.
        stage = "DistributedDataParallel window"
        restore_windows(checkpoint.get(DDP_WINDOW_KEY), trainer, objects, location)
        # Before the generators too: a loader's state_dict() may draw from them
        # (StatefulDataLoader's, with no iterator since load_state_dict(), makes one), as
        # it did at the paused boundary, before the pause read them.
        stage = "step boundary"
        record_boundary(trainer, guard)
        # Last: rebuilding loaders and iterators may draw from the global generators.
        stage = "random state"
        restore_random_state(checkpoint["rng"], rng_device())
    except BaseException as error:
        guard.locked_reason = (
            f"restoring {stage} from {location} failed ({type(error).__name__}: {error})"
        )
        if not isinstance(error, Exception):
            raise
        raise TrainerLockedError(guard.locked_reason) from error
    guard.locked_reason = None
    guard.failed = False
    guard.paused = False
    guard.completed_steps = checkpoint["completed_steps"]
