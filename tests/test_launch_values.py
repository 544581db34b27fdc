"""Values of an OmegaConf config that describe the launch (Hydra's ``${hydra:...}`` and
``${now:...}``, and what is interpolated from them) are signed as written; every other
interpolation is signed by its value.

The ``launch`` fixture stands in for Hydra's two resolvers with values the test sets, so
that a second "launch" with a new run directory and time is one assignment away.
(``support/hydra_apps`` launches real Hydra apps.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf

from trainer_resume.signature import canonical_config, config_signature, sign_config

TEMPLATE = """
task_name: train
paths:
  root_dir: ${oc.env:PROJECT_ROOT}
  log_dir: ${paths.root_dir}/logs
  output_dir: ${hydra:runtime.output_dir}
trainer:
  default_root_dir: ${paths.output_dir}
  max_steps: 10
logger:
  name: ${task_name}-${now:%H-%M-%S}
  save_dir: ${..paths.output_dir}/csv
callbacks: [{dirpath: "${paths.output_dir}/checkpoints"}]
hydra:
  run:
    dir: ${paths.log_dir}/runs/${now:%Y-%m-%d_%H-%M-%S}
"""


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    values = {"runtime.output_dir": "/project/logs/runs/a", "now": "10-00-00"}
    monkeypatch.setenv("PROJECT_ROOT", "/project")
    OmegaConf.register_new_resolver("hydra", lambda key: values[key], replace=True)
    OmegaConf.register_new_resolver("now", lambda pattern: values["now"], replace=True)
    yield values
    setup_globals()  # Hydra's own resolvers back


def _template() -> object:
    return OmegaConf.create(TEMPLATE)


def test_values_from_hydra_and_now_are_signed_as_written_through_chains_of_interpolations(launch):
    canonical = canonical_config(_template())
    assert canonical == {
        "task_name": "train",
        "paths": {
            "root_dir": "/project",
            "log_dir": "/project/logs",
            "output_dir": {"__launch__": "${hydra:runtime.output_dir}"},
        },
        "trainer": {
            "default_root_dir": {"__launch__": "${hydra:runtime.output_dir}"},
            "max_steps": 10,
        },
        "logger": {
            "name": {"__launch__": "train-${now:%H-%M-%S}"},
            "save_dir": {"__launch__": "${hydra:runtime.output_dir}/csv"},
        },
        "callbacks": [{"dirpath": {"__launch__": "${hydra:runtime.output_dir}/checkpoints"}}],
    }


def test_the_same_config_at_another_launch_has_the_same_signature(launch):
    first = config_signature(_template())
    launch.update({"runtime.output_dir": "/project/logs/runs/b", "now": "10-00-07"})
    again = _template()
    assert again.trainer.default_root_dir == "/project/logs/runs/b"  # a new run directory
    assert config_signature(again) == first


def test_a_launch_value_is_not_a_plain_string_of_the_same_text(launch):
    written = OmegaConf.create({"out": "${hydra:runtime.output_dir}"})
    assert config_signature(written) != config_signature({"out": "${hydra:runtime.output_dir}"})


def test_an_env_value_is_signed_by_value_also_beside_a_launch_call(launch, monkeypatch):
    config = {"data": "${oc.env:DATA}", "mixed": "${oc.env:DATA}/${now:%H}"}
    monkeypatch.setenv("DATA", "/data/a")
    before = canonical_config(OmegaConf.create(config))
    assert before == {"data": "/data/a", "mixed": {"__launch__": "/data/a/${now:%H}"}}
    monkeypatch.setenv("DATA", "/data/b")
    assert canonical_config(OmegaConf.create(config)) == {
        "data": "/data/b",
        "mixed": {"__launch__": "/data/b/${now:%H}"},
    }


def test_a_resolver_fed_a_launch_value_makes_a_launch_value(launch):
    config = OmegaConf.create({"a": "${oc.env:NOT_SET_ANYWHERE,${now:%H}}"})
    assert canonical_config(config) == {"a": {"__launch__": "${now:%H}"}}


def test_the_top_level_hydra_node_is_left_out_and_references_into_it_are_launch_values(launch):
    config = OmegaConf.create(
        {"hydra": {"job": {"name": "train"}}, "model": {"hydra": 1}, "name": "${hydra.job.name}-x"}
    )
    assert canonical_config(config) == {
        "model": {"hydra": 1},
        "name": {"__launch__": "${hydra.job.name}-x"},
    }
    # A plain dict is not Hydra's config: its key named hydra is signed.
    assert canonical_config({"hydra": {"job": 1}}) == {"hydra": {"job": 1}}


def test_every_hydra_key_of_the_launch_is_signed_as_written(launch):
    # The launch's keys, as Hydra documents them: directories, job, working directory.
    launch.update(
        {
            "runtime.cwd": "/home/me/project",
            "run.dir": "/project/logs/runs/a",
            "sweep.dir": "/project/logs/multiruns/a",
            "sweep.subdir": "0",
            "job.name": "train",
            "job.num": "0",
            "job.id": "4242",
        }
    )
    keys = [key for key in launch if key != "now"]  # runtime.output_dir and the above
    config = OmegaConf.create({f"k{i}": f"${{hydra:{key}}}" for i, key in enumerate(keys)})
    assert len(keys) == 8 and canonical_config(config) == {
        f"k{i}": {"__launch__": f"${{hydra:{key}}}"} for i, key in enumerate(keys)
    }


def test_a_config_group_choice_read_from_hydra_is_signed_by_its_value(launch):
    # Two options of a group may hold the same values and still build different models
    # (the code branches on the option's name): a changed choice must be refused.
    launch["runtime.choices.model"] = "relu"
    config = {
        "arch": "${hydra:runtime.choices.model}",
        "quoted": "${hydra:'runtime.choices.model'}",
        "overrides": "${hydra:job.config_name}",
    }
    launch["job.config_name"] = "train"
    first = OmegaConf.create(config)
    assert canonical_config(first) == {"arch": "relu", "quoted": "relu", "overrides": "train"}
    signature = config_signature(first)
    launch["runtime.choices.model"] = "tanh"
    assert config_signature(OmegaConf.create(config)) != signature


def test_a_reference_into_the_hydra_node_outside_the_launch_keys_is_signed_by_its_value(launch):
    config = OmegaConf.create(
        {
            "hydra": {"runtime": {"choices": {"model": "relu"}}, "job": {"name": "train"}},
            "arch": "${hydra.runtime.choices.model}",
            "name": "${hydra.job.name}",
        }
    )
    assert canonical_config(config) == {
        "arch": "relu",
        "name": {"__launch__": "${hydra.job.name}"},
    }


def test_a_hydra_key_computed_from_the_config_is_signed_by_its_value(launch):
    launch["runtime.output_dir"] = "/project/logs/runs/a"
    config = OmegaConf.create({"key": "runtime.output_dir", "out": "${hydra:${key}}"})
    assert canonical_config(config) == {
        "key": "runtime.output_dir",
        "out": "/project/logs/runs/a",
    }


def test_a_config_with_launch_values_is_signed_outside_a_hydra_app(launch):
    def outside(key: str) -> str:
        raise ValueError("HydraConfig was not set")

    OmegaConf.register_new_resolver("hydra", outside, replace=True)
    signed = sign_config(_template())
    assert signed.canonical["paths"]["output_dir"] == {"__launch__": "${hydra:runtime.output_dir}"}
    assert signed.legacy_signature is None  # the resolved values cannot be had here


def test_a_typed_field_from_a_launch_value_is_signed_as_written(launch):
    @dataclasses.dataclass
    class Job:
        number: int = "${hydra:job.num}"  # type: ignore[assignment]

    assert canonical_config(OmegaConf.structured(Job))["__dataclass__"]["fields"] == {
        "number": {"__launch__": "${hydra:job.num}"}
    }


def test_the_source_of_each_interpolated_value_is_recorded(launch):
    sources = sign_config(_template()).sources
    assert sources["trainer.default_root_dir"] == (
        "${paths.output_dir}",
        "${hydra:runtime.output_dir}",
    )
    assert sources["logger.save_dir"] == (
        "${..paths.output_dir}/csv",
        "${hydra:runtime.output_dir}",
    )
    assert sources["callbacks[0].dirpath"] == (
        "${paths.output_dir}/checkpoints",
        "${hydra:runtime.output_dir}",
    )
    assert sources["paths.log_dir"] == ("${paths.root_dir}/logs", "${oc.env:PROJECT_ROOT}")
    assert "task_name" not in sources and "hydra.run.dir" not in sources


def test_the_legacy_signature_is_that_of_the_resolved_config_with_its_hydra_node(launch):
    config = _template()
    signed = sign_config(config)
    resolved = OmegaConf.to_container(config, resolve=True)
    assert signed.legacy_signature == config_signature(resolved)
    assert signed.legacy_signature != signed.signature


def test_signing_leaves_the_config_as_it_was_and_its_values_readable(launch):
    config = _template()
    raw = OmegaConf.to_container(config, resolve=False)
    sign_config(config)
    assert OmegaConf.to_container(config, resolve=False) == raw
    assert config.logger.save_dir == "/project/logs/runs/a/csv"
    with pytest.raises(Exception, match="trainer_resume"):
        _ = OmegaConf.create({"x": "${trainer_resume.launch:0}"}).x
