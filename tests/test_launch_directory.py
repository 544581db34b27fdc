"""A pause path or resume-point directory inside the run directory a Hydra app names by
the launch time is warned about where it is given (a requeue would not find it); one
outside it, or a run directory a requeue finds again, is not."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from support.trainers import TinyTrainer

from trainer_resume import ResumePoints
from trainer_resume.adapters.lightning import ResumeCallback
from trainer_resume.errors import UnsavedStateWarning
from trainer_resume.launch_directory import launch_directory


def _launch(tmp_path: Path, *overrides: str) -> Path:
    """Hydra's config set as a launch sets it, its output directory under ``tmp_path``."""
    configs = tmp_path / "configs"
    configs.mkdir(exist_ok=True)
    (configs / "train.yaml").write_text("seed: 1\n")
    with initialize_config_dir(version_base="1.3", config_dir=str(configs)):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    output = tmp_path / "outputs" / "2026-12-06" / "10-00-00"
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output)
    HydraConfig.instance().set_config(cfg)
    return output


@pytest.fixture
def hydra_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)
    monkeypatch.chdir(tmp_path)
    yield _launch(tmp_path)


def test_paths_in_a_run_directory_named_by_the_launch_time_are_warned_about(
    hydra_launch: Path,
) -> None:
    assert launch_directory() == str(hydra_launch)
    with pytest.warns(UnsavedStateWarning, match="the pause path .* lies in this launch's"):
        TinyTrainer().pause_on_signal(hydra_launch / "pause.ckpt").restore()
    with pytest.warns(UnsavedStateWarning, match="the resume points' directory .* lies in"):
        ResumePoints(hydra_launch / "points", every_steps=1)
    with pytest.warns(UnsavedStateWarning, match="the pause path .* lies in this launch's"):
        ResumeCallback(hydra_launch / "pause.ckpt")


def test_paths_outside_the_run_directory_are_not_warned_about(
    hydra_launch: Path, tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsavedStateWarning)
        TinyTrainer().pause_on_signal(tmp_path / "pauses" / "pause.ckpt").restore()
        ResumePoints(tmp_path / "points", every_steps=1)
        ResumeCallback(tmp_path / "pauses" / "other.ckpt")


def test_a_run_directory_without_the_launch_time_is_found_again_by_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)
    _launch(tmp_path, f"hydra.run.dir={tmp_path}/runs/job-17")
    assert launch_directory() is None


def test_outside_a_hydra_app_nothing_is_a_launch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    assert launch_directory() is None
