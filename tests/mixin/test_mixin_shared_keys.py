"""Shared keys: the regular checkpoint is snapshotted once and the resume objects reference it."""

from __future__ import annotations

import json

import pytest
import torch
from support.trainers import SeparateCopiesTrainer, SharedKeysTrainer, TinyTrainer, tiny_config

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.state import cpu_state


class Capturing(SharedKeysTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state_dict_calls = 0
        original = self.model.state_dict

        def counting_state_dict(*a, **k):
            self.state_dict_calls += 1
            return original(*a, **k)

        self.model.state_dict = counting_state_dict

    def _save_pause_checkpoint(self, checkpoint, path):
        self.captured = checkpoint
        self.calls_when_written = self.state_dict_calls  # later: the check of what was written
        super()._save_pause_checkpoint(checkpoint, path)


def test_shared_objects_reference_the_regular_snapshot_tensor_for_tensor(tmp_path):
    trainer = Capturing()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    checkpoint = trainer.captured
    assert trainer.calls_when_written == 1
    assert checkpoint["shared_keys"] == ["model", "optimizer"]
    regular, objects = checkpoint["regular"], checkpoint["objects"]
    for name in ("weight", "bias"):
        assert objects["model"][name] is regular["model"][name]
    assert (
        objects["optimizer"]["state"][0]["momentum_buffer"]
        is regular["optimizer"]["state"][0]["momentum_buffer"]
    )
    loaded = load_checkpoint(tmp_path / "pause.ckpt")
    assert loaded["objects"]["model"]["weight"] is loaded["regular"]["model"]["weight"]
    assert loaded["regular"]["note"] == "weights"


def separate_copies(checkpoint):
    """The same pause state laid out without sharing: each object holds its own copy."""
    layout = dict(checkpoint)
    layout["objects"] = cpu_state(checkpoint["objects"])
    layout["shared_keys"] = []
    return layout


def test_shared_keys_store_the_state_once_in_the_file(tmp_path):
    trainer = Capturing(tiny_config(width=256, outputs=256))
    trainer.train_step()
    trainer.optimizer.zero_grad(set_to_none=True)  # no gradients carried: weights and momentum only
    trainer.pause(tmp_path / "shared.ckpt")
    save_checkpoint(separate_copies(trainer.captured), tmp_path / "separate.ckpt")
    shared = (tmp_path / "shared.ckpt").stat().st_size
    separate = (tmp_path / "separate.ckpt").stat().st_size
    state_bytes = 2 * (256 * 256 + 256) * 4  # weights and momentum, float32
    assert state_bytes < shared < 1.1 * state_bytes
    assert 0.45 < shared / separate < 0.55, (shared, separate)


def test_file_with_separate_copies_resumes_exactly(tmp_path):
    expected = TinyTrainer()
    expected_losses = [expected.train_step() for _ in range(4)]
    source = Capturing()
    source.train_step()
    source.train_step()
    source.pause(tmp_path / "shared.ckpt")
    save_checkpoint(separate_copies(source.captured), tmp_path / "separate.ckpt")
    trainer = SharedKeysTrainer()
    trainer.resume(tmp_path / "separate.ckpt")
    losses = [trainer.train_step() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(expected_losses[2:], losses))
    for name, value in expected.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name])


def test_file_without_shared_keys_resumes_a_trainer_that_shares_keys(tmp_path):
    expected = TinyTrainer()
    expected_losses = [expected.train_step() for _ in range(4)]
    source = SeparateCopiesTrainer()
    source.train_step()
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    assert load_checkpoint(tmp_path / "pause.ckpt")["shared_keys"] == []
    trainer = SharedKeysTrainer()
    trainer.resume(tmp_path / "pause.ckpt")
    losses = [trainer.train_step() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(expected_losses[2:], losses))
    for name, value in expected.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name])


def test_shared_key_missing_from_the_regular_checkpoint_is_refused_at_pause(tmp_path):
    class OnlyWeights(SharedKeysTrainer):
        def _regular_checkpoint(self):
            return {"model": self.model.state_dict()}

    trainer = OnlyWeights()
    trainer.train_step()
    with pytest.raises(
        ResumeStateMismatchError, match="'optimizer' is not in the regular checkpoint"
    ):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not trainer.paused and not (tmp_path / "pause.ckpt").exists()


def test_shared_key_that_is_not_a_resume_object_is_refused_at_pause(tmp_path):
    class Unknown(SharedKeysTrainer):
        shared = ("model", "ema")

    trainer = Unknown()
    with pytest.raises(ResumeStateMismatchError, match="'ema' is not in the resume objects"):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not trainer.paused


def test_pause_file_is_plain_data(tmp_path):
    trainer = SharedKeysTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")  # weights-only unpickling
    assert json.loads(json.dumps(checkpoint["config"])) == checkpoint["config"]
    assert json.loads(json.dumps(checkpoint["extra"])) == {"position": 1}
    assert checkpoint["completed_steps"] == 1 and checkpoint["module_version"] == "1.0"
