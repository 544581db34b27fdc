"""A Hydra app with ``ResumeCallback(config=cfg)``, laid out like the Lightning + Hydra
template and launched as a user launches it, pauses on a real SIGTERM and resumes
bitwise when its command is run again, also as a ``-m`` sweep of two seeds.

The app (``support/hydra_apps/lightning_app.py``) gives the Trainer
``default_root_dir=cfg.trainer.default_root_dir`` (``${paths.output_dir}``, so
``${hydra:runtime.output_dir}``) and a CSV logger in the same folder, named with
``${now:...}``: every launch writes to a new folder. The references are uninterrupted
fits in this process, from the config Hydra composes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import hydra_runs
from support.hydra_runs import Project

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    root = tmp_path_factory.mktemp("reference")
    return {
        seed: hydra_runs.reference("lightning", root / f"seed{seed}", f"seed={seed}")
        for seed in (1, 2)
    }


def test_the_same_command_resumes_the_fit_bitwise_in_a_new_output_dir(
    tmp_path: Path, references: dict[int, dict]
) -> None:
    project = Project(tmp_path, "lightning")
    paused = project.pause()
    resumed = project.launch()
    assert resumed.status == 0 and resumed.lines[-1] == "FINISHED", resumed.describe()
    first, again = hydra_runs.output_dirs(paused) + hydra_runs.output_dirs(resumed.lines)
    assert first != again
    assert any(Path(again).rglob("hparams.yaml"))  # the resumed fit logs into its new folder
    hydra_runs.assert_continues_reference(project.result(1), references[1])


def test_a_sweep_ignoring_its_logger_refuses_a_changed_lr_and_resumes_on_the_same_command(
    tmp_path: Path, references: dict[int, dict]
) -> None:
    project = Project(tmp_path, "lightning")
    sweep = ("-m", "seed=1,2", "config_ignore=[logger]")
    paused = project.pause(*sweep, jobs=2)
    before = project.pause_file(1).read_bytes()

    refused = project.launch(*sweep, "logger.level=debug", "optimizer.lr=0.1")
    assert refused.status == 1, refused.describe()
    assert (
        f"{project.pause_file(1)}: the paused run's config differs from this run's at 1 path:\n"
        "  optimizer.lr: 0.05 in the paused run, 0.1 in this run\n"
        "if these keys do not affect training, pass config_ignore=['logger', 'optimizer.lr']"
    ) in refused.stderr, refused.describe()
    assert project.pause_file(1).read_bytes() == before

    resumed = project.launch(*sweep)
    assert resumed.status == 0, resumed.describe()
    assert [line for line in resumed.lines if line == "FINISHED"] == ["FINISHED"] * 2
    assert set(hydra_runs.output_dirs(paused)).isdisjoint(hydra_runs.output_dirs(resumed.lines))
    for seed in (1, 2):
        hydra_runs.assert_continues_reference(project.result(seed), references[seed])
