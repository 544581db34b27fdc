"""What a ``ResumableTrainer`` cannot resume exactly, refused when ``train()`` starts.

Every refusal is ``UnsupportedResumeConfigurationError`` (332) naming the setting and
the fix, raised before the model is touched. Refused:

- a collator or training dataset that draws from a random generator of its own
  (``DataCollatorForLanguageModeling(seed=...)``, a ``torch.Generator`` or NumPy /
  Python generator held in an attribute): the training loader seeds the global
  generators per batch, so draws from them replay; a generator of its own moves on
  with every batch, differently with every number of workers, and no pause saves it;
- ``train_sampling_strategy="group_by_length"`` or ``"batch_rebalance"`` (samplers
  whose order cannot be recomputed from a position);
- ``enable_jit_checkpoint`` (Trainer's own SIGTERM handler: its checkpoint's RNG has
  moved on, and it competes with the pause for the signal);
- ``auto_find_batch_size`` (a retry rebuilds the loader with another batch size);
- DeepSpeed, FSDP, more than one process or GPU, model or context parallelism: not
  tested exact;
- an ``IterableDataset`` with ``gradient_accumulation_steps > 1``: its passes may end
  inside an accumulation window, where no pause can land;
- ``train(resume_from_checkpoint=...)`` (the Trainer's own resume, not exact) and a
  hyper-parameter search ``trial``.

A stateless ``IterableDataset``, ``dataloader_in_order=False`` with workers and samplers that
cannot be repositioned are refused by ``ResumableDataLoader`` itself when the
training loader is built, at the start of ``train()`` too.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ...errors import UnsupportedResumeConfigurationError

__all__ = ["check_trainer", "own_generators", "refuse_train_arguments"]

_GENERATORS = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
_UNTESTED = "ResumableTrainer is tested exact on one process only; train without it"


def _refuse(detail: str) -> None:
    raise UnsupportedResumeConfigurationError(detail)


def own_generators(value: Any) -> list[str]:
    """The attributes of ``value`` (one level down too) that are random generators of its own.

    A ``transformers`` collator with a ``seed`` (``DataCollatorForLanguageModeling(seed=...)``)
    counts as holding one, also before its first batch makes it.
    """
    found: list[str] = []
    _collect(value, "", found, depth=2)
    return found


def _collect(value: Any, prefix: str, found: list[str], depth: int) -> None:
    try:
        items = list(vars(value).items())
    except TypeError:  # no __dict__ (slots, builtins): nothing to look into
        return
    if getattr(value, "seed", None) is not None and callable(getattr(value, "get_generator", None)):
        found.append(f"{prefix}seed={value.seed!r}")
    for name, item in items:
        if isinstance(item, _GENERATORS):
            module = type(item).__module__.replace("torch._C", "torch")
            found.append(f"{prefix}{name} ({module}.{type(item).__qualname__})")
        elif depth > 1 and not isinstance(item, (str, bytes, int, float, torch.Tensor)):
            if hasattr(item, "__dict__") and not isinstance(item, torch.nn.Module):
                _collect(item, f"{prefix}{name}.", found, depth - 1)


def refuse_train_arguments(resume_from_checkpoint: Any, trial: Any) -> None:
    """Refuse the ``train()`` arguments a ``ResumableTrainer`` cannot honour exactly."""
    if resume_from_checkpoint not in (None, False):
        _refuse(
            f"train(resume_from_checkpoint={resume_from_checkpoint!r}) restores a Trainer "
            "checkpoint-N directory, which does not continue the run exactly; call train() "
            "without it: ResumableTrainer resumes from its pause_path by itself"
        )
    if trial is not None:
        _refuse(
            "train(trial=...) runs a hyper-parameter search trial, which ResumableTrainer "
            "does not pause; train the trial with transformers.Trainer"
        )


def check_trainer(trainer: Any) -> None:
    """Refuse a trainer whose training cannot be paused and resumed exactly (332)."""
    args = trainer.args
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy in ("group_by_length", "batch_rebalance"):
        _refuse(
            f"train_sampling_strategy={strategy!r} orders batches with a sampler whose order "
            "cannot be recomputed from a saved position; use 'random' or 'sequential'"
        )
    if getattr(args, "enable_jit_checkpoint", False):
        _refuse(
            "enable_jit_checkpoint=True installs the Trainer's own SIGTERM checkpoint, whose "
            "random state has moved on from the step it saves; turn it off: ResumableTrainer "
            "pauses exactly on SIGTERM"
        )
    if args.auto_find_batch_size:
        _refuse(
            "auto_find_batch_size=True retries with a smaller batch size, which the saved "
            "loader position does not follow; set per_device_train_batch_size yourself"
        )
    if trainer.is_deepspeed_enabled:
        _refuse(f"DeepSpeed: {_UNTESTED}")
    if trainer.is_fsdp_enabled or args.fsdp:
        _refuse(f"FSDP: {_UNTESTED}")
    if args.world_size > 1 or trainer.accelerator.num_processes > 1:
        _refuse(f"{args.world_size} processes: {_UNTESTED}")
    if args.n_gpu > 1:
        _refuse(f"{args.n_gpu} GPUs (DataParallel): {_UNTESTED}")
    if trainer.is_model_parallel or getattr(args, "parallelism_config", None) is not None:
        _refuse(f"model, tensor or context parallelism: {_UNTESTED}")
    dataset = trainer.train_dataset
    if isinstance(dataset, IterableDataset) and args.gradient_accumulation_steps > 1:
        _refuse(
            f"{type(dataset).__name__} is an IterableDataset, whose passes may end inside a "
            f"window of gradient_accumulation_steps={args.gradient_accumulation_steps}, where no "
            "pause can land; use a map-style dataset, or gradient_accumulation_steps=1"
        )
    collator = getattr(trainer.data_collator, "data_collator", trainer.data_collator)
    for what, value, fix in (
        (
            "the data collator",
            collator,
            "drop its seed (masks then come from the global generators)",
        ),
        (
            "the training dataset",
            dataset,
            "draw from random, numpy.random or torch's global generator",
        ),
    ):
        generators = own_generators(value)
        if generators:
            _refuse(
                f"{what} ({type(value).__name__}) draws from a random generator of its own "
                f"({', '.join(generators)}), which no pause saves and which moves on differently "
                f"with each number of workers; {fix}: the loader seeds those per batch, so they "
                "replay exactly"
            )
