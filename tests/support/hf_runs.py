"""Tiny ``transformers`` training runs for the ResumableTrainer tests and benchmark.

A 2-layer ``BertForMaskedLM`` with dropout, 8-sample batches of 16 token ids, two
epochs, evaluated at each epoch's end. Two data pipelines that draw random numbers:
``"mlm"`` (``DataCollatorForLanguageModeling`` masking from torch's global generator)
and ``"getitem"`` (``__getitem__`` masking and replacing tokens with Python ``random``,
NumPy and torch). Nothing is downloaded: the tokenizer is built from a vocabulary file
written next to the run.

:class:`RecordingTrainer` records every micro-batch (its inputs and loss) and every
optimizer step's ``(global_step, state.epoch)``, and can send SIGTERM to its own
process group while a chosen micro-batch is being trained (as Slurm or ``timeout``
would); :func:`run_record` is what a run leaves for the comparison.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)
from transformers.trainer_utils import set_seed

from trainer_resume.adapters.transformers import ResumableTrainer

SEED = 4321
LENGTH = 16
BATCH = 8
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{index}" for index in range(59))]
# log_history entries that measure time, not training (train_runtime, eval_samples_per_second...).
TIMING_SUFFIXES = ("_runtime", "_per_second")


def variant(
    data: str = "mlm", workers: int = 0, accumulation: int = 1, batches: int = 12
) -> dict[str, Any]:
    """A run's settings: its data pipeline, loader workers, accumulation, batches per epoch."""
    return {"data": data, "workers": workers, "accumulation": accumulation, "batches": batches}


def variant_name(settings: dict[str, Any]) -> str:
    return "{data}-w{workers}-a{accumulation}-b{batches}".format(**settings)


def tokenizer(folder: Path) -> BertTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = folder / "vocab.txt"
    vocabulary.write_text("\n".join(VOCAB) + "\n")
    return BertTokenizer(str(vocabulary))


def _ids(count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(VOCAB), (count, LENGTH), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    return ids


class TokenIds(Dataset):
    """Fixed token-id rows, as a tokenized corpus would give them (no randomness)."""

    def __init__(self, count: int, seed: int) -> None:
        self.ids = _ids(count, seed)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index].clone()}


class RandomMasking(TokenIds):
    """Rows masked in ``__getitem__`` with Python ``random``, NumPy and torch draws."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.ids[index].clone()
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(LENGTH) < 0.2
        chosen[random.randrange(1, LENGTH - 1)] = True
        chosen[0] = chosen[-1] = False
        labels[chosen] = ids[chosen]
        ids[chosen] = 4  # [MASK]
        swapped = int(np.random.randint(1, LENGTH - 1))
        ids[swapped] = int(np.random.randint(5, len(VOCAB)))
        return {"input_ids": ids, "labels": labels}


def model() -> BertForMaskedLM:
    set_seed(SEED)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    return BertForMaskedLM(config)


def arguments(folder: Path, settings: dict[str, Any], **overrides: Any) -> TrainingArguments:
    options: dict[str, Any] = {
        "output_dir": str(folder / "out"),
        "num_train_epochs": 2,
        "per_device_train_batch_size": BATCH,
        "per_device_eval_batch_size": BATCH,
        "gradient_accumulation_steps": settings["accumulation"],
        "learning_rate": 2e-3,
        "weight_decay": 0.01,
        "warmup_steps": 2,
        "logging_steps": 5,
        "eval_strategy": "epoch",
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": True,
        "dataloader_num_workers": settings["workers"],
        "seed": SEED,
    }
    options.update(overrides)
    return TrainingArguments(**options)


def datasets(folder: Path, settings: dict[str, Any]) -> tuple[Dataset, Dataset, Any]:
    """The training set, the evaluation set and the collator of a variant."""
    count = settings["batches"] * BATCH
    if settings["data"] == "mlm":
        collator = DataCollatorForLanguageModeling(tokenizer(folder / "vocab"), mlm_probability=0.2)
        return TokenIds(count, 1), TokenIds(2 * BATCH, 2), collator
    if settings["data"] == "getitem":
        return RandomMasking(count, 1), RandomMasking(2 * BATCH, 2), default_data_collator
    raise ValueError(f"unknown data pipeline {settings['data']!r}")


class StepRecorder(TrainerCallback):
    """Every optimizer step's ``(global_step, state.epoch)``, as the other callbacks see it;
    with ``signal_in_evaluation``, SIGTERM to the process group during the first evaluation."""

    def __init__(self, signal_in_evaluation: bool = False) -> None:
        self.steps: list[tuple[int, float]] = []
        self.signal_in_evaluation = signal_in_evaluation

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append((state.global_step, state.epoch))

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.signal_in_evaluation:  # the evaluation loader's workers are running
            self.signal_in_evaluation = False
            os.killpg(os.getpgrp(), signal.SIGTERM)


class Recording:
    """What a run records: micro-batches, losses, steps; and when to send SIGTERM."""

    def __init__(self, signal_at: int | None) -> None:
        # The micro-batch (counted from 0 over the run) to signal in; -1: the first evaluation.
        self.signal_at = signal_at
        self.batches: list[dict[str, torch.Tensor]] = []
        self.losses: list[torch.Tensor] = []
        self.steps = StepRecorder(signal_in_evaluation=signal_at == -1)
        self.first_micro_batch = 0  # the run-wide number of this run's first micro-batch


def _recording(cls: type[Trainer]) -> type[Trainer]:
    class Recorded(cls):  # type: ignore[valid-type, misc]
        recording: Recording

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            record = self.recording
            number = record.first_micro_batch + len(record.batches)
            record.batches.append({key: value.clone() for key, value in inputs.items()})
            if number == record.signal_at:
                os.killpg(os.getpgrp(), signal.SIGTERM)  # the whole group, as Slurm does
            loss = super().training_step(model, inputs, num_items_in_batch)
            record.losses.append(loss.detach().clone())
            return loss

    Recorded.__name__ = f"Recording{cls.__name__}"
    return Recorded


RecordingTrainer = _recording(ResumableTrainer)
RecordingPlainTrainer = _recording(Trainer)


def build(
    folder: Path,
    settings: dict[str, Any],
    *,
    signal_at: int | None = None,
    plain: bool = False,
    cls: type[Trainer] | None = None,
    trainer_options: dict[str, Any] | None = None,
    **overrides: Any,
) -> Trainer:
    """A recording trainer of ``settings`` (``plain``: transformers' own Trainer).

    ``overrides`` change ``TrainingArguments``; ``trainer_options`` the trainer's own
    arguments (``callbacks`` are added to the step recorder); ``cls`` replaces the
    recording ``ResumableTrainer`` with a subclass of it.
    """
    train, evaluation, collator = datasets(folder, settings)
    recording = Recording(signal_at)
    options: dict[str, Any] = {
        "model": model(),
        "args": arguments(folder, settings, **overrides),
        "train_dataset": train,
        "eval_dataset": evaluation,
        "data_collator": collator,
    }
    options.update(trainer_options or {})
    options["callbacks"] = [recording.steps, *options.get("callbacks", [])]
    if plain:
        trainer = RecordingPlainTrainer(**options)
    else:
        options.setdefault("pause_path", folder / "pause.ckpt")
        trainer = (cls or RecordingTrainer)(**options)
    trainer.recording = recording
    return trainer


def run_record(trainer: Trainer, *, final: bool) -> dict[str, Any]:
    """What a run leaves for the comparison (``final``: with its final state)."""
    record: dict[str, Any] = {
        "batches": trainer.recording.batches,
        "losses": trainer.recording.losses,
        "steps": trainer.recording.steps.steps,
        "global_step": trainer.state.global_step,
    }
    if final:
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        record.update(
            model=trainer.model.state_dict(),
            optimizer=optimizer.state_dict(),
            scheduler=trainer.lr_scheduler.state_dict(),
            epoch=trainer.state.epoch,
            log_history=[
                {key: value for key, value in entry.items() if not key.endswith(TIMING_SUFFIXES)}
                for entry in trainer.state.log_history
            ],
        )
    return record
