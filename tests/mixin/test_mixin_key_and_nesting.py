"""Keys are checked where the trainer is set up; a pause file's deep config is our error."""

from __future__ import annotations

from typing import Any

import pytest
from support.trainers import TinyTrainer

from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import CheckpointFormatError
from trainer_resume.signature import canonical_config, config_difference
from trainer_resume.testing import first_difference


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("a str key of enough length", TypeError),
        (b"", ValueError),
        (b"fifteen bytes!!", ValueError),
    ],
)
def test_a_bad_key_is_refused_when_the_trainer_is_set_up_not_at_the_first_pause(
    key: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="key"):
        TinyTrainer(key=key)


def _nested(depth: int) -> dict[str, Any]:
    config: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        config = {"inner": config}
    return config


def test_a_config_nested_400_deep_is_a_value_error_naming_the_limit_not_a_recursion_error() -> None:
    with pytest.raises(ValueError, match="deeper than 100"):
        canonical_config(_nested(400))
    with pytest.raises(ValueError, match="deeper than 100"):
        config_difference(_nested(400), {"leaf": 1})
    assert canonical_config(_nested(90)) == _nested(90)


def test_a_pause_file_whose_config_nests_150_deep_is_refused_as_format_error_untouched(tmp_path):
    source = TinyTrainer()
    source.train_step()
    source.pause(tmp_path / "pause.ckpt")
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    checkpoint["config"] = _nested(150)  # within the file limit, past the config limit
    checkpoint["config_signature"] = "0" * 64  # so that resume describes the config difference
    save_checkpoint(checkpoint, tmp_path / "deep.ckpt")
    trainer = TinyTrainer()
    trainer.train_step()
    before = trainer.state()
    with pytest.raises(CheckpointFormatError, match="config"):
        trainer.resume(tmp_path / "deep.ckpt")
    difference = first_difference(before, trainer.state())
    assert difference is None, difference.describe()
    assert not trainer.locked
