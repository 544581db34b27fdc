"""A Hugging Face Trainer run that survives preemption bit-identically (CPU, a minute).

    python examples/transformers_quickstart.py runs/mlm

Stop it with ``kill -TERM <pid>`` (or ``--preempt-at-step 5`` to have it signal
itself), then run the same command again: it resumes from ``runs/mlm/pause.ckpt`` and
ends with exactly the weights of an uninterrupted run. Once it has finished, the same
command says so and exits 0. Nothing is downloaded: a tiny BERT masked-language model
and its tokenizer are built here; the masking (``DataCollatorForLanguageModeling``),
dropout and two loader workers all draw random numbers.

The change from a plain ``Trainer`` script is one line, marked below.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizer,
    DataCollatorForLanguageModeling,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from trainer_resume import run_finished
from trainer_resume.adapters.transformers import ResumableTrainer

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{index}" for index in range(59))]


class Corpus(Dataset):
    """96 rows of 16 token ids, as a tokenized corpus would give them."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, len(WORDS), (96, 16), generator=generator)
        self.ids[:, 0], self.ids[:, -1] = 2, 3  # [CLS] ... [SEP]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index].clone()}


class PreemptAt(TrainerCallback):
    """Sends this process SIGTERM during the given step, as a cluster would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


def build_trainer(run_dir: Path) -> ResumableTrainer:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tokenizer = BertTokenizer(str(run_dir / "vocab.txt"))
    set_seed(42)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(WORDS),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
        )
    )
    arguments = TrainingArguments(
        output_dir=str(run_dir / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=2e-3,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=2,
        seed=42,
    )
    return ResumableTrainer(  # was: Trainer(
        model=model,
        args=arguments,
        train_dataset=Corpus(),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.2),
        pause_path=run_dir / "pause.ckpt",  # the one argument added
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="where the pause file and weights go")
    parser.add_argument(
        "--preempt-at-step", type=int, default=None, help="send SIGTERM to itself during this step"
    )
    options = parser.parse_args(argv)
    if run_finished(options.run_dir / "pause.ckpt") is not None:
        print(f"the run in {options.run_dir} is finished; weights in final_weights.pt")
        return
    trainer = build_trainer(options.run_dir)
    if options.preempt_at_step is not None:
        trainer.add_callback(PreemptAt(options.preempt_at_step))
    trainer.train()
    if trainer.paused:
        print(f"paused after step {trainer.state.global_step}; run the same command to continue")
        return
    torch.save(trainer.model.state_dict(), options.run_dir / "final_weights.pt")
    print(f"finished {trainer.state.global_step} steps")


if __name__ == "__main__":
    main()
