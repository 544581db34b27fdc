"""The pause path: the checkpoint of the last completed step, checked, agreed, written.

:func:`pause_checkpoint` builds what an exact continuation needs (the objects, the
loader positions of the last boundary, the RNG, the extra state, the gradients of an
open accumulation window) and refuses what a weights-only load would not read back;
resume points take it too, copied into host memory. :func:`pause_to`, the body of
``pause()``, writes it: under a process group every rank checks before any rank writes,
then rank 0 writes one file with every rank's state, or every rank the shards of a
sharded model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import is_lazy

from .. import distributed as _distributed
from .._module_names import canonical_state
from ..checks.pause_state import check_saveable, to_cpu
from ..errors import ResumeStateMismatchError, UnsupportedResumeConfigurationError
from ..module_modes import object_modes
from ..sharded.buffers import rank_buffers
from ..sharded.detect import (
    SHARDED_STATE,
    ShardedObjects,
    refuse_dtensors,
    refuse_unreduced_gradients,
    sharded_objects,
)
from ..state import (
    DDP_WINDOW_KEY,
    GRADIENTS_KEY,
    PAUSE_FORMAT,
    RANK_BUFFERS_KEY,
    SHARDED_WINDOW_KEY,
    PauseCheckpoint,
    StrPath,
)
from ..storage.paths import is_url, make_parent_directory
from ._boundary import boundary_loader_states, boundary_random_state
from ._ddp_window import collect_windows, watch_windows
from ._gradients import collect_gradients
from ._object_setup import object_classes
from ._resume_checks import prove_written_pause
from ._settings import settings_of
from ._sharded_window import watch_optimizer_steps, window_open
from ._step_guard import StepGuard
from ._training_start import check_hook_results, refuse_inside_epoch

if TYPE_CHECKING:
    from ..sharded.read import ShardedPause
    from . import TrainingResumeMixin

__all__ = ["pause_checkpoint", "pause_to", "point_shards", "refuse_sharded_url"]


def refuse_sharded_url(path: StrPath, sharded: ShardedObjects) -> None:
    """Refuse a sharded pause to a URL (sharded pauses are directories on a local or
    shared file system; see docs/cloud-storage.md)."""
    if sharded and is_url(path):
        raise UnsupportedResumeConfigurationError(
            f"{path}: a sharded model ({', '.join(sorted(sharded.names))}) pauses to a "
            "directory every rank writes to; give a path on a shared file system (or a "
            "bucket mounted there), not a URL"
        )


def pause_to(trainer: TrainingResumeMixin, guard: StepGuard, path: StrPath, *, base: type) -> None:
    """The body of ``pause()`` (under the lock, between steps).

    Args:
        base: ``TrainingResumeMixin``, to tell overridden hooks from the defaults.
    """
    if guard.audit is not None:  # paused before the first step: check the hooks now
        audit, guard.audit = guard.audit, None
        guard.audit = audit(trainer)
    collective = _distributed.is_distributed()
    with _distributed.agreed("pause()", collective):
        if guard.start_check is not None:  # before the first step, as that step would
            check_hook_results(trainer)
            watch_windows(trainer)
            guard.start_check = None
        guard.check_pause_allowed()
        refuse_inside_epoch(trainer)
        sharded = sharded_objects(trainer._resume_objects())
        watch_optimizer_steps(sharded)  # once a sharded model trains, if not yet
        refuse_unreduced_gradients(trainer._resume_objects(), sharded)
        refuse_sharded_url(path, sharded)
        checkpoint = pause_checkpoint(trainer, guard, sharded=sharded)
    opened: ShardedPause | None = None
    if sharded:
        key = settings_of(trainer, "pause()").key
        # Both import torch.distributed.checkpoint.
        from ..sharded.read import ShardedPause
        from ..sharded.write import write_pause

        manifest, metadata = write_pause(
            path, checkpoint, trainer._resume_objects(), sharded, key=key
        )
        location = os.path.abspath(os.fspath(path))
        directory = os.path.join(location, manifest["generation"])
        opened = ShardedPause(location, directory, manifest, checkpoint, metadata)
    elif collective:
        combined = _distributed.gather_pause(checkpoint)

        def write() -> None:
            make_parent_directory(path)
            trainer._save_pause_checkpoint(combined, path)

        _distributed.commit(write, os.fspath(path))
    else:
        make_parent_directory(path)
        trainer._save_pause_checkpoint(checkpoint, path)
    guard.paused = True
    if guard.requested_path is not None and os.fspath(guard.requested_path) == os.fspath(path):
        guard.requested_path = None
    # A pause no resume would accept is a defect: found here, by the run that wrote it.
    with _distributed.agreed("pause()", collective):
        prove_written_pause(trainer, checkpoint, os.fspath(path), opened=opened, base=base)


def point_shards(trainer: TrainingResumeMixin) -> tuple[ShardedObjects, Mapping[str, Any]]:
    """The sharded models and optimizers a resume point writes through DCP, and the objects.

    Raises:
        UnsupportedResumeConfigurationError: gradients FSDP2 has not reduced yet (332).
    """
    objects = trainer._resume_objects()
    sharded = sharded_objects(objects)
    refuse_unreduced_gradients(objects, sharded)
    return sharded, objects


def _refuse_unmaterialized(objects: Mapping[str, Any]) -> None:
    """A lazy module (``nn.LazyLinear``) has no parameters to save before its first forward."""
    for name, obj in objects.items():
        if not isinstance(obj, torch.nn.Module):
            continue
        for key, tensor in chain(obj.named_parameters(), obj.named_buffers()):
            if is_lazy(tensor):
                raise UnsupportedResumeConfigurationError(
                    f"object {name!r}: {key!r} belongs to a lazy module that has not run yet "
                    "(its parameters take their shape at the first forward), so there is "
                    "nothing to save; run a step first"
                )


def pause_checkpoint(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    copy: Callable[[Any, dict], Any] = to_cpu,
    sharded: ShardedObjects | None = None,
) -> PauseCheckpoint:
    """This rank's pause checkpoint of the last completed step.

    Args:
        copy: ``to_cpu`` for a pause (written under the lock); for a resume point, a
            copy in host memory (written while training changes the live tensors).
        sharded: The objects every rank writes through DCP (left out here).
    """
    sharded = sharded if sharded is not None else ShardedObjects()
    settings = settings_of(trainer, "pause()")
    objects = dict(trainer._resume_objects())
    _refuse_unmaterialized(objects)
    shared = list(trainer._resume_shared_keys())
    regular_source = trainer._regular_checkpoint()
    for name in shared:
        if name in sharded.names:
            raise UnsupportedResumeConfigurationError(
                f"shared key {name!r} names a sharded object (DTensor parameters): its "
                "state is written through torch.distributed.checkpoint, not taken from the "
                "regular checkpoint"
            )
        if name not in objects or regular_source is None or name not in regular_source:
            where = "the resume objects" if name not in objects else "the regular checkpoint"
            raise ResumeStateMismatchError(f"shared key {name!r} is not in {where}")
    memo: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
    regular = None if regular_source is None else copy(dict(regular_source), memo)
    object_states: dict[str, Any] = {}
    for name, obj in objects.items():
        if name in sharded.names:  # written by every rank for its shards, see write_pause
            object_states[name] = dict(SHARDED_STATE)
            continue
        module = isinstance(obj, torch.nn.Module)
        if regular is not None and name in shared:
            # A shared key references the regular snapshot: no second state_dict() call,
            # and torch.save writes the object once because it is the same object.
            if module and isinstance(regular[name], Mapping):
                regular[name] = canonical_state(obj, regular[name])
            object_states[name] = regular[name]
        else:
            # A module's state under the unwrapped module's names: it resumes into the
            # module compiled or not, wrapped by DDP or not (see _module_names).
            object_states[name] = copy(canonical_state(obj) if module else obj.state_dict(), memo)
    checkpoint: PauseCheckpoint = {
        "format": PAUSE_FORMAT,
        "module_version": settings.version,
        "config_signature": settings.signature,
        "config": settings.canonical,
        "config_ignore": list(settings.config.ignore),
        "completed_steps": guard.completed_steps,
        "regular": regular,
        "shared_keys": shared,
        "objects": object_states,
        # Loader positions as of the last step boundary: a batch fetched since (outside
        # the step) is delivered again. The RNG is never caught inside a fetch.
        "loaders": boundary_loader_states(trainer, guard),
        "extra": copy(dict(trainer._resume_extra_state()), memo),
        "rng": boundary_random_state(),
        # What the objects' state_dict() leaves out: modules' modes, optimizers' classes.
        "module_modes": object_modes(objects),
        "object_classes": object_classes(objects),
    }
    # Inside a gradient-accumulation window the partial sums move to the next step too.
    gradients = collect_gradients(
        objects,
        copy,
        memo,
        skipped=set(sharded.names),
        drop_spent=settings.spent_gradients == "drop",
    )
    if gradients is not None:
        checkpoint[GRADIENTS_KEY] = gradients
    # So does DDP's record of the parameters it found used in an open window.
    windows = collect_windows(trainer, objects)
    if windows is not None:
        checkpoint[DDP_WINDOW_KEY] = windows
    # A sharded model's buffers differ per rank (FSDP2 shards parameters only), and DCP
    # writes a plain tensor once: each rank's own go into its state.
    if sharded.models:
        checkpoint[RANK_BUFFERS_KEY] = rank_buffers(
            objects, sharded.models, lambda b: copy(b, memo)
        )
        if window_open(objects, sharded):
            checkpoint[SHARDED_WINDOW_KEY] = True
    refuse_dtensors(checkpoint, "checkpoint")
    check_saveable(checkpoint)
    return checkpoint
