"""What ``fabric.setup`` returns works as resume objects: the ``_FabricModule`` under the model's
own names (its gradients too), the ``_FabricOptimizer`` through its strategy, and the precision
plugin's GradScaler, which a trainer must not leave out."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning_fabric import Fabric
from lightning_fabric.plugins import MixedPrecision
from lightning_fabric.wrappers import _FabricModule
from torch import nn

from trainer_resume import TrainingResumeMixin, load_checkpoint, training_step
from trainer_resume._module_names import (
    canonical_parameters,
    canonical_state,
    live_state,
    loading_module,
    match_names,
)
from trainer_resume.adapters.fabric import resume_objects
from trainer_resume.errors import UnsupportedResumeConfigurationError

NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def test_a_fabric_module_names_its_parameters_as_the_model_does_also_around_a_parallel_wrapper():
    fabric = Fabric(accelerator="cpu", devices=1)
    plain = model()
    assert [name for name, _ in canonical_parameters(fabric.setup(plain))] == NAMES
    # What the DDP strategy makes: the forward module wraps the model, as DataParallel does here.
    inner = model()
    wrapped = _FabricModule(nn.DataParallel(inner), fabric.strategy, original_module=inner)
    assert [name for name, _ in wrapped.named_parameters()][0] == "_forward_module.module.0.weight"
    assert [name for name, _ in canonical_parameters(wrapped)] == NAMES
    # Gradients an earlier release saved under the wrapper's names are read as the model's.
    assert match_names(["_forward_module.0.weight"], set(NAMES)) == {
        "_forward_module.0.weight": "0.weight"
    }


class Trainer(TrainingResumeMixin):
    """One micro-step of a window of two: the pause holds the model's gradients."""

    def __init__(
        self, fabric: Fabric | None, *, with_scaler: bool = True, compiled: bool = False
    ) -> None:
        self.fabric = fabric
        network = model()
        optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
        if fabric is not None:
            network, optimizer = fabric.setup(network, optimizer)
        if compiled:  # compiled after fabric.setup: an OptimizedModule around the _FabricModule
            network = torch.compile(network, backend="eager")
        self.model, self.optimizer = network, optimizer
        self.with_scaler = with_scaler
        self._initialize_training_resume({"fabric": "objects"}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        objects = {"model": self.model, "optimizer": self.optimizer}
        if self.fabric is not None and self.with_scaler:
            return resume_objects(self.fabric, **objects)
        return objects

    def _resume_loaders(self) -> dict[str, Any]:
        return {}

    @training_step
    def step(self, inputs: torch.Tensor) -> None:
        loss = self.model(inputs).float().sum()
        if self.fabric is None:
            loss.backward()
        else:
            self.fabric.backward(loss)


def test_the_gradients_of_a_fabric_module_resume_into_the_plain_model(tmp_path):
    paused = Trainer(Fabric(accelerator="cpu", devices=1))
    paused.step(torch.ones(2, 3))
    paused.pause(tmp_path / "pause.ckpt")
    assert list(load_checkpoint(tmp_path / "pause.ckpt")["gradients"]["model"]) == NAMES

    plain = Trainer(None)
    plain.resume(tmp_path / "pause.ckpt")
    for (name, expected), (_, got) in zip(
        canonical_parameters(paused.model), plain.model.named_parameters()
    ):
        assert torch.equal(expected.grad, got.grad), name


def _windows(trainer: Trainer, inputs: list[torch.Tensor]) -> None:
    # Windows of two micro-steps: an optimizer step after every second one.
    for batch in inputs:
        trainer.step(batch)
        if trainer.completed_steps % 2 == 0:
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()


@pytest.mark.parametrize(
    ("paused_compiled", "resumed_compiled"), [(True, True), (False, True), (True, False)]
)
def test_a_model_compiled_after_fabric_setup_pauses_under_the_models_names_and_resumes_exactly(
    tmp_path, paused_compiled, resumed_compiled
):
    inputs = [torch.full((2, 3), float(i)) for i in range(1, 6)]
    reference = Trainer(Fabric(accelerator="cpu", devices=1), compiled=resumed_compiled)
    _windows(reference, inputs)

    paused = Trainer(Fabric(accelerator="cpu", devices=1), compiled=paused_compiled)
    _windows(paused, inputs[:3])  # inside the second window: the pause holds gradients
    paused.pause(tmp_path / "pause.ckpt")
    saved = load_checkpoint(tmp_path / "pause.ckpt")
    assert list(saved["objects"]["model"]) == NAMES and list(saved["gradients"]["model"]) == NAMES

    resumed = Trainer(Fabric(accelerator="cpu", devices=1), compiled=resumed_compiled)
    resumed.resume(tmp_path / "pause.ckpt")
    _windows(resumed, inputs[3:])
    expected, got = reference.model.state_dict(), resumed.model.state_dict()
    assert list(expected) == list(got)
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name
    for (name, want), (_, have) in zip(
        reference.model.named_parameters(), resumed.model.named_parameters()
    ):
        assert want.grad is not None and torch.equal(want.grad, have.grad), name


class _Odd(nn.Module):
    """A model with a parameter at its root and a submodule named as Fabric's attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))
        self._original_module = nn.Linear(3, 3)


def test_a_models_submodule_named_as_fabrics_attribute_keeps_its_name_and_loads_back():
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    saved = torch.compile(fabric.setup(_Odd()), backend="eager")
    state = canonical_state(saved)
    assert list(state) == ["weight", "_original_module.weight", "_original_module.bias"]
    torch.manual_seed(1)
    fresh = _Odd()
    target = loading_module(torch.compile(fabric.setup(fresh), backend="eager"))
    target.load_state_dict(live_state(state, target))
    for key, value in state.items():
        assert torch.equal(value, fresh.state_dict()[key]), key


def fp16() -> Fabric:
    return Fabric(accelerator="cpu", devices=1, plugins=[MixedPrecision("16-mixed", "cpu")])


def test_objects_of_a_fabric_whose_plugin_has_a_grad_scaler_are_refused_without_it():
    trainer = Trainer(fp16(), with_scaler=False)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        trainer.step(torch.ones(2, 3))
    assert caught.value.detail == (
        "Trainer._resume_objects() returns 'model', set up by a Fabric whose precision plugin "
        "scales the loss with a GradScaler, but not that GradScaler, so a resumed run would start "
        "from a fresh loss scale; return it too: trainer_resume.adapters.fabric.resume_objects("
        "fabric, ...) adds it as 'scaler'"
    )


def test_resume_objects_adds_the_plugins_grad_scaler_and_only_where_there_is_one(tmp_path):
    fabric = fp16()
    trainer = Trainer(fabric)
    assert trainer._resume_objects()["scaler"] is fabric.strategy.precision.scaler
    trainer.step(torch.ones(2, 3))
    trainer.pause(tmp_path / "pause.ckpt")
    assert "scaler" in load_checkpoint(tmp_path / "pause.ckpt")["objects"]
    assert "scaler" not in resume_objects(Fabric(accelerator="cpu", precision="bf16-mixed"))
    with pytest.raises(ValueError, match="adds 'scaler' itself"):
        resume_objects(fabric, scaler=torch.amp.GradScaler("cpu"))
