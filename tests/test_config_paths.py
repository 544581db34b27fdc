"""Dotted config paths left out of a signature (``exclude``, ``config_ignore``), and the
list of every difference between two canonical forms."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from trainer_resume.config_paths import config_paths, covering_paths, ignorable_path
from trainer_resume.signature import (
    Difference,
    canonical_config,
    config_differences,
    config_signature,
    sign_config,
)


def _config() -> dict:
    return {
        "seed": 1,
        "logger": {"level": "info", "name": "run-a"},
        "trainer": {"default_root_dir": "runs/a", "max_steps": 10},
        "load": "pause.ckpt",
    }


@dataclasses.dataclass
class Logger:
    level: str = "info"
    every: int = 10


@dataclasses.dataclass
class Config:
    seed: int = 1
    logger: Logger = dataclasses.field(default_factory=Logger)


# --- leaving paths out --------------------------------------------------------------


def test_a_dotted_path_leaves_out_that_key_and_keeps_its_siblings():
    changed = _config()
    changed["trainer"]["default_root_dir"] = "runs/b"
    exclude = ("load", "trainer.default_root_dir")
    assert config_signature(changed, exclude=exclude) == config_signature(
        _config(), exclude=exclude
    )
    assert canonical_config(_config(), exclude=exclude)["trainer"] == {"max_steps": 10}
    changed["trainer"]["max_steps"] = 11
    assert config_signature(changed, exclude=exclude) != config_signature(
        _config(), exclude=exclude
    )


def test_a_path_leaves_out_its_whole_subtree_also_where_keys_were_added():
    changed = _config()
    changed["logger"] = {"level": "debug", "name": "run-b", "tag": "x"}
    assert config_signature(changed, exclude=("load", "logger")) == config_signature(
        _config(), exclude=("load", "logger")
    )
    del changed["logger"]
    assert config_signature(changed, exclude=("load", "logger")) == config_signature(
        _config(), exclude=("load", "logger")
    )


def test_paths_reach_into_omegaconf_configs_and_dataclasses_and_are_never_read():
    config = OmegaConf.create({"seed": 1, "logger": {"level": "???", "name": "${nowhere}"}})
    assert canonical_config(config, exclude=("logger.level", "logger.name")) == {
        "seed": 1,
        "logger": {},
    }
    assert canonical_config(Config(), exclude=("logger.every",))["__dataclass__"]["fields"][
        "logger"
    ]["__dataclass__"]["fields"] == {"level": "info"}
    structured = OmegaConf.structured(Config)
    assert canonical_config(structured, exclude=("logger.every",)) == canonical_config(
        Config(), exclude=("logger.every",)
    )


def test_a_key_that_is_not_a_plain_name_is_written_in_brackets():
    config = {"a.b": {"c d": 1, "e": 2}}
    assert canonical_config(config, exclude=("['a.b']['c d']",)) == {"a.b": {"e": 2}}
    assert canonical_config(config, exclude=('["a.b"].e',)) == {"a.b": {"c d": 1}}


def test_a_string_without_dot_or_bracket_is_one_key_as_before():
    assert canonical_config({"my key": 1, "1x": 2, "k": 3}, exclude=("my key", "1x")) == {"k": 3}


@pytest.mark.parametrize("path", ["layers[0]", "layers[0].act", "a[x]"])
def test_a_path_through_a_list_index_is_refused_naming_the_fix(path):
    with pytest.raises(ValueError, match="cannot go through a list, leave the list out whole"):
        config_paths([path])


@pytest.mark.parametrize("path", ["a..b", "a.", ".a", "a.['b'", "a['b']c"])
def test_a_malformed_path_is_refused_naming_it(path):
    with pytest.raises(ValueError, match="config_ignore path"):
        config_paths([path])


@pytest.mark.parametrize("paths", ["logger", [1], None])
def test_paths_must_be_a_collection_of_str(paths):
    with pytest.raises(TypeError, match="config_ignore"):
        config_paths(paths)


def test_paths_are_printed_as_differences_print_them_sorted_and_once():
    assert config_paths(["trainer.x", "['logger']", "logger", "['a b'].c"]) == (
        "['a b'].c",
        "logger",
        "trainer.x",
    )


def test_a_path_covers_itself_and_what_lies_below_it():
    assert (
        covering_paths(["logger", "paths.output_dir"], ["logger.level", "paths.output_dir"]) == []
    )
    assert covering_paths(["logger.level"], ["logger", "paths"]) == ["logger", "paths"]


def test_a_signed_config_records_the_declared_paths_apart_from_load():
    signed = sign_config(_config(), ignore=["logger", "trainer.default_root_dir"])
    assert signed.ignore == ("logger", "trainer.default_root_dir")
    assert signed.exclude == ("load", "logger", "trainer.default_root_dir")
    assert signed.canonical == {"seed": 1, "trainer": {"max_steps": 10}}
    assert signed.signature == config_signature(_config(), exclude=signed.exclude)
    assert signed.legacy_signature is None  # no launch values: nothing signed otherwise before


# --- every difference -----------------------------------------------------------------


def test_every_difference_is_listed_in_the_first_differences_order():
    paused = canonical_config(
        {"a": 1, "b": {"x": 1, "y": 2}, "c": [1, 2, 3], "gone": 0}, exclude=()
    )
    current = canonical_config({"a": 2, "b": {"y": 2, "x": 1}, "c": [1, 5], "new": 0}, exclude=())
    assert config_differences(paused, current) == [
        Difference("gone", "only_a", 0, None),
        Difference("new", "only_b", None, 0),
        Difference("a", "value", 1, 2),
        Difference("b", "order", ["x", "y"], ["y", "x"]),
        Difference("c[1]", "value", 2, 5),
        Difference("c[2]", "only_a", 3, None),
    ]
    assert len(config_differences(paused, current, limit=2)) == 2


def test_the_paths_of_differences_are_accepted_as_paths_up_to_a_list_index():
    paused = canonical_config({"a.b": {"c": [{"d": 1}]}, "e": {"f": 1}}, exclude=())
    current = canonical_config({"a.b": {"c": [{"d": 2}]}, "e": {"f": 2}}, exclude=())
    paths = [ignorable_path(found.path) for found in config_differences(paused, current)]
    assert paths == ["['a.b'].c", "e.f"]
    assert config_paths(paths) == ("['a.b'].c", "e.f")
    assert ignorable_path("[0]") is None and ignorable_path("") is None
