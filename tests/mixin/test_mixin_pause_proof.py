"""Every pause is checked once, as ``resume()`` would check it, by the trainer that wrote it.

A defect that writes what no resume accepts (here a name mapping broken on purpose) is
found by ``pause()`` itself (354), not at the user's resume; ``check_resumable`` runs the
checks of ``resume()`` on a file, changing nothing.
"""

from __future__ import annotations

import pytest
import torch
from support.trainers import TinyTrainer

from trainer_resume.errors import PauseNotResumableError, VersionMismatchError
from trainer_resume.mixin import _pause


def test_a_pause_whose_module_names_are_mapped_wrongly_is_refused_by_pause_naming_the_keys(
    tmp_path, monkeypatch
):
    real = _pause.canonical_state

    def broken(module, state=None):
        named = real(module) if state is None else real(module, state)
        return {f"renamed.{key}": value for key, value in named.items()}

    monkeypatch.setattr(_pause, "canonical_state", broken)
    trainer = TinyTrainer()
    trainer.train_step()
    with pytest.raises(PauseNotResumableError) as refused:
        trainer.pause(tmp_path / "p.ckpt")
    assert "renamed.weight" in str(refused.value)
    assert trainer.paused  # the pause was written; what it holds is the defect reported


def test_check_resumable_passes_its_own_pause_and_changes_nothing(tmp_path):
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "p.ckpt")
    fresh = TinyTrainer()
    before = {key: value.clone() for key, value in fresh.model.state_dict().items()}
    fresh.check_resumable(tmp_path / "p.ckpt")
    assert fresh.completed_steps == 0
    assert all(torch.equal(before[key], value) for key, value in fresh.model.state_dict().items())


def test_check_resumable_refuses_what_resume_refuses(tmp_path):
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "p.ckpt")
    other = TinyTrainer(version="another")
    with pytest.raises(VersionMismatchError):
        other.check_resumable(tmp_path / "p.ckpt")
