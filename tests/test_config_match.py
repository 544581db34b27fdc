"""A paused run's config against this run's: which ``config_ignore`` lists may resume
which pause, and the refusal (323) that names the pause file, every differing path, the
source of a derived value, the side of an added or removed key and the fix."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from trainer_resume.checks.config_match import check_config
from trainer_resume.errors import CheckpointFormatError, ConfigSignatureMismatchError
from trainer_resume.signature import config_signature, sign_config

PAUSE = "runs/pause.ckpt"


def _config(**changes: Any) -> dict[str, Any]:
    config = {
        "seed": 1,
        "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]},
        "logger": {"level": "info"},
    }
    config.update(changes)
    return config


def _entry(config: Any, ignore: tuple[str, ...] = (), *, recorded: bool = True) -> dict[str, Any]:
    """What a pause of ``config`` records (``recorded=False``: a file of an earlier release)."""
    signed = sign_config(config, ignore=ignore)
    entry = {"config_signature": signed.signature, "config": signed.canonical}
    if recorded:
        entry["config_ignore"] = list(signed.ignore)
    return entry


def _refusal(entry: dict[str, Any], config: Any, ignore: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigSignatureMismatchError) as caught:
        check_config(entry, sign_config(config, ignore=ignore), PAUSE)
    return caught.value.detail


def test_the_same_config_passes_with_or_without_the_recorded_list():
    check_config(_entry(_config()), sign_config(_config()), PAUSE)
    check_config(_entry(_config(), recorded=False), sign_config(_config()), PAUSE)


def test_a_changed_value_names_the_file_both_values_and_the_fix():
    changed = _config(optimizer={"lr": 0.2, "betas": [0.9, 0.99]})
    assert _refusal(_entry(_config()), changed) == (
        f"{PAUSE}: the paused run's config differs from this run's at 1 path:\n"
        "  optimizer.lr: 0.1 in the paused run, 0.2 in this run\n"
        "if these keys do not affect training, pass config_ignore=['optimizer.lr'] (each path "
        "leaves out its subtree); otherwise run with the paused run's values"
    )


def test_an_added_or_removed_key_names_its_side():
    added = _refusal(_entry(_config()), _config(tag="x"))
    assert "\n  tag: in this run, not in the paused one\n" in added
    removed = _refusal(_entry(_config(tag="x")), _config())
    assert "\n  tag: in the paused run, not in this one\n" in removed
    shorter = _refusal(_entry(_config()), _config(optimizer={"lr": 0.1, "betas": [0.9]}))
    assert "\n  optimizer.betas[1]: in the paused run, not in this one\n" in shorter
    assert "pass config_ignore=['optimizer.betas']" in shorter  # a path stops at a list


def test_a_key_order_difference_names_both_orders():
    reordered = {key: _config()[key] for key in ("optimizer", "seed", "logger")}
    assert "\n  <root>: keys in the order [seed, optimizer, logger] in the paused run, " in (
        _refusal(_entry(_config()), reordered)
    )


def test_a_derived_value_names_its_source(monkeypatch):
    config = {"paths": {"out": "${oc.env:OUT}"}, "trainer": {"root": "${paths.out}/fit"}}
    monkeypatch.setenv("OUT", "/a")
    entry = _entry(OmegaConf.create(config))
    monkeypatch.setenv("OUT", "/b")
    detail = _refusal(entry, OmegaConf.create(config))
    assert (
        "at 2 paths:\n  paths.out (from ${oc.env:OUT}): '/a' in the paused run, '/b' in " in detail
    )
    assert (
        "\n  trainer.root (from ${paths.out}/fit, from ${oc.env:OUT}): '/a/fit' in the paused run, "
        "'/b/fit' in this run\n"
    ) in detail
    assert "pass config_ignore=['paths.out', 'trainer.root']" in detail


def test_a_handful_of_differences_is_listed_then_counted_and_all_go_into_the_fix():
    paused = {f"k{index}": index for index in range(8)}
    current = {f"k{index}": index + 1 for index in range(8)}
    detail = _refusal(_entry(paused), current)
    assert "at 8 paths:\n" in detail and "\n  k4: 4 in the paused run, 5 in this run\n" in detail
    assert "k5:" not in detail.split("...")[0] and "\n  ... and 3 more\n" in detail
    assert f"config_ignore={[f'k{index}' for index in range(8)]!r}" in detail


def test_the_fix_keeps_the_declared_paths_and_names_the_new_ones():
    entry = _entry(_config(), ("logger",))
    detail = _refusal(entry, _config(seed=2, logger={"level": "debug"}), ("logger",))
    assert "\n  seed: 1 in the paused run, 2 in this run\nif " in detail  # logger: left out
    assert "pass config_ignore=['logger', 'seed']" in detail


def test_a_run_ignoring_the_paused_paths_and_more_resumes_and_compares_the_rest():
    entry = _entry(_config(tag="a"), ("logger",))
    check_config(entry, sign_config(_config(tag="b"), ignore=("logger", "tag")), PAUSE)
    check_config(
        entry, sign_config(_config(tag="a", logger=1), ignore=("logger.level", "logger")), PAUSE
    )
    detail = _refusal(entry, _config(tag="b", seed=3), ("logger", "tag"))
    assert "at 1 path:\n  seed: 1 in the paused run, 3 in this run\n" in detail


def test_a_run_ignoring_fewer_paths_than_the_paused_run_is_refused_naming_both_lists():
    entry = _entry(_config(), ("logger", "seed"))
    assert _refusal(entry, _config(), ("logger.level", "seed")) == (
        f"{PAUSE} was paused with config_ignore=['logger', 'seed'] and this run passes "
        "config_ignore=['logger.level', 'seed']: the pause file does not hold the paused run's "
        "logger, so they cannot be compared; pass at least the paused run's paths"
    )


def test_a_file_without_its_config_names_both_signatures():
    entry = _entry(_config())
    del entry["config"]
    assert _refusal(entry, _config(seed=2)).startswith(
        f"{PAUSE}: config signature {entry['config_signature'][:16]}... != "
    )


@pytest.mark.parametrize("recorded", ["logger", [1], ["a[0]"]])
def test_a_malformed_recorded_list_is_a_format_error(recorded):
    entry = {**_entry(_config()), "config_ignore": recorded}
    with pytest.raises(CheckpointFormatError, match="config_ignore"):
        check_config(entry, sign_config(_config()), PAUSE)


def test_a_pause_of_an_earlier_release_that_signed_the_hydra_node_resumes():
    # Before launch values were recognised, a top-level hydra node was signed with the rest.
    config = OmegaConf.create({"seed": 1, "hydra": {"job": {"name": "train"}}})
    earlier = {"config_signature": config_signature(OmegaConf.to_container(config))}
    current = sign_config(config)
    assert current.legacy_signature == earlier["config_signature"] != current.signature
    check_config(earlier, current, PAUSE)


def test_a_refused_pause_of_an_earlier_release_says_how_it_resumes():
    earlier = _entry({"name": "run-10"}, recorded=False)
    detail = _refusal(earlier, OmegaConf.create({"name": "run-${now:%H}"}))
    assert "\n  name (from run-${now:%H}): 'run-10' in the paused run, run-${now:%H} in this" in (
        detail
    )
    assert (
        "\nthe pause file signed a launch value resolved, as earlier releases did: it resumes "
        "under the paused run's values (for Hydra, its run directory: hydra.run.dir=...)\n"
    ) in detail
    assert "as earlier releases did" not in _refusal(
        _entry({"name": "run-10"}), OmegaConf.create({"name": "run-${now:%H}"})
    )


@pytest.fixture
def model_choice() -> Any:
    """Hydra's resolver, answering ``runtime.choices.model`` with the value the test sets."""
    from hydra.core.utils import setup_globals

    choice = {"runtime.choices.model": "relu"}
    OmegaConf.register_new_resolver("hydra", lambda key: choice[key], replace=True)
    yield choice
    setup_globals()  # Hydra's own resolvers back


def test_a_pause_that_signed_a_config_group_choice_as_written_is_refused_naming_the_fix(
    model_choice,
):
    # Earlier releases signed every ${hydra:...} value as written, the option a config
    # group was composed with too: such a pause file does not hold the option it ran.
    config = OmegaConf.create({"seed": 1, "arch": "${hydra:runtime.choices.model}"})
    earlier = {
        "config_signature": "0" * 64,
        "config": {"seed": 1, "arch": {"__launch__": "${hydra:runtime.choices.model}"}},
        "config_ignore": [],
    }
    detail = _refusal(earlier, config)
    assert detail == (
        f"{PAUSE}: the paused run's config differs from this run's at 1 path:\n"
        "  arch (from ${hydra:runtime.choices.model}): ${hydra:runtime.choices.model} in the "
        "paused run, 'relu' in this run\n"
        "the pause file signed arch (${hydra:runtime.choices.model}) as written, as earlier "
        "releases signed every ${hydra:...} value; only the launch's directories, job name, "
        "number and id and working directory are signed so now, and the paused run's value is "
        "not in the pause file: if it was this run's, pass config_ignore=['arch'] to resume it\n"
        "if these keys do not affect training, pass config_ignore=['arch'] (each path leaves "
        "out its subtree); otherwise run with the paused run's values"
    )
    check_config(earlier, sign_config(config, ignore=("arch",)), PAUSE)  # the fix it names
    assert "as earlier releases signed" not in _refusal(_entry({"seed": 1, "arch": "tanh"}), config)


def test_a_launch_directory_replaced_by_a_value_of_the_users_is_refused_without_blaming_a_release():
    # ckpt_dir follows out_dir, the run directory in the paused run (a launch value this
    # release signs as written) and a directory of the user's in this one.
    OmegaConf.register_new_resolver("hydra", lambda key: "outputs/12-00-00", replace=True)
    try:
        paused = OmegaConf.create(
            {"out_dir": "${hydra:runtime.output_dir}", "ckpt_dir": "${out_dir}/ckpt"}
        )
        now = OmegaConf.create({"out_dir": "/elsewhere", "ckpt_dir": "${out_dir}/ckpt"})
        detail = _refusal(_entry(paused), now)
    finally:
        from hydra.core.utils import setup_globals

        setup_globals()  # Hydra's own resolvers back
    assert (
        "ckpt_dir (from ${out_dir}/ckpt): ${hydra:runtime.output_dir}/ckpt in the paused run"
        in detail
    )
    assert "earlier releases" not in detail
