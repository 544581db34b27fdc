"""A Hydra app with the mixin, laid out like the Lightning + Hydra template and launched as
a user launches it, pauses on a real SIGTERM and resumes bitwise when its command is run
again, although Hydra gives every launch a new output directory.

The app (``support/hydra_apps/mixin_app.py``) signs its whole ``DictConfig``: the
trainer's ``default_root_dir`` comes from ``${paths.output_dir}`` and so from
``${hydra:runtime.output_dir}``, the logger's run name from ``${now:...}``, the data
folder from ``${oc.env:DATA_DIR}``, the model's activation from the option of a config
group (``${hydra:runtime.choices.activation}``). The references are uninterrupted runs in this
process, from the config Hydra composes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import hydra_runs
from support.hydra_runs import Project

from trainer_resume import load_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    root = tmp_path_factory.mktemp("reference")
    return {
        seed: hydra_runs.reference("mixin", root / f"seed{seed}", f"seed={seed}") for seed in (1, 2)
    }


def test_the_same_command_resumes_bitwise_and_a_changed_logger_level_is_refused_naming_the_fix(
    tmp_path: Path, references: dict[int, dict]
) -> None:
    project = Project(tmp_path, "mixin")
    paused = project.pause()
    pause_file = project.pause_file()
    before = pause_file.read_bytes()

    for override, difference in (
        (
            "logger.level=debug",
            "  logger.level: 'info' in the paused run, 'debug' in this run\n"
            "if these keys do not affect training, pass config_ignore=['logger.level']",
        ),
        (  # another option of the activation group: the same values, another model
            "activation=tanh",
            "  model.activation (from ${hydra:runtime.choices.activation}): 'relu' in the "
            "paused run, 'tanh' in this run\n",
        ),
    ):
        refused = project.launch(override)
        assert refused.status == 1, refused.describe()
        assert (
            f"[323] config differs from the paused run: {pause_file}: the paused run's config "
            f"differs from this run's at 1 path:\n{difference}"
        ) in refused.stderr, refused.describe()
        assert pause_file.read_bytes() == before  # the refusal lost nothing

    resumed = project.launch()
    assert resumed.status == 0 and resumed.lines[-1] == "FINISHED", resumed.describe()
    # The pause path lies under ${paths.root_dir}, outside the run directory: no warning.
    assert "Hydra run directory" not in resumed.stderr, resumed.describe()
    assert resumed.lines[1].startswith(f"STEP {hydra_runs.PAUSE_STEP + 1} ")
    first, again = output_dirs = hydra_runs.output_dirs(paused) + hydra_runs.output_dirs(
        resumed.lines
    )
    assert first != again and all(Path(folder).is_dir() for folder in output_dirs)
    hydra_runs.assert_continues_reference(project.result(1), references[1])


def test_a_sweep_ignoring_its_logger_refuses_a_changed_lr_and_data_dir_and_resumes_another_log_level(
    tmp_path: Path, references: dict[int, dict]
) -> None:
    project = Project(tmp_path, "mixin")
    sweep = ("-m", "seed=1,2", "config_ignore=[logger]")
    paused = project.pause(*sweep, jobs=2)
    assert load_checkpoint(project.pause_file(2))["config_ignore"] == ["logger"]

    refused = project.launch(
        *sweep, "logger.level=debug", "optimizer.lr=0.1", env={"DATA_DIR": str(tmp_path / "other")}
    )
    assert refused.status == 1, refused.describe()  # Hydra's status when a job raised
    assert (
        "the paused run's config differs from this run's at 2 paths:\n"
        f"  data.dir (from ${{oc.env:DATA_DIR}}): '{tmp_path / 'data'}' in the paused run, "
        f"'{tmp_path / 'other'}' in this run\n"
        "  optimizer.lr: 0.05 in the paused run, 0.1 in this run\n"
        "if these keys do not affect training, pass config_ignore=['data.dir', 'logger', "
        "'optimizer.lr']"
    ) in refused.stderr, refused.describe()

    resumed = project.launch(*sweep, "logger.level=debug")
    assert resumed.status == 0, resumed.describe()
    assert [line for line in resumed.lines if line == "FINISHED"] == ["FINISHED"] * 2
    assert set(hydra_runs.output_dirs(paused)).isdisjoint(hydra_runs.output_dirs(resumed.lines))
    for seed in (1, 2):
        hydra_runs.assert_continues_reference(project.result(seed), references[seed])


def test_a_pause_path_in_the_launchs_run_directory_is_warned_about_before_training(
    tmp_path: Path,
) -> None:
    # Hydra names the run directory by the launch time: a requeue would not find the pause.
    project = Project(tmp_path, "mixin")
    inside = project.launch("pause_path=${paths.output_dir}/pause.ckpt")
    assert inside.status == 0, inside.describe()
    (output_dir,) = hydra_runs.output_dirs(inside.lines)
    assert (
        f"UnsavedStateWarning: the pause path {output_dir}/pause.ckpt lies in this launch's "
        f"Hydra run directory {output_dir}, which Hydra names by the launch time"
    ) in inside.stderr, inside.describe()
    # A pause path outside it is not warned about: the resumed launch of the first test.
