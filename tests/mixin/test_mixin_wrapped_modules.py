"""A model returned compiled, DataParallel-wrapped, both or neither pauses and resumes in any
combination: the pause file holds the unwrapped module's names.

The steps run eager here; a compiled wrapping is an ``OptimizedModule`` that is never
called (``support.wrapped_trainers``), which has a compiled module's names. So every
combination must continue bit-identically to the uninterrupted run. Compiled steps are
tested in ``test_mixin_compiled.py``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from support.wrapped_trainers import PAUSE_STEP, STEPS, WRAPPINGS, WrappedTrainer, plain_module
from torch import nn

from trainer_resume import ResumePoints
from trainer_resume.durable import load_checkpoint
from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.testing import first_difference


@cache
def _uninterrupted() -> dict[str, Any]:
    trainer = WrappedTrainer()
    trainer.run_to(STEPS)
    trainer.loader.close()
    return trainer.outcome()


def _paused(path: Path, wrapping: str) -> dict[str, Any]:
    trainer = WrappedTrainer(wrapping)
    trainer.run_to(PAUSE_STEP)
    trainer.pause(path)
    trainer.loader.close()
    return trainer.outcome()


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


@pytest.mark.parametrize("resumed_wrapping", WRAPPINGS)
@pytest.mark.parametrize("paused_wrapping", WRAPPINGS)
def test_a_pause_resumes_bitwise_equal_however_the_model_is_wrapped_at_pause_and_at_resume(
    tmp_path, paused_wrapping, resumed_wrapping
):
    paused = _paused(tmp_path / "pause.ckpt", paused_wrapping)
    torch.rand(3)  # a missing RNG restore must not pass by luck
    resumed = WrappedTrainer(resumed_wrapping)
    resumed.resume(tmp_path / "pause.ckpt")
    at_resume = resumed.outcome()
    # Every parameter has its own weights, gradient and AdamW moments back.
    for entry in ("model", "gradients", "moments", "optimizer", "scheduler", "rng"):
        _assert_same(paused[entry], at_resume[entry], entry)
    resumed.run_to(STEPS)
    resumed.loader.close()
    expected = _uninterrupted()
    _assert_same({**expected, "losses": expected["losses"][PAUSE_STEP:]}, resumed.outcome(), "run")


@pytest.mark.parametrize("wrapping", WRAPPINGS)
def test_the_pause_file_names_weights_and_gradients_as_the_unwrapped_module(tmp_path, wrapping):
    _paused(tmp_path / "pause.ckpt", wrapping)
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    plain = plain_module()
    assert list(checkpoint["objects"]["model"]) == list(plain.state_dict())
    assert list(checkpoint["gradients"]["model"]) == [name for name, _ in plain.named_parameters()]


class Holder(nn.Module):
    """A module of the user's own around the model (not a wrapper the library knows)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net


class HeldTrainer(WrappedTrainer):
    def _resume_objects(self) -> dict[str, Any]:
        return {**super()._resume_objects(), "model": Holder(self.module)}


def test_a_model_inside_a_module_of_its_own_is_refused_naming_the_first_keys_and_the_prefix(
    tmp_path,
):
    _paused(tmp_path / "pause.ckpt", "compiled")
    trainer = HeldTrainer()
    before = trainer.outcome()
    with pytest.raises(ResumeStateMismatchError) as refused:
        trainer.resume(tmp_path / "pause.ckpt")
    message = str(refused.value)
    assert message.startswith("[330] ")
    assert "first differing keys: '0.weight' in the checkpoint, 'net.0.weight' in this model" in (
        message
    )
    assert "every differing key has the prefix 'net.' more in this model" in message
    _assert_same(before, trainer.outcome(), "the refused trainer")
    assert not trainer.locked


class SharedTrainer(WrappedTrainer):
    """Stores its usual checkpoint once: the model's entry is shared with the resume object."""

    def _regular_checkpoint(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "completed": self.completed_steps}

    def _resume_shared_keys(self) -> list[str]:
        return ["model"]


def test_a_shared_entry_of_a_wrapped_model_is_stored_under_the_unwrapped_names(tmp_path):
    trainer = SharedTrainer("compiled+parallel")
    trainer.run_to(PAUSE_STEP)
    trainer.pause(tmp_path / "pause.ckpt")
    trainer.loader.close()
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    assert list(checkpoint["regular"]["model"]) == list(plain_module().state_dict())
    resumed = SharedTrainer("plain")
    resumed.resume(tmp_path / "pause.ckpt")
    resumed.run_to(STEPS)
    resumed.loader.close()
    expected = _uninterrupted()
    _assert_same({**expected, "losses": expected["losses"][PAUSE_STEP:]}, resumed.outcome(), "run")


def test_a_resume_point_of_a_wrapped_model_resumes_bitwise_equal_into_the_plain_one(tmp_path):
    points = ResumePoints(tmp_path / "points", every_steps=PAUSE_STEP, when_busy="wait")
    trainer = WrappedTrainer("compiled+parallel", resume_points=points)
    trainer.run_to(PAUSE_STEP)
    points.wait()
    trainer.loader.close()
    resumed = WrappedTrainer()
    resumed.resume_latest(tmp_path / "points")
    assert resumed.completed_steps == PAUSE_STEP
    resumed.run_to(STEPS)
    resumed.loader.close()
    expected = _uninterrupted()
    _assert_same({**expected, "losses": expected["losses"][PAUSE_STEP:]}, resumed.outcome(), "run")
