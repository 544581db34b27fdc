"""resume() refuses a foreign, corrupted or mismatched pause file before it touches any state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.trainers import TinyTrainer, tiny_config

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    ConfigSignatureMismatchError,
    ResumeStateMismatchError,
    VersionMismatchError,
)
from trainer_resume.testing import first_difference


@pytest.fixture
def good_file(tmp_path):
    """A pause file after 3 steps; the trainer under test has taken 1 step, so any restore would show."""
    path = tmp_path / "good.ckpt"
    source = TinyTrainer()
    for _ in range(3):
        source.train_step()
    source.pause(path)
    return path


@pytest.fixture
def trainer():
    trainer = TinyTrainer()
    trainer.train_step()
    return trainer


def rewritten(path, change):
    checkpoint = load_checkpoint(path)
    change(checkpoint)
    target = path.with_name("changed.ckpt")
    save_checkpoint(checkpoint, target)
    return target


def assert_refused_unchanged(trainer, path, error, match=None):
    before = trainer.state()
    with pytest.raises(error, match=match) as raised:
        trainer.resume(path)
    difference = first_difference(before, trainer.state())
    assert difference is None, difference.describe()
    assert not trainer.locked
    return raised.value


def test_file_of_another_format_is_refused_unchanged(trainer, good_file):
    foreign = rewritten(good_file, lambda c: c.update(format="someone-else/1"))
    assert_refused_unchanged(trainer, foreign, CheckpointFormatError, match="someone-else/1")


def test_file_missing_an_entry_is_refused_unchanged(trainer, good_file):
    broken = rewritten(good_file, lambda c: c.pop("loaders"))
    assert_refused_unchanged(trainer, broken, CheckpointFormatError, match="'loaders'")


def test_corrupted_file_is_refused_unchanged(trainer, good_file):
    data = bytearray(good_file.read_bytes())
    data[len(data) // 2] ^= 0x40
    good_file.write_bytes(bytes(data))
    assert_refused_unchanged(trainer, good_file, CheckpointCorruptedError)


def test_other_module_version_is_refused_unchanged(good_file):
    trainer = TinyTrainer(version="2.0")
    trainer.train_step()
    assert_refused_unchanged(trainer, good_file, VersionMismatchError, match="'1.0'.*'2.0'")


def test_changed_config_value_is_refused_naming_the_path(good_file):
    trainer = TinyTrainer(tiny_config(lr=0.2))
    trainer.train_step()
    assert_refused_unchanged(
        trainer,
        good_file,
        ConfigSignatureMismatchError,
        match=r"lr: 0\.1 in the paused run, 0\.2 in this run",
    )


def test_same_values_with_reordered_keys_are_a_signature_mismatch_naming_the_path(good_file):
    reordered = json.loads(json.dumps(tiny_config(), sort_keys=True))
    assert reordered == tiny_config()  # equal as dicts: only the order differs
    trainer = TinyTrainer(reordered)
    trainer.train_step()
    error = assert_refused_unchanged(trainer, good_file, ConfigSignatureMismatchError)
    assert error.code == 323 and "<root>: keys in the order [" in error.detail


def test_changed_load_entry_is_accepted(good_file):
    trainer = TinyTrainer(tiny_config(load=str(good_file)))
    trainer.resume(good_file)
    assert trainer.completed_steps == 3


def test_generator_in_config_consumed_before_reuse_is_a_mismatch(tmp_path):
    # Documented: a torch.Generator is signed by its current state, so one that has
    # produced numbers since the pause is a different config.
    generator = torch.Generator().manual_seed(7)
    source = TinyTrainer(tiny_config(generator=generator))
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    torch.rand(2, generator=generator)
    trainer = TinyTrainer(tiny_config(generator=generator))
    error = assert_refused_unchanged(trainer, tmp_path / "pause.ckpt", ConfigSignatureMismatchError)
    assert "generator" in error.detail


def test_generator_in_config_with_the_same_state_is_accepted(tmp_path):
    source = TinyTrainer(tiny_config(generator=torch.Generator().manual_seed(7)))
    source.pause(tmp_path / "pause.ckpt")
    TinyTrainer(tiny_config(generator=torch.Generator().manual_seed(7))).resume(
        tmp_path / "pause.ckpt"
    )


def test_missing_resume_object_is_refused_naming_it(trainer, good_file):
    class WithScheduler(TinyTrainer):
        def __init__(self):
            super().__init__()
            self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, 2)

        def _resume_objects(self):
            return {**super()._resume_objects(), "scheduler": self.scheduler}

    other = WithScheduler()
    other.train_step()
    assert_refused_unchanged(
        other,
        good_file,
        ResumeStateMismatchError,
        match="missing from the checkpoint: \\['scheduler'\\]",
    )


def test_unknown_extra_state_key_is_refused_naming_it(trainer, good_file):
    changed = rewritten(good_file, lambda c: c["extra"].update(warmup_done=True))
    assert_refused_unchanged(
        trainer, changed, ResumeStateMismatchError, match="not in this trainer: \\['warmup_done'\\]"
    )


def test_unknown_loader_entry_is_refused(trainer, good_file):
    changed = rewritten(good_file, lambda c: c["loaders"].update(train={"format": "x"}))
    assert_refused_unchanged(trainer, changed, ResumeStateMismatchError, match="loaders")


def test_validate_resume_refusal_leaves_state_unchanged(good_file):
    class Picky(TinyTrainer):
        def _validate_resume(self, checkpoint):
            if checkpoint["completed_steps"] > 2:
                raise ResumeStateMismatchError("this trainer only resumes early pauses")

    trainer = Picky()
    trainer.train_step()
    assert_refused_unchanged(trainer, good_file, ResumeStateMismatchError, match="early pauses")


def test_malformed_rng_state_is_refused_before_any_object_is_restored(trainer, good_file):
    changed = rewritten(
        good_file, lambda c: c["rng"].update(torch=torch.zeros(3, dtype=torch.uint8))
    )
    assert_refused_unchanged(trainer, changed, CheckpointFormatError, match="rng")


def test_file_written_without_the_signing_key_is_refused_when_a_key_is_set(good_file):
    trainer = TinyTrainer(key=b"secret-key-of-16+bytes")
    trainer.train_step()
    assert_refused_unchanged(trainer, good_file, CheckpointSignatureError)


def test_signed_pause_file_resumes_with_the_same_key(tmp_path):
    source = TinyTrainer(key=b"secret-key-of-16+bytes")
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    trainer = TinyTrainer(key=b"secret-key-of-16+bytes")
    trainer.resume(tmp_path / "pause.ckpt")
    assert trainer.completed_steps == 1
    with pytest.raises(CheckpointSignatureError):
        TinyTrainer(key=b"other-key-of-16+bytes").resume(tmp_path / "pause.ckpt")


def test_refused_resume_on_a_paused_trainer_keeps_it_paused(tmp_path, good_file):
    trainer = TinyTrainer(tiny_config(lr=0.3))
    trainer.train_step()
    trainer.pause(tmp_path / "own.ckpt")
    assert_refused_unchanged(trainer, good_file, ConfigSignatureMismatchError)
    assert trainer.paused


def test_unsafe_extra_state_is_refused_at_pause_naming_the_entry(tmp_path):
    class NumpyPool(TinyTrainer):
        def _resume_extra_state(self):
            return {"position": self.position, "pool": np.zeros(3)}

    trainer = NumpyPool()
    trainer.train_step()
    with pytest.raises(TypeError, match=r"extra'\]\['pool'\].*numpy"):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not trainer.paused and not (tmp_path / "pause.ckpt").exists()


def test_file_without_the_optional_entries_still_resumes(good_file):
    def drop_optional(checkpoint):
        for key in ("config", "regular", "shared_keys"):
            checkpoint.pop(key)

    older = rewritten(good_file, drop_optional)
    trainer = TinyTrainer()
    trainer.resume(older)
    assert trainer.completed_steps == 3 and trainer.position == 3


def test_mismatch_with_a_file_without_its_config_names_both_signatures(good_file):
    older = rewritten(good_file, lambda c: c.pop("config"))
    trainer = TinyTrainer(tiny_config(lr=0.2))
    error = assert_refused_unchanged(trainer, older, ConfigSignatureMismatchError)
    assert error.detail.startswith(f"{older}: config signature ")


# --- config_ignore -------------------------------------------------------------------


def test_a_pause_records_the_config_ignore_paths_and_a_resume_may_change_those_keys(tmp_path):
    ignore = ("logger",)
    reference = TinyTrainer(tiny_config(logger={"level": "info"}), config_ignore=ignore)
    for _ in range(5):
        reference.train_step()
    expected = reference.state()
    source = TinyTrainer(tiny_config(logger={"level": "info"}), config_ignore=ignore)
    for _ in range(3):
        source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    assert load_checkpoint(tmp_path / "pause.ckpt")["config_ignore"] == ["logger"]
    resumed = TinyTrainer(tiny_config(logger={"level": "debug", "tag": 1}), config_ignore=ignore)
    resumed.resume(tmp_path / "pause.ckpt")
    for _ in range(2):
        resumed.train_step()
    difference = first_difference(expected, resumed.state())
    assert difference is None, difference.describe()


def test_a_resume_ignoring_fewer_paths_than_the_pause_is_refused_unchanged(tmp_path):
    source = TinyTrainer(tiny_config(logger={"level": "info"}), config_ignore=("logger",))
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    trainer = TinyTrainer(tiny_config(logger={"level": "info"}))
    trainer.train_step()
    error = assert_refused_unchanged(trainer, tmp_path / "pause.ckpt", ConfigSignatureMismatchError)
    assert "was paused with config_ignore=['logger'] and this run passes config_ignore=[]" in (
        error.detail
    )


@pytest.mark.parametrize(
    "config_ignore, error", [("logger", TypeError), (["layers[0]"], ValueError), ([3], TypeError)]
)
def test_a_malformed_config_ignore_is_refused_when_the_trainer_is_built(config_ignore, error):
    with pytest.raises(error, match="config_ignore"):
        TinyTrainer(config_ignore=config_ignore)
