"""Loaders from elsewhere: saved through their Stateful protocol, or refused when training starts.

What ``_resume_objects()`` and ``_resume_loaders()`` return is checked before the
first step runs (and by ``resume()``): a pause never fails on a loader without
state, and a pause file never fails to resume because of one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support import foreign_loaders
from support.foreign_loaders import LoaderTrainer
from support.lightning_procs import TESTS
from torch.utils.data import DataLoader, TensorDataset

from trainer_resume import declare_no_random_draws
from trainer_resume.checks import hook_results as _hook_results
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import LoaderStateError, UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.testing import first_difference

_332 = "[332] configuration cannot be resumed exactly: "
FIX = (
    "return a trainer_resume.loaders.ResumableDataLoader(..., resumable=True) (the DataLoader "
    "drop-in), or a loader with state_dict() and load_state_dict() (torchdata's Stateful "
    "protocol, e.g. torchdata.stateful_dataloader.StatefulDataLoader) declared with "
    "trainer_resume.declare_no_random_draws(loader) if its samples draw no random numbers"
)


@pytest.mark.parametrize("loop", ["resume", "resume-epoch-loop"])
def test_a_stateful_dataloader_paused_mid_epoch_resumes_in_a_new_process(
    tmp_path: Path, loop: str
) -> None:
    # "resume-epoch-loop": no iterator is rebuilt in the hook; the loop's own iter() after
    # resume() finds the one the resume's boundary made (its state_dict() makes one).
    run = foreign_loaders.run if loop == "resume" else foreign_loaders.run_epoch_loop
    holds_iterator = loop == "resume"
    reference = foreign_loaders.StatefulLoaderTrainer(holds_iterator=holds_iterator)
    run(reference, foreign_loaders.STEPS)
    expected = foreign_loaders.outcome(reference, foreign_loaders.PAUSE)
    trainer = foreign_loaders.StatefulLoaderTrainer(holds_iterator=holds_iterator)
    run(trainer, foreign_loaders.PAUSE)
    trainer.pause(tmp_path / "pause.ckpt")
    out = tmp_path / "resumed.pt"
    environment = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "support.foreign_loaders",
            loop,
            str(tmp_path / "pause.ckpt"),
            str(out),
        ],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = torch.load(out, weights_only=True)
    assert result["start"] == foreign_loaders.PAUSE
    difference = first_difference(expected, result["outcome"])
    assert difference is None, difference


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(8.0).reshape(4, 2))


def test_a_loader_without_state_is_refused_before_the_first_step_runs() -> None:
    trainer = LoaderTrainer(DataLoader(_dataset(), batch_size=2))
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert str(refused.value) == (
        f"{_332}LoaderTrainer._resume_loaders() returns 'train' "
        "(torch.utils.data.dataloader.DataLoader), whose position cannot be saved (it has no "
        f"state_dict() and load_state_dict()); {FIX}"
    )
    assert not hasattr(trainer, "ran") and trainer.completed_steps == 0


class Shard:
    """A framework's wrapper: looks stateful, but has no state to give."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def state_dict(self) -> Any:
        return self.dl_state_dict  # never set, as a wrapper whose base loader has no state

    def load_state_dict(self, state: Any) -> None:
        raise AssertionError("never called")


def test_a_wrapper_that_replaced_a_resumable_loader_is_named_with_the_loader_it_replaced() -> None:
    resumable = ResumableDataLoader(_dataset(), batch_size=2, resumable=True)
    trainer = LoaderTrainer(Shard(resumable.dataset), original=resumable)
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.pause(Path("unused.ckpt"))  # before the first step: the same check
    assert str(refused.value) == (
        f"{_332}LoaderTrainer._resume_loaders() returns 'train' ({__name__}.Shard), whose "
        "position cannot be saved (its state_dict() raised AttributeError: 'Shard' object has no "
        "attribute 'dl_state_dict'); it replaced the resumable loader self.original "
        f"(ResumableDataLoader) by its own wrapper; {FIX}"
    )
    assert isinstance(refused.value.__cause__, AttributeError)
    assert not os.path.exists("unused.ckpt")


def test_an_adapter_names_the_fix_for_its_own_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hook_results, "_HINTS", [])
    _hook_results.register_loader_hint(
        lambda loader: (
            "this is a Shard; use the adapter's prepare_loader"
            if isinstance(loader, Shard)
            else None
        )
    )
    trainer = LoaderTrainer(Shard(_dataset()))
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert str(refused.value).endswith(
        "attribute 'dl_state_dict'); this is a Shard; use the adapter's prepare_loader"
    )


class NumpyStateLoader:
    def state_dict(self) -> Any:
        return {"order": np.arange(3)}

    def load_state_dict(self, state: Any) -> None:
        pass


def test_a_loader_whose_state_would_not_load_weights_only_is_refused_at_the_first_step() -> None:
    trainer = LoaderTrainer(declare_no_random_draws(NumpyStateLoader()))
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert str(refused.value) == (
        f"{_332}LoaderTrainer._resume_loaders() returns 'train' ({__name__}.NumpyStateLoader), "
        "whose state cannot be read back by torch.load(weights_only=True) (its state_dict()"
        "['order'] is a numpy.ndarray (convert with torch.from_numpy)), so its pause file could "
        "not be resumed; give the loader a state of tensors, numbers, str, None, lists and dicts, "
        f"or {FIX}"
    )


class NoState:
    pass


def test_a_resume_object_without_state_methods_is_refused_at_the_first_step() -> None:
    class ObjectTrainer(LoaderTrainer):
        def _resume_objects(self) -> dict[str, Any]:
            return {"model": self.model, "ema": NoState()}

    trainer = ObjectTrainer(ResumableDataLoader(_dataset(), batch_size=2, resumable=True))
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert str(refused.value) == (
        f"{_332}ObjectTrainer._resume_objects() returns 'ema' ({__name__}.NoState), which has "
        "no state_dict() and load_state_dict(), so a pause cannot save it; return objects with "
        "both (model, optimizer, scheduler, GradScaler) and keep plain values in "
        "_resume_extra_state()"
    )


class PickyLoader:
    """A stateful loader that accepts only positions it has."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> Any:
        return {"position": self.position}

    def load_state_dict(self, state: Any) -> None:
        if not 0 <= state["position"] < 4:
            raise ValueError(f"position {state['position']} is not in this loader")
        self.position = state["position"]


def test_a_foreign_loader_that_refuses_its_state_leaves_the_trainer_as_it_was(
    tmp_path: Path,
) -> None:
    source = LoaderTrainer(declare_no_random_draws(PickyLoader()))
    source.loader.position = 2
    source.step()
    source.pause(tmp_path / "pause.ckpt")
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    checkpoint["loaders"]["train"]["position"] = 9
    save_checkpoint(checkpoint, tmp_path / "wrong.ckpt")

    trainer = LoaderTrainer(declare_no_random_draws(PickyLoader()))
    trainer.loader.position = 1
    with torch.no_grad():
        trainer.model.weight.fill_(3.0)
    with pytest.raises(LoaderStateError) as refused:
        trainer.resume(tmp_path / "wrong.ckpt")
    assert str(refused.value) == (
        "[333] malformed loader/sampler state (format, cursor, index, sizes): "
        f"{tmp_path / 'wrong.ckpt'}: loader 'train' (PickyLoader) refused its saved state "
        "(ValueError: position 9 is not in this loader); nothing was restored"
    )
    assert not trainer.locked and trainer.loader.position == 1
    assert torch.equal(trainer.model.weight, torch.full((1, 2), 3.0))
    trainer.resume(tmp_path / "pause.ckpt")  # the trainer is usable: a good file resumes
    assert trainer.loader.position == 2 and trainer.completed_steps == 1
