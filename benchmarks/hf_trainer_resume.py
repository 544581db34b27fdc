"""A Hugging Face Trainer run interrupted and resumed: the Trainer's own resume against
``ResumableTrainer``.

One ``transformers`` 5.24 run (a small ``BertForMaskedLM`` with dropout on CPU,
``DataCollatorForLanguageModeling`` masking from the global generator, 2 loader
workers, gradient accumulation 2, 12 batches of 8 per epoch, 2 epochs) is run

* uninterrupted (the reference: every micro-batch's loss, the final weights);
* with the Trainer's own recipe: ``save_strategy="steps"``, ``save_steps=K``; after
  checkpoint ``K`` is written (mid-epoch) the process gets SIGTERM, as a preempted job
  does, and dies (the Trainer has no handler); a new process runs
  ``train(resume_from_checkpoint=True)``;
* with ``ResumableTrainer``: SIGTERM to the process group during step ``K``; the pause
  lands at its end and ``train()`` returns; a new process runs the same ``train()``.

Reported per method: whether the resumed run's losses and final weights equal its own
uninterrupted run's bit for bit, the first optimizer step whose loss differs, the
largest weight difference at the end, the pause time (the Trainer's
``_save_checkpoint`` at step ``K``; ``ResumableTrainer.pause``), repeated ``--repeats``
times in the interrupted process, and the resume time (in a fresh process, from
``train()`` called to the first resumed micro-batch: reading the checkpoint and
restoring everything included; one fresh process per repeat).

    python -m benchmarks.hf_trainer_resume --quick   # ~0.5M parameters, 3 repeats
    python -m benchmarks.hf_trainer_resume           # ~7.4M parameters, 5 repeats

Prints a table and writes benchmarks/out/hf_trainer_resume.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    framework_resume_result,
    max_weight_difference,
    report_framework_resume,
)

BATCHES, BATCH, LENGTH, EPOCHS, ACCUMULATION, WORKERS = 12, 8, 32, 2, 2, 2
INTERRUPT_AT = 4  # the optimizer step after which both resume: mid-epoch, batch 8 of 12
SIZES = {"quick": (128, 2, 1000), "full": (256, 8, 4000)}  # (hidden size, layers, vocabulary)
METHODS = {
    "trainer": "Trainer: save_steps + train(resume_from_checkpoint=True)",
    "resumable": "ResumableTrainer: pause on SIGTERM + the same train()",
}
RESULT_PREFIX = "HF_TRAINER_RESUME_RESULT "


def _trainer(method: str, folder: Path, size: tuple[int, int, int], phase: str) -> Any:
    """The run's trainer, recording every micro-batch's loss and the resume's first batch."""
    import torch
    from torch.utils.data import Dataset
    from transformers import (
        BertForMaskedLM,
        BertTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from trainer_resume.adapters.transformers import ResumableTrainer

    vocabulary = size[2]
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [f"w{index}" for index in range(vocabulary - len(words))]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")

    class Rows(Dataset):
        def __init__(self) -> None:
            generator = torch.Generator().manual_seed(1)
            self.ids = torch.randint(5, vocabulary, (BATCHES * BATCH, LENGTH), generator=generator)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": self.ids[index].clone()}

    base = ResumableTrainer if method == "resumable" else Trainer

    class Measured(base):  # type: ignore[valid-type, misc]
        losses: list[float]
        saves: list[float]
        first_batch_s: float | None = None
        started = 0.0

        def train(self, *args: Any, **kwargs: Any) -> Any:
            self.started = time.perf_counter()
            return super().train(*args, **kwargs)

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            if self.first_batch_s is None:
                self.first_batch_s = time.perf_counter() - self.started
            if phase == "interrupt" and method == "resumable":
                if len(self.losses) == (INTERRUPT_AT - 1) * ACCUMULATION:
                    os.killpg(os.getpgrp(), signal.SIGTERM)  # during step INTERRUPT_AT
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.losses.append(loss.item())
            return loss

        def pause(self, path: Any) -> None:
            begin = time.perf_counter()
            super().pause(path)
            self.saves.append(time.perf_counter() - begin)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            begin = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.saves.append(time.perf_counter() - begin)

    set_seed(0)
    model = BertForMaskedLM(_config(size))
    saving = method == "trainer" and phase != "reference"
    arguments = TrainingArguments(
        output_dir=str(folder / "out"),
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps" if saving else "no",
        save_steps=INTERRUPT_AT,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=WORKERS,
        seed=0,
    )
    options: dict[str, Any] = {
        "model": model,
        "args": arguments,
        "train_dataset": Rows(),
        "data_collator": DataCollatorForLanguageModeling(
            BertTokenizer(str(folder / "vocab.txt")), mlm_probability=0.15
        ),
    }
    if method == "resumable":
        options["pause_path"] = folder / "pause.ckpt"
    trainer = Measured(**options)
    trainer.losses, trainer.saves = [], []
    return trainer


def _weights(trainer: Any) -> dict[str, Any]:
    return {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}


def _child(phase: str, method: str, size: tuple[int, int, int], folder: Path, repeats: int) -> None:
    import torch
    from transformers import TrainerCallback

    trainer = _trainer(method, folder, size, phase)
    if phase == "interrupt" and method == "trainer":

        class DieAfterCheckpoint(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                for _ in range(repeats - 1):  # more samples of the same save
                    trainer._save_checkpoint(trainer.model_wrapped, None)
                print(RESULT_PREFIX + json.dumps({"pause_s": trainer.saves}), flush=True)
                os.killpg(os.getpgrp(), signal.SIGTERM)  # the preemption: no handler, it dies

        trainer.add_callback(DieAfterCheckpoint())
    resume = {"resume_from_checkpoint": True} if phase == "resume" and method == "trainer" else {}
    trainer.train(**resume)
    result: dict[str, Any] = {"losses": trainer.losses}
    if phase == "interrupt":  # ResumableTrainer paused: more samples of the same pause
        for repeat in range(1, repeats):
            trainer.pause(folder / f"pause-{repeat}.ckpt")
        result["pause_s"] = trainer.saves
    if phase == "resume":
        result["resume_s"] = trainer.first_batch_s
    torch.save(_weights(trainer), folder / f"{phase}-weights.pt")
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def _run(arguments: list[str], timeout: float, *, dies: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.hf_trainer_resume", "--child", *arguments]
    done = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,  # its SIGTERM goes to its own process group only
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    ended = done.returncode == -signal.SIGTERM if dies else done.returncode == 0
    if not ended or not lines:
        raise RuntimeError(f"{arguments} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def _first_differing_step(expected: list[float], got: list[float]) -> int | None:
    """The optimizer step of the first resumed micro-batch whose loss differs."""
    for number, (mine, theirs) in enumerate(zip(got, expected)):
        if mine != theirs:
            return INTERRUPT_AT + 1 + number // ACCUMULATION
    if len(got) != len(expected):
        return INTERRUPT_AT + 1 + min(len(got), len(expected)) // ACCUMULATION
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument("--child", nargs=5, metavar=("PHASE", "METHOD", "SIZE", "DIR", "R"))
    args = parser.parse_args(argv)
    if args.child:
        phase, method, size, folder, repeats = args.child
        _quiet()
        _child(phase, method, SIZES[size], Path(folder), int(repeats))
        return 0
    size = "quick" if args.quick else "full"
    repeats = args.repeats or (3 if args.quick else 5)
    scratch = Path(tempfile.mkdtemp(prefix="hf-trainer-resume-"))
    methods: dict[str, Any] = {}
    try:
        for method in METHODS:
            # Each method against its own uninterrupted run: the two loaders order the
            # batches differently.
            folder = scratch / method
            reference = _run(
                ["reference", method, size, str(folder / "reference"), "0"], args.timeout
            )
            run = folder / "run"
            paused = _run(
                ["interrupt", method, size, str(run), str(repeats)],
                args.timeout,
                dies=method == "trainer",
            )
            resumes = []
            for repeat in range(repeats):
                # A fresh copy of the interrupted run each time: a resume that completes
                # retires the pause file (and the Trainer writes new checkpoints).
                copy = folder / f"resume-{repeat}"
                shutil.copytree(run, copy)
                resumes.append(_run(["resume", method, size, str(copy), "0"], args.timeout))
            expected = reference["losses"][INTERRUPT_AT * ACCUMULATION :]
            first = _first_differing_step(expected, resumes[0]["losses"])
            weights = max_weight_difference(
                folder / "reference" / "reference-weights.pt",
                folder / "resume-0" / "resume-weights.pt",
            )
            methods[method] = framework_resume_result(
                METHODS[method],
                paused["pause_s"],
                [result["resume_s"] for result in resumes],
                first,
                weights,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    parameters = _parameters(SIZES[size])
    steps = EPOCHS * BATCHES // ACCUMULATION
    report_framework_resume(
        "hf_trainer_resume",
        f"Hugging Face Trainer, BertForMaskedLM {parameters / 1e6:.2f}M parameters, MLM collator, "
        f"{WORKERS} workers, accumulation {ACCUMULATION}, {steps} steps, resumed after step "
        f"{INTERRUPT_AT} (mid-epoch); medians of {repeats}",
        "step",
        methods,
        parameters=parameters,
        steps=steps,
        interrupted_after=INTERRUPT_AT,
        accumulation=ACCUMULATION,
        repeats=repeats,
    )
    return 0


def _quiet() -> None:
    import warnings

    warnings.simplefilter("ignore")  # transformers' deprecation notes are not measured
    # Trainer.train() starts with a full gc.collect() (accelerate's free_memory); the
    # imported modules kept out of it, it costs the same in both methods and little.
    gc.freeze()


def _config(size: tuple[int, int, int]) -> Any:
    from transformers import BertConfig

    hidden, layers, vocabulary = size
    return BertConfig(
        vocab_size=vocabulary,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=LENGTH,
    )


def _parameters(size: tuple[int, int, int]) -> int:
    from transformers import BertForMaskedLM

    return sum(parameter.numel() for parameter in BertForMaskedLM(_config(size)).parameters())


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
