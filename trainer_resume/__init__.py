"""trainer-resume: pause a PyTorch training job at any completed step and resume it
bit-identically in a new process, without ever losing the last good checkpoint."""

from __future__ import annotations

from ._declarations import declare_no_random_draws
from .amp import restore_grad_scaler_state
from .durable import CheckpointHeader, load_checkpoint, read_checkpoint_header, save_checkpoint
from .errors import *  # noqa: F401,F403  (the error catalogue is public API)
from .errors import __all__ as _error_names
from .finished import FinishedRun, mark_finished, run_finished
from .mixin import TrainingResumeMixin, serialized_training, training_step
from .pause_signals import pause_signals_blocked
from .resume_points import ResumePoint, ResumePoints
from .rng import derive_seed, random_state, restore_random_state, rng_scope
from .signature import canonical_config, config_difference, config_signature
from .state import cpu_state

__version__ = "0.1.0"

__all__ = [
    "TrainingResumeMixin",
    "training_step",
    "serialized_training",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_header",
    "CheckpointHeader",
    "cpu_state",
    "random_state",
    "restore_random_state",
    "rng_scope",
    "derive_seed",
    "restore_grad_scaler_state",
    "config_signature",
    "config_difference",
    "canonical_config",
    "pause_signals_blocked",
    "declare_no_random_draws",
    "run_finished",
    "mark_finished",
    "FinishedRun",
    "ResumePoints",
    "ResumePoint",
    *_error_names,
]
