"""Tensors a trainer holds (directly, or in dicts and lists) that change between steps and
that no hook returns are warned about, like other unsaved state: changed in place,
through ``.data``, or replaced by a new tensor."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from support.trainers import TinyTrainer

from trainer_resume import UnsavedStateWarning
from trainer_resume.mixin import training_step


def _text(label: str, attribute: str) -> str:
    return (
        f"EmaTrainer.{label} is a tensor that changed between steps and no hook returns it: "
        "pause() does not save it and resume() does not restore it, so a resumed run would "
        "differ; return it from _resume_extra_state() (and restore it in "
        f"_load_resume_extra_state), or name {attribute!r} in "
        "_initialize_training_resume(..., excluded_attributes=...) if leaving it out is intended"
    )


class EmaTrainer(TinyTrainer):
    """Keeps an EMA of the weights in a dict, updated the way ``update`` says."""

    update = "rebind"

    def __init__(self, **kwargs: Any) -> None:
        self.ema = {"weight": self_weight_copy()}
        self.running = [torch.zeros(2)]
        self.constant = torch.ones(3)  # held, never changed: not reported
        super().__init__(**kwargs)

    @training_step
    def train_step(self) -> torch.Tensor:
        loss = super().train_step()
        weight = self.model.weight.detach()
        if self.update == "rebind":
            self.ema["weight"] = self.ema["weight"] * 0.9 + 0.1 * weight
        elif self.update == "data":
            self.ema["weight"].data.copy_(weight)  # the version counter does not move
        else:
            self.ema["weight"].mul_(0.9).add_(0.1 * weight)
        return loss


def self_weight_copy() -> torch.Tensor:
    return torch.zeros(2, 4)


def _warnings(trainer: EmaTrainer, steps: int = 3) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            trainer.train_step()
    assert all(issubclass(w.category, UnsavedStateWarning) for w in caught)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("update", ["rebind", "data", "in_place"])
def test_a_tensor_in_a_dict_that_changes_between_steps_is_warned_about_once(update: str) -> None:
    class Trainer(EmaTrainer):
        pass

    Trainer.update = update
    Trainer.__name__ = "EmaTrainer"
    assert _warnings(Trainer()) == [_text("ema['weight']", "ema")]


def test_tensors_returned_as_extra_state_or_excluded_are_not_warned_about() -> None:
    class Saved(EmaTrainer):
        def _resume_extra_state(self) -> dict[str, Any]:
            return {**super()._resume_extra_state(), "ema": self.ema}

        def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
            super()._load_resume_extra_state(state)
            self.ema = state["ema"]

    assert _warnings(Saved()) == []

    class Excluded(EmaTrainer):
        def _initialize_training_resume(self, config: Any, **kwargs: Any) -> None:
            super()._initialize_training_resume(config, excluded_attributes=("ema",), **kwargs)

    assert _warnings(Excluded()) == []


class CountingLinear(torch.nn.Linear):
    """A module with a buffer state_dict() leaves out (persistent=False) that forward changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("calls", torch.zeros(()), persistent=False)
        self.register_buffer("table", torch.arange(4.0), persistent=False)  # a cache: unchanged

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(inputs) * (1 + self.calls / 10)


class BufferTrainer(TinyTrainer):
    excluded: tuple[str, ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        torch.manual_seed(3)
        self.model = CountingLinear(4, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def _initialize_training_resume(self, config: Any, **kwargs: Any) -> None:
        super()._initialize_training_resume(config, excluded_attributes=self.excluded, **kwargs)


def test_a_module_buffer_left_out_of_state_dict_that_changes_between_steps_is_warned_about() -> (
    None
):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = BufferTrainer()
        for _ in range(3):
            trainer.train_step()
    messages = [str(w.message) for w in caught if issubclass(w.category, UnsavedStateWarning)]
    assert messages == [
        "BufferTrainer._resume_objects()['model'] has a buffer 'calls' that is not persistent "
        "(register_buffer(..., persistent=False)) and changed between steps: state_dict() "
        "leaves it out, so pause() does not save it and a resumed run would differ; register "
        "it with persistent=True, or return it from _resume_extra_state() (and restore it in "
        "_load_resume_extra_state), or name 'model.calls' in "
        "_initialize_training_resume(..., excluded_attributes=...) if it is a cache that every "
        "run computes alike"
    ]


def test_a_buffer_named_in_excluded_attributes_is_not_warned_about() -> None:
    class Excluded(BufferTrainer):
        excluded = ("model.calls",)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsavedStateWarning)
        trainer = Excluded()
        for _ in range(3):
            trainer.train_step()


def test_buffers_are_named_and_excluded_under_the_unwrapped_modules_names() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    class Wrapped(BufferTrainer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            # checkpoint_wrapper's state_dict() leaves its own part out of the keys, where
            # named_buffers() keeps it: a persistent BatchNorm buffer is not reported.
            self.model = torch.nn.Sequential(
                checkpoint_wrapper(CountingLinear(4, 2)),
                checkpoint_wrapper(torch.nn.BatchNorm1d(2)),
            )
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def warned(trainer_class: type[BufferTrainer]) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = trainer_class()
            for _ in range(3):
                trainer.train_step()
        return [str(w.message) for w in caught if issubclass(w.category, UnsavedStateWarning)]

    messages = warned(Wrapped)
    assert len(messages) == 1 and "has a buffer '0.calls' that is not persistent" in messages[0]

    class Excluded(Wrapped):
        excluded = ("model.0.calls",)

    assert warned(Excluded) == []
