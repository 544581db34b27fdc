"""A model compiled with ``torch.compile`` (inductor on CPU) pauses and resumes compiled or not.

The compiled runs are ``support/compiled_runs.py`` in processes of their own (one pauses,
a new one resumes), with deterministic algorithms on; the eager ones run here. Compiled
and eager kernels (and dropout masks) differ, so a switch between them loads the paused
state exactly and trains on, while compiled after compiled is bit-identical to the
uninterrupted compiled run. Where no compiler works the tests are skipped with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.compiled_runs import run_in_new_process
from support.wrapped_trainers import PAUSE_STEP, STEPS, WrappedTrainer, plain_module

from trainer_resume.durable import load_checkpoint
from trainer_resume.export import export_checkpoint
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

STATE = ("model", "gradients", "moments", "optimizer", "scheduler", "rng")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("compiled")
    eager = WrappedTrainer()
    eager.run_to(PAUSE_STEP)
    eager.pause(workdir / "eager.ckpt")
    eager.loader.close()
    reason = run_in_new_process("pause", workdir)
    if reason is not None:
        pytest.skip(reason)
    run_in_new_process("resume", workdir)

    def load(name: str) -> Any:
        return torch.load(workdir / name, weights_only=True)

    return {
        "workdir": workdir,
        "eager_paused": eager.outcome(),
        "uninterrupted": load("uninterrupted.pt"),
        "paused": load("paused.pt"),
        "compiled_resumed": load("resumed-compiled.pt"),
        "eager_resumed": load("resumed-eager.pt"),
    }


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _assert_state(expected: dict[str, Any], actual: dict[str, Any], where: str) -> None:
    for entry in STATE:
        _assert_same(expected[entry], actual[entry], f"{where}: {entry}")


def _assert_trained_on(at_resume: dict[str, Any], end: dict[str, Any]) -> None:
    assert end["completed_steps"] == STEPS
    assert len(end["losses"]) == STEPS - PAUSE_STEP
    assert all(torch.isfinite(loss) for loss in end["losses"])
    assert any(
        not torch.equal(at_resume["model"][key], value) for key, value in end["model"].items()
    )


def test_a_compiled_pause_resumed_compiled_in_a_new_process_is_bitwise_equal_to_the_uninterrupted_run(
    runs,
):
    resumed = runs["compiled_resumed"]
    _assert_state(runs["paused"], resumed["at_resume"], "right after the resume")
    expected = runs["uninterrupted"]
    _assert_same(
        {**expected, "losses": expected["losses"][PAUSE_STEP:]}, resumed["end"], "at the end"
    )


def test_a_compiled_pause_holds_the_plain_modules_names(runs):
    checkpoint = load_checkpoint(runs["workdir"] / "compiled.ckpt")
    plain = plain_module()
    assert list(checkpoint["objects"]["model"]) == list(plain.state_dict())
    assert list(checkpoint["gradients"]["model"]) == [name for name, _ in plain.named_parameters()]


def test_a_compiled_pause_resumes_into_the_eager_module_with_each_parameters_state_and_trains_on(
    runs, tmp_path
):
    trainer = WrappedTrainer()
    trainer.resume(runs["workdir"] / "compiled.ckpt")
    at_resume = trainer.outcome()
    # Weights, gradients of the open window and AdamW's moments, each on its own parameter.
    _assert_state(runs["paused"], at_resume, "right after the resume")
    trainer.run_to(STEPS)
    trainer.loader.close()
    _assert_trained_on(at_resume, trainer.outcome())


def test_an_eager_pause_resumes_into_the_compiled_module_and_trains_on(runs):
    resumed = runs["eager_resumed"]
    _assert_state(runs["eager_paused"], resumed["at_resume"], "right after the resume")
    _assert_trained_on(resumed["at_resume"], resumed["end"])


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_an_export_of_a_compiled_pause_loads_strictly_into_the_plain_module(runs, tmp_path, suffix):
    out = tmp_path / f"model{suffix}"
    export_checkpoint(
        runs["workdir"] / "compiled.ckpt",
        out,
        format="safetensors" if suffix == ".safetensors" else "torch",
    )
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        weights = load_file(out)
    else:
        weights = torch.load(out, weights_only=True)
    plain = plain_module()
    plain.load_state_dict(weights, strict=True)  # the usual inference code
    _assert_same(runs["paused"]["model"], plain.state_dict(), "the exported weights")
    compiled = torch.compile(plain_module())  # built, not run: nothing is compiled
    compiled._orig_mod.load_state_dict(weights, strict=True)
    _assert_same(runs["paused"]["model"], compiled._orig_mod.state_dict(), "through _orig_mod")
