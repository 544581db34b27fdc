"""A module's modes (eval submodules, frozen parameters) resume as they were at the pause."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.trainers import TinyTrainer
from torch import nn

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeStateMismatchError

FREEZE_AT, PAUSE_AT, STEPS = 3, 5, 9


class FineTuning(TinyTrainer):
    """At step 3 its loop freezes the first layer and puts the BatchNorm in eval mode, once
    (a fine-tuning schedule): a resume after step 3 must find them so."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(11)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def step(self) -> torch.Tensor:
        if self.completed_steps == FREEZE_AT:
            self.model[0].requires_grad_(False)
            self.model[1].eval()
        return self.train_step()


def _run(trainer: FineTuning, steps: int) -> list[torch.Tensor]:
    return [trainer.step() for _ in range(steps - trainer.completed_steps)]


def _modes(module: nn.Module) -> tuple[list[bool], list[bool]]:
    return [m.training for m in module.modules()], [p.requires_grad for p in module.parameters()]


def _resumed_as_uninterrupted(kind: type[FineTuning], tmp_path: Path) -> FineTuning:
    """Paused at ``PAUSE_AT``, resumed in a fresh trainer: its modes right after the resume,
    its losses and its final weights are the uninterrupted run's."""
    reference = kind()
    expected = _run(reference, STEPS)
    paused = kind()
    _run(paused, PAUSE_AT)
    paused.pause(tmp_path / "pause.ckpt")
    resumed = kind()
    resumed.resume(tmp_path / "pause.ckpt")
    assert _modes(resumed.model) == _modes(reference.model)
    norms = [m.track_running_stats for m in resumed.model.modules() if hasattr(m, "running_mean")]
    losses = _run(resumed, STEPS)
    assert all(torch.equal(a, b) for a, b in zip(expected[PAUSE_AT:], losses, strict=True))
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    assert norms == [
        m.track_running_stats for m in reference.model.modules() if hasattr(m, "running_mean")
    ]
    return resumed


def test_a_layer_frozen_and_a_batchnorm_in_eval_mode_before_the_pause_stay_so(tmp_path):
    _resumed_as_uninterrupted(FineTuning, tmp_path)


def test_a_pause_before_the_freeze_resumes_everything_trainable_and_in_train_mode(tmp_path):
    paused = FineTuning()
    _run(paused, FREEZE_AT - 1)
    paused.pause(tmp_path / "pause.ckpt")
    resumed = FineTuning()
    resumed.model.eval()  # whatever the new process set up, the pause's modes win
    resumed.model[3].requires_grad_(False)
    resumed.resume(tmp_path / "pause.ckpt")
    assert _modes(resumed.model) == ([True] * 5, [True] * 6)


def _edited_pause(tmp_path, edit) -> Path:
    """A pause after the freeze, its content changed by ``edit`` and written again."""
    paused = FineTuning()
    _run(paused, PAUSE_AT)
    paused.pause(tmp_path / "pause.ckpt")
    content = load_checkpoint(tmp_path / "pause.ckpt")
    edit(content)
    save_checkpoint(content, tmp_path / "edited.ckpt")
    return tmp_path / "edited.ckpt"


def test_a_pause_of_an_earlier_release_leaves_the_modes_as_they_are(tmp_path):
    def as_earlier_releases_wrote_it(content):
        del content["module_modes"], content["object_classes"]

    resumed = FineTuning()
    resumed.resume(_edited_pause(tmp_path, as_earlier_releases_wrote_it))
    assert _modes(resumed.model) == ([True] * 5, [True] * 6)


def test_modes_naming_a_submodule_the_module_lacks_are_refused_before_anything_changes(tmp_path):
    def a_submodule_this_model_lacks(content):
        content["module_modes"]["model"]["eval"].append("4")

    path = _edited_pause(tmp_path, a_submodule_this_model_lacks)
    resumed = FineTuning()
    before = resumed.model.state_dict()
    with pytest.raises(ResumeStateMismatchError, match=r"submodule '4' was in eval mode"):
        resumed.resume(path)
    for name, value in before.items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


class FrozenStatistics(FineTuning):
    """At step 3 its loop stops the BatchNorm tracking running statistics, once (as
    Lightning's BaseFinetuning freezes a BatchNorm): a resume after step 3 must find it so."""

    def step(self) -> torch.Tensor:
        if self.completed_steps == FREEZE_AT:
            self.model[1].track_running_stats = False
        return self.train_step()


def test_a_batchnorm_that_stopped_tracking_running_statistics_resumes_so(tmp_path):
    _resumed_as_uninterrupted(FrozenStatistics, tmp_path)


def test_untracked_statistics_naming_a_layer_that_is_no_normalization_are_refused(tmp_path):
    def a_linear_layer_named(content):
        content["module_modes"]["model"]["untracked"] = ["0"]

    path = _edited_pause(tmp_path, a_linear_layer_named)
    with pytest.raises(ResumeStateMismatchError, match=r"normalization layer '0' tracked no"):
        FineTuning().resume(path)


class Tied(FineTuning):
    """A weight tied to another layer's and a BatchNorm used at two places (each reached
    under two names), frozen and put in eval mode at step 3 through their second names."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        shared = nn.BatchNorm1d(8)
        self.model = nn.Sequential(
            nn.Linear(4, 8), shared, nn.Tanh(), nn.Linear(8, 8), shared, nn.Linear(8, 8),
            nn.Tanh(), nn.Linear(8, 2),
        )  # fmt: skip
        self.model[5].weight = self.model[3].weight
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def step(self) -> torch.Tensor:
        if self.completed_steps == FREEZE_AT:
            self.model[5].weight.requires_grad_(False)
            self.model[4].eval()
        return self.train_step()


def test_a_tied_weight_frozen_and_a_shared_batchnorm_in_eval_mode_resume_so(tmp_path):
    resumed = _resumed_as_uninterrupted(Tied, tmp_path)
    assert not resumed.model[1].training and not resumed.model[3].weight.requires_grad
