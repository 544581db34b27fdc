"""What ResumableTrainer refuses when train() starts, each with its code and exact text,
before any batch is trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.hf_runs import TokenIds, build, tokenizer, variant
from torch.utils.data import DataLoader, IterableDataset
from transformers import DataCollatorForLanguageModeling, TrainingArguments

from trainer_resume.errors import UnsupportedResumeConfigurationError

UNTESTED = "ResumableTrainer is tested exact on one process only; train without it"


def _refusal(trainer: Any, **train_arguments: Any) -> str:
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.train(**train_arguments)
    assert caught.value.code == 332
    assert trainer.recording.batches == []  # nothing trained
    after = trainer.model.state_dict()
    assert all(torch.equal(value, after[name]) for name, value in before.items())
    assert not trainer.paused and not Path(trainer.pause_path).exists()
    return caught.value.detail


def test_a_collator_with_a_seed_of_its_own_is_refused(tmp_path: Path) -> None:
    collator = DataCollatorForLanguageModeling(tokenizer(tmp_path / "vocab"), seed=7)
    trainer = build(tmp_path, variant(), trainer_options={"data_collator": collator})
    assert _refusal(trainer) == (
        "the data collator (DataCollatorForLanguageModeling) draws from a random generator of "
        "its own (seed=7), which no pause saves and which moves on differently with each "
        "number of workers; drop its seed (masks then come from the global generators): the "
        "loader seeds those per batch, so they replay exactly"
    )


class _OwnGenerator(TokenIds):
    """Draws its noise from a generator it holds."""

    def __init__(self, count: int, seed: int) -> None:
        super().__init__(count, seed)
        self.noise = torch.Generator().manual_seed(3)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = super().__getitem__(index)
        row["input_ids"][1] = int(torch.randint(5, 60, (), generator=self.noise))
        return row


def test_a_dataset_with_a_generator_of_its_own_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant(), trainer_options={"train_dataset": _OwnGenerator(96, 1)})
    assert _refusal(trainer) == (
        "the training dataset (_OwnGenerator) draws from a random generator of its own "
        "(noise (torch.Generator)), which no pause saves and which moves on differently with "
        "each number of workers; draw from random, numpy.random or torch's global generator: "
        "the loader seeds those per batch, so they replay exactly"
    )


@pytest.mark.parametrize("strategy", ["group_by_length", "batch_rebalance"])
def test_length_grouped_sampling_is_refused(tmp_path: Path, strategy: str) -> None:
    trainer = build(tmp_path, variant(), train_sampling_strategy=strategy)
    assert _refusal(trainer) == (
        f"train_sampling_strategy={strategy!r} orders batches with a sampler whose order "
        "cannot be recomputed from a saved position; use 'random' or 'sequential'"
    )


def test_the_trainers_own_sigterm_checkpoint_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant(), enable_jit_checkpoint=True)
    assert _refusal(trainer) == (
        "enable_jit_checkpoint=True installs the Trainer's own SIGTERM checkpoint, whose random "
        "state has moved on from the step it saves; turn it off: ResumableTrainer pauses "
        "exactly on SIGTERM"
    )


def test_a_batch_size_search_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant(), auto_find_batch_size=True)
    assert _refusal(trainer) == (
        "auto_find_batch_size=True retries with a smaller batch size, which the saved loader "
        "position does not follow; set per_device_train_batch_size yourself"
    )


def test_the_trainers_own_resume_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant())
    assert _refusal(trainer, resume_from_checkpoint=True) == (
        "train(resume_from_checkpoint=True) restores a Trainer checkpoint-N directory, which "
        "does not continue the run exactly; call train() without it: ResumableTrainer resumes "
        "from its pause_path by itself"
    )


def test_a_hyperparameter_search_trial_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant())
    assert _refusal(trainer, trial={"learning_rate": 1e-3}) == (
        "train(trial=...) runs a hyper-parameter search trial, which ResumableTrainer does not "
        "pause; train the trial with transformers.Trainer"
    )


@pytest.mark.parametrize(
    ("flag", "detail"),
    [
        ("is_deepspeed_enabled", f"DeepSpeed: {UNTESTED}"),
        ("is_fsdp_enabled", f"FSDP: {UNTESTED}"),
        ("is_model_parallel", f"model, tensor or context parallelism: {UNTESTED}"),
    ],
)
def test_deepspeed_fsdp_and_model_parallelism_are_refused(
    tmp_path: Path, flag: str, detail: str
) -> None:
    # The flags transformers sets from the Accelerator's plugins and the model's device
    # map (none of them runs on this CPU).
    trainer = build(tmp_path, variant())
    setattr(trainer, flag, True)
    assert _refusal(trainer) == detail


@pytest.mark.parametrize(
    ("name", "detail"),
    [("world_size", f"2 processes: {UNTESTED}"), ("n_gpu", f"2 GPUs (DataParallel): {UNTESTED}")],
)
def test_more_than_one_process_or_gpu_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, detail: str
) -> None:
    trainer = build(tmp_path, variant())
    # TrainingArguments' own properties, as torchrun or several GPUs would set them.
    monkeypatch.setattr(TrainingArguments, name, property(lambda self: 2))
    assert _refusal(trainer) == detail


class _Stream(IterableDataset):
    """Token-id rows from a generator function: no state a pause could save."""

    def __iter__(self):
        yield from TokenIds(32, 1)


class _SavedStream(IterableDataset):
    """Token-id rows with a position that is saved (torchdata's Stateful protocol)."""

    def __init__(self) -> None:
        self.rows = TokenIds(32, 1)
        self.next = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.next == len(self.rows):
            raise StopIteration
        self.next += 1
        return self.rows[self.next - 1]

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


def test_a_stateless_iterable_dataset_is_refused(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant(), max_steps=4, trainer_options={"train_dataset": _Stream()})
    assert _refusal(trainer) == (
        "_Stream is an IterableDataset without state_dict() and load_state_dict(), and its "
        "__iter__ is a generator (which has none either), so its position cannot be recorded; "
        "give the dataset (or the iterator its __iter__ returns) state_dict() and "
        "load_state_dict() (torchdata's Stateful protocol), or use a map-style dataset"
    )


def test_an_iterable_dataset_with_accumulation_is_refused(tmp_path: Path) -> None:
    trainer = build(
        tmp_path,
        variant(accumulation=2),
        max_steps=4,
        trainer_options={"train_dataset": _SavedStream()},
    )
    assert _refusal(trainer) == (
        "_SavedStream is an IterableDataset, whose passes may end inside a window of "
        "gradient_accumulation_steps=2, where no pause can land; use a map-style dataset, or "
        "gradient_accumulation_steps=1"
    )


def test_a_training_loader_of_another_kind_is_refused_naming_the_fix(tmp_path: Path) -> None:
    trainer = build(tmp_path, variant())

    def plain_loader() -> DataLoader:
        return DataLoader(trainer.train_dataset, batch_size=8, collate_fn=trainer.data_collator)

    trainer.get_train_dataloader = plain_loader
    assert _refusal(trainer) == (
        "RecordingResumableTrainer.get_train_dataloader() returns a DataLoader, whose position "
        "a pause cannot save; return super().get_train_dataloader(), or a "
        "trainer_resume.loaders.ResumableDataLoader(..., resumable=True)"
    )
