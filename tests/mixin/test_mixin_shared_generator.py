"""A generator passed to a loader (``generator=g``) that something else draws from too:
another loader given the same one, or the loop itself. A pause inside an epoch keeps
``g`` where it was, and the epoch's order is recomputed on a copy of it.

The resume set ``g`` back to where the loader's epoch began, to recompute the order
from it: the other loader's draws since, or the loop's (restored in its extra state
before that), were undone, and the next epochs drew other orders, silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.loaders import ResumableDataLoader

EPOCHS = 3


class SharingLoaders(TrainingResumeMixin):
    """Two shuffled loaders over one generator; the second read once per step, its
    iterator made again when it runs out. With ``loop_draws``, the step draws from the
    generator too and the trainer saves its state."""

    def __init__(self, loop_draws: bool = False) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.generator = torch.Generator().manual_seed(0)
        self.loop_draws = loop_draws
        self.train = ResumableDataLoader(
            TensorDataset(torch.arange(10.0)),
            batch_size=3,
            shuffle=True,
            generator=self.generator,
            resumable=True,
        )
        self.aux = ResumableDataLoader(
            TensorDataset(torch.arange(100.0, 107.0)),
            batch_size=2,
            shuffle=True,
            generator=self.generator,
            resumable=True,
        )
        self.aux_batches: Any = None  # made at the first step that reads it
        self._initialize_training_resume({"loop_draws": loop_draws}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.train, "aux": self.aux}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def _rebuild_resume_iterators(self) -> None:
        self.aux_batches = None

    def _next_aux(self) -> Any:
        if self.aux_batches is not None:
            try:
                return next(self.aux_batches)
            except StopIteration:
                pass
        self.aux_batches = iter(self.aux)
        return next(self.aux_batches)

    @training_step
    def step(self, batch: Any) -> torch.Tensor:
        aux = self._next_aux()
        noise = torch.rand(1, generator=self.generator) if self.loop_draws else torch.zeros(1)
        inputs = torch.cat([batch[0], aux[0]])[:, None] + noise
        loss = self.model(inputs).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return torch.cat([batch[0], aux[0], noise])


def _run(trainer: SharingLoaders, pause: tuple[int, Path] | None = None) -> list[torch.Tensor]:
    seen = []
    for _ in range(trainer.train.epoch, EPOCHS):
        for batch in trainer.train:
            seen.append(trainer.step(batch))
            if pause is not None and trainer.completed_steps == pause[0]:
                trainer.pause(pause[1])
                return seen
    return seen


# Steps 5 and 6: inside an epoch of both loaders (the train loader's second, 4 steps
# each); 2: inside both first epochs; 4: the train loader's epoch end.
@pytest.mark.parametrize("loop_draws", [False, True], ids=["two-loaders", "and-the-loop"])
@pytest.mark.parametrize("step", [2, 4, 5, 6])
def test_a_generator_shared_with_another_loader_or_the_loop_resumes_where_it_was(
    tmp_path: Path, loop_draws: bool, step: int
) -> None:
    reference = SharingLoaders(loop_draws)
    expected = _run(reference)
    paused = SharingLoaders(loop_draws)
    first = _run(paused, (step, tmp_path / "pause.ckpt"))
    resumed = SharingLoaders(loop_draws)
    resumed.resume(tmp_path / "pause.ckpt")
    rest = _run(resumed)
    got = first + rest
    assert len(got) == len(expected)
    for number, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"step {number + 1}: {a.tolist()} != {b.tolist()}"
    assert torch.equal(resumed.model.weight, reference.model.weight)
    assert torch.equal(resumed.generator.get_state(), reference.generator.get_state())


def test_a_position_resumed_and_paused_again_before_it_is_read_keeps_its_epochs_order(
    tmp_path: Path,
) -> None:
    # Its generator now holds where it was at the position, not where its epoch began.
    reference = SharingLoaders(loop_draws=True)
    expected = _run(reference)
    first = _run(SharingLoaders(loop_draws=True), (5, tmp_path / "first.ckpt"))
    again = SharingLoaders(loop_draws=True)
    again.resume(tmp_path / "first.ckpt")
    again.pause(tmp_path / "again.ckpt")
    resumed = SharingLoaders(loop_draws=True)
    resumed.resume(tmp_path / "again.ckpt")
    got = first + _run(resumed)
    assert len(got) == len(expected)
    for number, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"step {number + 1}: {a.tolist()} != {b.tolist()}"
    assert torch.equal(resumed.model.weight, reference.model.weight)
