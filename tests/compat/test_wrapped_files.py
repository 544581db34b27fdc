"""Pause files that name a wrapped model's weights as the wrapper does resume into any wrapping.

Before module state was saved under the unwrapped module's names, a model returned
compiled or wrapped by DataParallel (or DDP) was saved as its wrapper names it:
``_orig_mod.0.weight``, ``module.0.weight``. The package as it was then (commit 158d509)
writes such files here, on this machine (``make_wrapped_files.py``); the current code
resumes each of them into the model wrapped every way and continues bit-identically to the
current code's uninterrupted run. So does a sharded pause whose gradients carry
``_checkpoint_wrapped_module.`` (a model with checkpoint-wrapped blocks), into the blocks
wrapped or not.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import earlier_release
from support.fsdp_workers import CheckpointedTrainer, FSDPTrainer, by_parameter_order
from support.wrapped_trainers import PAUSE_STEP, STEPS, WRAPPINGS, WrappedTrainer

from trainer_resume.durable import load_checkpoint
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.sharded.read import open_pause
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

SHARDED_PAUSE_STEP = 2  # as make_wrapped_files.py
SHARDED_STEPS = 4
WRAPPER_NAMES = "158d509"  # the last commit that saved module state under the wrappers' names
PREFIXES = {
    "plain": "",
    "compiled": "_orig_mod.",
    "parallel": "module.",
    "compiled+parallel": "_orig_mod.module.",
    "parallel+compiled": "module._orig_mod.",
}


@pytest.fixture(scope="module")
def earlier_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pause files the earlier release writes, one per wrapping, made once for this module."""
    scratch = tmp_path_factory.mktemp("wrapper-names")
    package_root = earlier_release.extract(WRAPPER_NAMES, scratch / "package")
    out = scratch / "files"
    earlier_release.run_script(
        package_root, Path(__file__).with_name("make_wrapped_files.py"), str(out)
    )
    return out


@cache
def _uninterrupted() -> dict[str, Any]:
    trainer = WrappedTrainer()
    trainer.run_to(STEPS)
    trainer.loader.close()
    return trainer.outcome()


@pytest.mark.parametrize("wrapping", WRAPPINGS)
def test_the_earlier_release_named_weights_and_gradients_as_the_wrapper_does(
    earlier_files, wrapping
):
    checkpoint = load_checkpoint(earlier_files / f"{wrapping}.ckpt")
    prefix = PREFIXES[wrapping]
    assert list(checkpoint["objects"]["model"])[:2] == [f"{prefix}0.weight", f"{prefix}0.bias"]
    assert list(checkpoint["gradients"]["model"])[:2] == [f"{prefix}0.weight", f"{prefix}0.bias"]


@pytest.mark.parametrize("resumed_wrapping", WRAPPINGS)
@pytest.mark.parametrize("paused_wrapping", WRAPPINGS)
def test_an_earlier_pause_file_resumes_bitwise_equal_into_the_model_wrapped_any_way(
    earlier_files, tmp_path, paused_wrapping, resumed_wrapping
):
    trainer = WrappedTrainer(resumed_wrapping)
    torch.rand(3)  # a missing RNG restore must not pass by luck
    trainer.resume(earlier_files / f"{paused_wrapping}.ckpt")
    assert trainer.completed_steps == PAUSE_STEP
    assert any(p.grad is not None for p in trainer.module.parameters())  # the open window's
    trainer.run_to(STEPS)
    trainer.loader.close()
    expected = _uninterrupted()
    difference = first_difference(
        {**expected, "losses": expected["losses"][PAUSE_STEP:]}, trainer.outcome()
    )
    assert difference is None, difference.describe()


@pytest.fixture
def one_rank(tmp_path):
    caller_rng = random_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        restore_random_state(caller_rng)


def _sharded_run(kind: type[FSDPTrainer], resume: Path | None = None) -> dict[str, Any]:
    """The trainer's state by parameter order when the pause step is reached (or right after
    the resume) and at the end."""
    trainer = kind()
    try:
        if resume is not None:
            trainer.resume(resume)
        while trainer.completed_steps < SHARDED_PAUSE_STEP:
            trainer.step()
        at_pause = by_parameter_order(trainer)
        while trainer.completed_steps < SHARDED_STEPS:
            trainer.step()
        return {"at_pause": at_pause, "end": by_parameter_order(trainer)}
    finally:
        trainer.loader.close()


@pytest.mark.parametrize("kind", [CheckpointedTrainer, FSDPTrainer])
def test_an_earlier_sharded_pause_with_checkpoint_wrapper_gradient_names_resumes_bitwise_equal(
    earlier_files, one_rank, kind
):
    saved = open_pause(earlier_files / "sharded", key=None).metadata.state_dict_metadata
    assert "gradients.model.0._checkpoint_wrapped_module.weight" in saved
    expected = _sharded_run(CheckpointedTrainer)
    resumed = _sharded_run(kind, resume=earlier_files / "sharded")
    # Right after the resume the gradients of the pause are back on their parameters.
    difference = first_difference(expected, resumed)
    assert difference is None, difference.describe()
