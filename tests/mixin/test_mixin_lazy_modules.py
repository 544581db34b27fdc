"""A model with lazy modules (``nn.LazyLinear``) resumes into a fresh one, not yet run."""

from __future__ import annotations

import pytest
import torch
from support.trainers import TinyTrainer
from torch import nn

from trainer_resume.errors import UnsupportedResumeConfigurationError


class LazyTrainer(TinyTrainer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(5)
        # Materialized at the first forward, from the global generator a pause saves.
        self.model = nn.Sequential(nn.LazyLinear(8), nn.Tanh(), nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)


def test_a_lazy_model_resumes_into_a_fresh_lazy_model_exactly(tmp_path):
    reference = LazyTrainer()
    expected = [reference.train_step() for _ in range(6)]
    paused = LazyTrainer()
    for _ in range(3):
        paused.train_step()
    paused.pause(tmp_path / "pause.ckpt")
    resumed = LazyTrainer()  # its LazyLinear has not run: no shapes yet
    resumed.resume(tmp_path / "pause.ckpt")
    losses = [resumed.train_step() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected[3:], losses, strict=True))
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    final = resumed.optimizer.state_dict()["state"]
    for index, entries in reference.optimizer.state_dict()["state"].items():
        assert torch.equal(entries["exp_avg"], final[index]["exp_avg"]), index


def test_a_pause_before_a_lazy_module_ran_is_refused_naming_it_and_a_step_lets_it_pause(tmp_path):
    trainer = LazyTrainer()
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"'0.weight' belongs to a lazy"):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not (tmp_path / "pause.ckpt").exists() and not trainer.paused
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    assert trainer.paused
