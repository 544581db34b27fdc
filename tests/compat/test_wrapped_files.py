"""Pause files that name a wrapped model's weights as the wrapper does resume into any wrapping.

Before module state was saved under the unwrapped module's names, a model returned
compiled or wrapped by DataParallel (or DDP) was saved as its wrapper names it:
``_orig_mod.0.weight``, ``module.0.weight``. The package as it was then (commit 158d509)
writes such files here, on this machine (``make_wrapped_files.py``); the current code
resumes each of them into the model wrapped every way and continues bit-identically to the
current code's uninterrupted run.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from support import earlier_release
from support.wrapped_trainers import PAUSE_STEP, STEPS, WRAPPINGS, WrappedTrainer

from trainer_resume.durable import load_checkpoint
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

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
