"""resume() checks every saved state against the live object before it changes anything."""

from __future__ import annotations

import pytest
import torch
from support.trainers import TinyTrainer
from torch import nn

from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.testing import first_difference


class HiddenTrainer(TinyTrainer):
    """A two-layer model whose hidden width is not part of the config (a code change)."""

    hidden = 8

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(11)
        self.model = nn.Sequential(nn.Linear(4, self.hidden), nn.Tanh(), nn.Linear(self.hidden, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)


class Wider(HiddenTrainer):
    hidden = 16


class Narrower(HiddenTrainer):
    hidden = 4


class OptimizerOnly(HiddenTrainer):
    """Saves the optimizer but not the model: only the moment buffers can show the width."""

    def _resume_objects(self):
        return {"optimizer": self.optimizer}


class WiderOptimizerOnly(OptimizerOnly):
    hidden = 16


class TwoGroups(HiddenTrainer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        first, second = self.model[0], self.model[2]
        self.optimizer = torch.optim.Adam(
            [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.001}], lr=0.01
        )


def paused_file(tmp_path, trainer_class=HiddenTrainer, steps=3):
    path = tmp_path / "pause.ckpt"
    source = trainer_class()
    for _ in range(steps):
        source.train_step()
    source.pause(path)
    return path


def assert_refused_untouched_then_trains_exactly(trainer_class, path, match, steps_before=2):
    reference = trainer_class()  # run first: the trainers share the global generators
    expected = [reference.train_step() for _ in range(steps_before + 3)][steps_before:]
    trainer = trainer_class()
    for _ in range(steps_before):
        trainer.train_step()
    before = trainer.state()
    with pytest.raises(ResumeStateMismatchError, match=match):
        trainer.resume(path)
    difference = first_difference(before, trainer.state())
    assert difference is None, difference.describe()
    assert not trainer.locked and not trainer.paused
    losses = [trainer.train_step() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, losses))
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name


def test_wider_model_is_refused_with_every_tensor_untouched_and_trains_on(tmp_path):
    path = paused_file(tmp_path)
    assert_refused_untouched_then_trains_exactly(
        Wider,
        path,
        r"object 'model' \(Sequential\): '0.weight' has shape \[8, 4\] in the checkpoint, \[16, 4\] here",
    )


def test_narrower_model_is_refused_with_every_tensor_untouched_and_trains_on(tmp_path):
    path = paused_file(tmp_path)
    assert_refused_untouched_then_trains_exactly(
        Narrower, path, r"'0.weight' has shape \[8, 4\] in the checkpoint, \[4, 4\] here"
    )


def test_optimizer_moments_of_another_width_are_refused_before_the_first_change(tmp_path):
    path = paused_file(tmp_path, OptimizerOnly)
    assert_refused_untouched_then_trains_exactly(
        WiderOptimizerOnly,
        path,
        r"object 'optimizer' \(Adam\): state 'exp_avg' of parameter 0 has shape \[8, 4\] in the checkpoint, "
        r"\[16, 4\] here",
    )


def test_moments_of_another_width_are_refused_by_a_fresh_optimizer(tmp_path):
    path = paused_file(tmp_path, OptimizerOnly)
    assert_refused_untouched_then_trains_exactly(
        WiderOptimizerOnly,
        path,
        r"state 'exp_avg' of parameter 0 has shape \[8, 4\], the parameter \[16, 4\]",
        steps_before=0,
    )


def test_optimizer_with_other_parameter_groups_is_refused_unchanged(tmp_path):
    path = paused_file(tmp_path, TwoGroups)
    assert_refused_untouched_then_trains_exactly(
        HiddenTrainer, path, "2 parameter groups in the checkpoint, 1 in this optimizer"
    )


def test_model_of_another_dtype_is_refused_unchanged(tmp_path):
    class Double(HiddenTrainer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.model.double()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

        def train_step(self):
            self.batches = [(x.double(), y.double()) for x, y in self.batches]
            return super().train_step()

    path = paused_file(tmp_path)
    assert_refused_untouched_then_trains_exactly(
        Double, path, "'0.weight' has dtype torch.float32 in the checkpoint, torch.float64 here"
    )


def test_grad_scaler_saved_enabled_is_refused_by_a_disabled_one_before_the_model_changes(tmp_path):
    class Scaled(HiddenTrainer):
        enabled = True

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.scaler = torch.amp.GradScaler("cpu", enabled=self.enabled)

        def _resume_objects(self):
            return {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler}

    class Unscaled(Scaled):
        enabled = False

    path = paused_file(tmp_path, Scaled)
    assert_refused_untouched_then_trains_exactly(
        Unscaled,
        path,
        r"object 'scaler' \(GradScaler\): the GradScaler state was saved from an enabled scaler",
    )


def test_extra_state_without_its_load_hook_is_refused_naming_the_hook(tmp_path):
    class NoLoadHook(HiddenTrainer):
        _load_resume_extra_state = TinyTrainer.__mro__[1]._load_resume_extra_state

    path = paused_file(tmp_path)
    assert_refused_untouched_then_trains_exactly(
        NoLoadHook,
        path,
        r"holds extra state \['position'\] but NoLoadHook does not implement _load_resume_extra_state\(state\)",
    )


class RAdamTrainer(HiddenTrainer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.optimizer = torch.optim.RAdam(self.model.parameters(), lr=0.01)


def test_an_optimizer_of_another_class_is_refused_before_its_state_loads_into_its_rule(tmp_path):
    # Adam's moments fit RAdam's state shapes exactly: it would train on, differently.
    path = paused_file(tmp_path)
    assert_refused_untouched_then_trains_exactly(
        RAdamTrainer,
        path,
        r"object 'optimizer' is a torch\.optim\.radam\.RAdam, and the checkpoint holds the "
        r"state of a torch\.optim\.adam\.Adam: .*; build the Adam the paused run had",
    )


class NamedParameters(HiddenTrainer):
    """Its optimizer records the names of its parameters (built from named_parameters())."""

    def named_for_optimizer(self):
        return list(self.model.named_parameters())

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.optimizer = torch.optim.Adam(self.named_for_optimizer(), lr=0.01)


class SameShapes(NamedParameters):
    """Two same-shaped layers: pairing by position is all Optimizer.load_state_dict does."""

    def __init__(self, **kwargs):
        HiddenTrainer.__init__(self, **kwargs)
        torch.manual_seed(11)
        self.model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 2))
        self.optimizer = torch.optim.Adam(self.named_for_optimizer(), lr=0.01)


class SameShapesSwapped(SameShapes):
    def named_for_optimizer(self):
        named = dict(self.model.named_parameters())
        order = ["2.weight", "2.bias", "0.weight", "0.bias", "3.weight", "3.bias"]
        return [(name, named[name]) for name in order]


def test_an_optimizer_whose_named_parameters_come_in_another_order_is_refused(tmp_path):
    path = paused_file(tmp_path, SameShapes)
    assert_refused_untouched_then_trains_exactly(
        SameShapesSwapped,
        path,
        r"object 'optimizer' \(Adam\): parameter group 0, position 0, holds '0.weight' in the "
        r"checkpoint and '2.weight' in this optimizer: .*paused run's order",
    )


def test_an_optimizer_built_from_the_compiled_modules_names_resumes_from_the_plain_ones(tmp_path):
    class CompiledNames(NamedParameters):
        def named_for_optimizer(self):
            # torch.compile compiles at the first forward: its names alone cost nothing.
            return list(torch.compile(self.model).named_parameters())

    path = paused_file(tmp_path, CompiledNames)
    reference = CompiledNames()
    expected = [reference.train_step() for _ in range(6)][3:]
    trainer = NamedParameters()
    trainer.resume(path)
    assert all(
        torch.equal(a, b) for a, b in zip(expected, [trainer.train_step() for _ in range(3)])
    )
