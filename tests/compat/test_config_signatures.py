"""Configs without launch values sign as an earlier release signed them, and the pause
files that release wrote resume exactly.

The package as it was before launch values and ``config_ignore`` (commit 158d509) signs
the configs of ``configs.py`` and writes pause files signed with them
(``write_config_pauses.py``), once per run of this module, on this machine. The current
code must give the same signatures, and resume the files to the same end as an
uninterrupted run of the current code. A config with a top-level ``hydra`` node is no
longer signed with that node, yet its earlier pause file still resumes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import earlier_release

from compat import configs as configs_file
from compat import trainers
from trainer_resume import config_signature
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow  # one script under the earlier package

BEFORE_LAUNCH_VALUES = "158d509"  # the last commit that signed launch values resolved
configs = configs_file.load()  # under the name the earlier release's script used


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in configs.ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("earlier")
    package_root = earlier_release.extract(BEFORE_LAUNCH_VALUES, scratch / "package")
    out = scratch / "fixtures"
    earlier_release.run_script(
        package_root, Path(__file__).with_name("write_config_pauses.py"), str(out)
    )
    return out


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _resumed_to_the_end(path: Path, config: Any) -> dict[str, Any]:
    resumed = trainers.CompatTrainer(config=config)
    resumed.resume(path)
    assert resumed.completed_steps == trainers.PAUSE_STEP
    resumed.run_to(trainers.STEPS)
    resumed.loader.close()
    return resumed.outcome()


def _uninterrupted(config: Any) -> dict[str, Any]:
    trainer = trainers.CompatTrainer(config=config)
    trainer.run_to(trainers.STEPS)
    trainer.loader.close()
    outcome = trainer.outcome()
    return {**outcome, "losses": outcome["losses"][trainers.PAUSE_STEP :]}


def test_configs_without_launch_values_have_the_earlier_signatures(fixtures: Path) -> None:
    earlier = json.loads((fixtures / "signatures.json").read_text())
    current = {name: config_signature(config) for name, config in configs.configs().items()}
    assert current == {name: earlier[name] for name in configs.configs()}


def test_an_earlier_mixin_pause_of_an_omegaconf_config_resumes_bitwise(
    fixtures: Path, tmp_path: Path
) -> None:
    shutil.copy(fixtures / "mixin.ckpt", tmp_path / "pause.ckpt")
    config = configs.configs()["omegaconf"]
    _assert_same(
        _uninterrupted(config), _resumed_to_the_end(tmp_path / "pause.ckpt", config), "mixin"
    )


def test_an_earlier_pause_of_a_config_with_a_hydra_node_still_resumes_bitwise(
    fixtures: Path, tmp_path: Path
) -> None:
    shutil.copy(fixtures / "hydra_node.ckpt", tmp_path / "pause.ckpt")
    config = configs.with_hydra_node()
    earlier = json.loads((fixtures / "signatures.json").read_text())["with_hydra_node"]
    assert config_signature(config) != earlier  # the hydra node is no longer signed
    _assert_same(
        _uninterrupted(config), _resumed_to_the_end(tmp_path / "pause.ckpt", config), "hydra node"
    )


def test_an_earlier_lightning_pause_of_an_omegaconf_config_resumes_bitwise(
    fixtures: Path, tmp_path: Path
) -> None:
    resumed = shutil.copytree(fixtures / "lightning", tmp_path / "resumed")
    (tmp_path / "reference").mkdir()
    config = configs.configs()["omegaconf"]
    expected = trainers.fit_lightning(tmp_path / "reference", config=config)
    actual = trainers.fit_lightning(resumed, resume=True, config=config)
    _assert_same(
        {**expected, "losses": expected["losses"][trainers.PAUSE_STEP :]}, actual, "Lightning"
    )
