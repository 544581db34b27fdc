"""Trainers whose ``_resume_loaders()`` returns a loader from elsewhere: torchdata's
``StatefulDataLoader``, or any loader given.

``python -m support.foreign_loaders resume PAUSE OUT`` resumes a pause file in a
fresh process and saves the outcome (``resume-epoch-loop``: the trainer holds no
iterator; the loop iterates the loader itself, as the documented epoch loop).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from trainer_resume import declare_no_random_draws
from trainer_resume.mixin import TrainingResumeMixin, training_step

STEPS, PAUSE = 10, 5  # 4 batches per epoch: the pause falls mid-epoch


class StatefulLoaderTrainer(TrainingResumeMixin):
    """Shuffled epochs from a ``StatefulDataLoader`` (its samples draw no random numbers)."""

    def __init__(self, *, holds_iterator: bool = True) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Linear(8, 1))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        data = torch.Generator().manual_seed(1)
        dataset = TensorDataset(
            torch.randn(16, 3, generator=data), torch.randn(16, 1, generator=data)
        )
        # No generator of its own: its shuffle draws from torch's global generator, which
        # the pause saves (with a generator, StatefulDataLoader 0.11 resumes the next epoch
        # in another order than an uninterrupted run).
        self.loader = StatefulDataLoader(dataset, batch_size=4, shuffle=True)
        self.batches = iter(self.loader) if holds_iterator else None
        self.losses: dict[int, torch.Tensor] = {}
        # The iterator's position is the loader's state (saved); it is rebuilt after a resume.
        self._initialize_training_resume(
            {"loader": "stateful"}, version="1", excluded_attributes=("batches",)
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        # Its samples draw no random numbers: its own state_dict() resumes it exactly.
        return {"train": declare_no_random_draws(self.loader)}

    def _rebuild_resume_iterators(self) -> None:
        if self.batches is not None:
            self.batches = iter(self.loader)

    def next_batch(self) -> Any:
        try:
            return next(self.batches)
        except StopIteration:  # the next epoch
            self.batches = iter(self.loader)
            return next(self.batches)

    @training_step
    def step(self, batch: Any = None) -> None:
        x, y = self.next_batch() if batch is None else batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.losses[self.completed_steps + 1] = loss.detach()


class LoaderTrainer(TrainingResumeMixin):
    """Returns whatever loader it is given under the name ``train``; a step only runs."""

    def __init__(self, loader: Any, **held: Any) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1)
        self.loader = loader
        self.__dict__.update(held)
        self._initialize_training_resume({}, version="1", excluded_attributes=tuple(held))

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self) -> None:
        self.ran = True


def run(trainer: StatefulLoaderTrainer, steps: int) -> None:
    while trainer.completed_steps < steps:
        trainer.step()


def run_epoch_loop(trainer: StatefulLoaderTrainer, steps: int) -> None:
    """The epoch loop: ``for batch in loader`` (a resumed epoch continues mid-way)."""
    while trainer.completed_steps < steps:
        for batch in trainer.loader:
            trainer.step(batch)
            if trainer.completed_steps == steps:
                return


def outcome(trainer: StatefulLoaderTrainer, after: int = 0) -> dict[str, Any]:
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "losses": {k: v for k, v in trainer.losses.items() if k > after},
        "rng_after": torch.rand(2),
    }


def main(argv: list[str]) -> int:
    mode, pause, out = argv
    if mode not in ("resume", "resume-epoch-loop"):
        raise SystemExit(f"unknown mode {mode!r}")
    warnings.simplefilter("ignore")
    epoch_loop = mode == "resume-epoch-loop"
    trainer = StatefulLoaderTrainer(holds_iterator=not epoch_loop)
    torch.rand(3)  # a missing RNG restore must not pass by luck
    trainer.resume(pause)
    start = trainer.completed_steps
    (run_epoch_loop if epoch_loop else run)(trainer, STEPS)
    torch.save({"outcome": outcome(trainer, start), "start": start}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
