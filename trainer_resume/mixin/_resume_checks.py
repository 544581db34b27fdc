"""A pause file checked against the live trainer, completely, before ``resume()`` changes anything.

This rank's part of the file (:func:`rank_checkpoint`), its kind against the trainer's
model (:func:`check_sharded`: a sharded pause for DTensor parameters, a file for the
others), then :func:`check_pause_checkpoint`: module version, config signature, the
entries the hooks name, every object's state, the gradients, the library's loader
states, ``_validate_resume`` and the RNG state. A refusal leaves the trainer as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from .. import distributed as _distributed
from ..checks.config_match import check_config
from ..checks.hook_results import is_library_loader, resume_loaders
from ..checks.pause_state import check_layout, check_names, check_random_state, object_states
from ..checks.state_match import check_object_states
from ..errors import (
    PauseNotResumableError,
    ResumeError,
    ResumeStateMismatchError,
    UnsupportedResumeConfigurationError,
    VersionMismatchError,
)
from ..module_modes import check_object_modes
from ..sharded.buffers import check_rank_buffers
from ..sharded.detect import sharded_objects
from ..state import DDP_WINDOW_KEY, GRADIENTS_KEY, PauseCheckpoint
from ._boundary import rng_device
from ._ddp_window import check_windows
from ._gradients import check_gradients
from ._object_setup import check_object_classes
from ._settings import settings_of
from ._training_start import check_hook_results

if TYPE_CHECKING:
    from ..sharded.read import ShardedPause
    from . import TrainingResumeMixin

__all__ = [
    "GRAD_SCALERS",
    "check_pause_checkpoint",
    "check_sharded",
    "prove_written_pause",
    "rank_checkpoint",
]

GRAD_SCALERS: tuple[type, ...] = (torch.amp.GradScaler,)
if not issubclass(torch.cuda.amp.GradScaler, torch.amp.GradScaler):  # older torch: separate classes
    GRAD_SCALERS += (torch.cuda.amp.GradScaler,)


def rank_checkpoint(
    trainer: TrainingResumeMixin, checkpoint: Any, location: str
) -> PauseCheckpoint:
    """This rank's part of a pause file (the file itself for one process and a plain file)."""
    check_layout(checkpoint, location)
    world_size, rank = _distributed.world()
    return _distributed.rank_view(
        checkpoint,
        world_size=world_size,
        rank=rank,
        location=location,
        device=rng_device(),
        objects=trainer._resume_objects(),
        scheduler_steps=settings_of(trainer, "resume()").scheduler_steps,
    )


def check_sharded(trainer: TrainingResumeMixin, opened: ShardedPause | None, location: str) -> None:
    """Refuse a sharded pause that does not fit the objects, or a file for a sharded model."""
    if opened is not None:
        opened.check_objects(trainer._resume_objects())
    elif sharded_objects(trainer._resume_objects()):
        raise UnsupportedResumeConfigurationError(
            f"{location} is a pause file of unsharded states; a trainer whose model has "
            "DTensor parameters (fully_shard) resumes from a sharded pause directory"
        )


def check_pause_checkpoint(
    trainer: TrainingResumeMixin,
    checkpoint: Any,
    location: str,
    *,
    sharded: Iterable[str] = (),
    base: type,
    validate: bool = True,
) -> dict[str, Any]:
    """Refuse a checkpoint that does not fit the trainer; return the objects' saved states.

    Args:
        sharded: Names of the objects whose states are in the DCP files.
        base: ``TrainingResumeMixin``, to tell overridden hooks from the defaults.
        validate: Call the trainer's ``_validate_resume`` (a resume does; the check of a
            pause just written leaves the user's hook out).
    """
    settings = settings_of(trainer, "resume()")
    check_layout(checkpoint, location)
    if checkpoint["module_version"] != settings.version:
        raise VersionMismatchError(
            f"{location} was written by version {checkpoint['module_version']!r}, this trainer is {settings.version!r}"
        )
    check_config(checkpoint, settings.config, location)
    states = object_states(checkpoint)
    loaders = resume_loaders(trainer)
    objects = trainer._resume_objects()
    check_hook_results(trainer)
    check_names("objects (_resume_objects())", states, objects)
    check_names("loaders (_resume_loaders())", checkpoint["loaders"], loaders)
    check_names(
        "extra state (_resume_extra_state())", checkpoint["extra"], trainer._resume_extra_state()
    )
    if checkpoint["extra"] and not _overrides(trainer, "_load_resume_extra_state", base):
        raise ResumeStateMismatchError(
            f"the checkpoint holds extra state {sorted(checkpoint['extra'])} but "
            f"{type(trainer).__name__} does not implement _load_resume_extra_state(state) to restore it"
        )
    # Sharded states are in the DCP files; ShardedPause.check_objects checks those.
    skipped = set(sharded)
    unsharded = {name: obj for name, obj in objects.items() if name not in skipped}
    check_object_classes(checkpoint, objects, location)
    check_object_states(unsharded, states, GRAD_SCALERS)
    check_object_modes(checkpoint, objects, location)
    check_rank_buffers(checkpoint, objects, location)
    check_gradients(checkpoint.get(GRADIENTS_KEY), objects, skipped)
    check_windows(checkpoint.get(DDP_WINDOW_KEY), trainer, objects, location)
    for name, loader in loaders.items():
        if is_library_loader(loader):  # the others check a state by loading it, first
            loader.validate_state_dict(checkpoint["loaders"][name])
    if validate:
        trainer._validate_resume(checkpoint)
    check_random_state(checkpoint["rng"], location, rng_device())
    return states


def prove_written_pause(
    trainer: TrainingResumeMixin,
    checkpoint: PauseCheckpoint,
    location: str,
    *,
    opened: ShardedPause | None,
    base: type,
) -> None:
    """Run the checks ``resume()`` runs on the pause just written, against the trainer that wrote it.

    ``checkpoint`` is this rank's part as written (in memory: no second read), ``opened``
    the sharded pause as committed (its manifest and DCP's index). Names, shapes, dtypes,
    pairing, loaders, gradients and RNG must pass as a resume of this trainer would check
    them; ``_validate_resume`` (the user's hook) is left out.

    Raises:
        PauseNotResumableError: a check refused; the detail is that refusal (354).
    """
    try:
        check_sharded(trainer, opened, location)
        check_pause_checkpoint(
            trainer,
            checkpoint,
            location,
            sharded=opened.names if opened is not None else (),
            base=base,
            validate=False,
        )
    except ResumeError as error:
        raise PauseNotResumableError(str(error)) from error


def _overrides(trainer: TrainingResumeMixin, hook: str, base: type) -> bool:
    return getattr(type(trainer), hook) is not getattr(base, hook)
