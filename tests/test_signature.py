"""Order-sensitive config signatures and their first difference."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path, PurePosixPath

import pytest
import torch
from omegaconf import OmegaConf

from trainer_resume.signature import canonical_config, config_difference, config_signature


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass
class Optim:
    lr: float = 0.1
    betas: tuple = (0.9, 0.99)


@dataclasses.dataclass
class OtherOptim:
    lr: float = 0.1
    betas: tuple = (0.9, 0.99)


@dataclasses.dataclass
class Config:
    seed: int = 1
    optim: Optim = dataclasses.field(default_factory=Optim)
    load: str = "last.ckpt"


def _config() -> dict:
    return {
        "seed": 1,
        "model": {"width": 8, "layers": [{"act": "relu"}, {"act": "gelu"}, {"act": "relu"}]},
        "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]},
        "data": {"root": "data/", "batch_size": 4},
        "load": "runs/pause.ckpt",
    }


def _every_accepted_type() -> dict:
    return {
        "none": None,
        "flag": True,
        "count": 3,
        "rate": 0.1,
        "text": "abc",
        "path": Path("runs/a"),
        "color": Color.RED,
        "level": Level.LOW,
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "generator": torch.Generator().manual_seed(3),
        "tuple": (1, 2.5),
        "dataclass": Optim(),
        "omegaconf": OmegaConf.create({"a": [1, {"b": 2}]}),
        "special": [math.nan, math.inf, -math.inf, -0.0],
    }


# --- order sensitivity ------------------------------------------------------------


def test_same_config_gives_the_same_signature():
    assert config_signature(_config()) == config_signature(_config())
    assert len(config_signature(_config())) == 64


@pytest.mark.parametrize(
    "reorder, where",
    [
        (lambda c: {k: c[k] for k in ["model", "seed", "optimizer", "data", "load"]}, "<root>"),
        (lambda c: {**c, "model": {"layers": c["model"]["layers"], "width": 8}}, "model"),
        (lambda c: {**c, "optimizer": {"betas": [0.9, 0.99], "lr": 0.1}}, "optimizer"),
        (lambda c: {**c, "data": {"batch_size": 4, "root": "data/"}}, "data"),
    ],
)
def test_key_order_matters_at_every_level(reorder, where):
    changed = reorder(_config())
    assert config_signature(changed) != config_signature(_config())
    assert config_difference(_config(), changed).startswith(f"key order differs at {where}: ")


def test_key_order_inside_a_list_item_matters():
    a = {"layers": [{"act": "relu", "width": 2}]}
    b = {"layers": [{"width": 2, "act": "relu"}]}
    assert config_signature(a) != config_signature(b)
    assert config_difference(a, b) == "key order differs at layers[0]: [act, width] vs [width, act]"


def test_json_sort_keys_round_trip_is_a_mismatch_naming_the_path():
    config = {"trainer": {"steps": 10}, "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}}
    sorted_copy = json.loads(json.dumps(config, sort_keys=True))
    assert config_signature(sorted_copy) != config_signature(config)
    assert config_difference(config, sorted_copy) == (
        "key order differs at <root>: [trainer, optimizer] vs [optimizer, trainer]"
    )
    inner_only = {"trainer": config["trainer"], "optimizer": sorted_copy["optimizer"]}
    assert (
        config_difference(config, inner_only)
        == "key order differs at optimizer: [lr, betas] vs [betas, lr]"
    )


# --- exclusion --------------------------------------------------------------------


def test_load_is_excluded_by_default():
    other = {**_config(), "load": "elsewhere.ckpt"}
    assert config_signature(other) == config_signature(_config())
    assert config_difference(other, _config()) is None
    assert "load" not in canonical_config(_config())


def test_exclude_removes_top_level_keys_only():
    a = {"load": 1, "model": {"load": 1}}
    b = {"load": 2, "model": {"load": 2}}
    assert config_difference(a, b) == "model.load: 1 vs 2"
    assert config_difference(a, b, exclude=()) == "load: 1 vs 2"
    assert config_signature({"load": 1, "x": 1}, exclude=("load", "x")) == config_signature({})


def test_excluded_values_are_never_read():
    config = {"seed": 1, "load": object()}
    assert canonical_config(config) == {"seed": 1}
    assert canonical_config(OmegaConf.create({"seed": 1, "load": "???"})) == {"seed": 1}


def test_exclude_applies_to_top_level_dataclass_fields():
    assert config_signature(Config(load="a")) == config_signature(Config(load="b"))
    assert config_difference(Config(load="a"), Config(load="b"), exclude=()) == "load: 'a' vs 'b'"


def test_exclude_given_as_a_string_is_refused():
    with pytest.raises(TypeError, match="exclude"):
        config_signature({}, exclude="load")


# --- OmegaConf --------------------------------------------------------------------


def test_omegaconf_with_interpolation_equals_the_literal_config():
    literal = {
        "lr": 0.1,
        "optimizer": {"lr": 0.1, "name": "sgd-0.1"},
        "paths": ["out/sgd", "out/sgd/ckpt"],
    }
    interpolated = OmegaConf.create(
        {
            "lr": 0.1,
            "optimizer": {"lr": "${lr}", "name": "sgd-${lr}"},
            "paths": ["out/sgd", "${paths[0]}/ckpt"],
        }
    )
    assert canonical_config(interpolated) == literal
    assert config_signature(interpolated) == config_signature(literal)
    assert config_difference(interpolated, literal) is None


def test_omegaconf_from_yaml_keeps_document_order():
    a = OmegaConf.create("optimizer:\n  lr: 0.1\n  betas: [0.9, 0.99]\n")
    b = OmegaConf.create("optimizer:\n  betas: [0.9, 0.99]\n  lr: 0.1\n")
    assert config_difference(a, b) == "key order differs at optimizer: [lr, betas] vs [betas, lr]"


def test_omegaconf_missing_value_names_the_path():
    config = OmegaConf.create({"model": {"layers": [1, "???"]}})
    with pytest.raises(ValueError, match=r"model\.layers\[1\] is missing"):
        canonical_config(config)
    with pytest.raises(ValueError, match=r"optimizer\.lr is missing"):
        config_signature(OmegaConf.create({"optimizer": {"lr": "???"}}))


def test_omegaconf_unresolvable_interpolation_names_the_path():
    with pytest.raises(ValueError, match=r"model\.width cannot be read"):
        canonical_config(OmegaConf.create({"model": {"width": "${nowhere}"}}))


def test_structured_omegaconf_equals_its_dataclass():
    assert canonical_config(OmegaConf.structured(Config)) == canonical_config(Config())
    assert config_signature(OmegaConf.structured(Config())) == config_signature(Config())


# --- accepted types ---------------------------------------------------------------


def test_every_accepted_type_gives_plain_json_data():
    canonical = canonical_config(_every_accepted_type())
    text = json.dumps(canonical, allow_nan=False)  # strict JSON: nan/inf are tagged
    assert json.loads(text) == canonical


def test_canonical_form_is_idempotent():
    canonical = canonical_config(_every_accepted_type())
    assert canonical_config(canonical) == canonical
    assert json.dumps(canonical_config(canonical)) == json.dumps(canonical)
    assert config_signature(canonical) == config_signature(_every_accepted_type())


def test_canonical_form_read_back_from_json_has_the_same_signature():
    config = _every_accepted_type()
    stored = json.loads(json.dumps(canonical_config(config)))
    assert config_signature(stored) == config_signature(config)
    assert config_difference(stored, config) is None


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (1, 1.0, "x: 1 vs 1.0"),
        (1, True, "x: 1 vs True"),
        (0, False, "x: 0 vs False"),
        (1.0, True, "x: 1.0 vs True"),
        (0.0, -0.0, "x: 0.0 vs -0.0"),
        (0.1, 0.1 + 1e-17 + 2e-17, "x: 0.1 vs 0.10000000000000003"),
        (math.nan, math.inf, "x: nan vs inf"),
        (math.inf, -math.inf, "x: inf vs -inf"),
        (None, "None", "x: None vs 'None'"),
        ("1", 1, "x: '1' vs 1"),
    ],
)
def test_scalars_of_different_type_or_bits_differ(a, b, expected):
    assert config_signature({"x": a}) != config_signature({"x": b})
    assert config_difference({"x": a}, {"x": b}) == expected


def test_nan_equals_nan():
    assert config_signature({"x": math.nan}) == config_signature({"x": float("nan")})
    assert config_difference({"x": math.nan}, {"x": -math.nan}) is None


@pytest.mark.parametrize(
    "tagged, text, shown",
    [
        (Path("runs/a"), "runs/a", "Path('runs/a')"),
        (PurePosixPath("x"), "x", "Path('x')"),
        (Color.RED, "RED", f"enum {__name__}.Color.RED"),
        (torch.float32, "torch.float32", "torch.float32"),
        (torch.device("cpu"), "cpu", "device('cpu')"),
    ],
)
def test_tagged_values_do_not_collide_with_plain_strings(tagged, text, shown):
    assert config_signature({"x": tagged}) != config_signature({"x": text})
    assert config_difference({"x": tagged}, {"x": text}) == f"x: {shown} vs {text!r}"


def test_int_enum_differs_from_its_int_value():
    assert config_difference({"x": Level.LOW}, {"x": 1}) == f"x: enum {__name__}.Level.LOW vs 1"


def test_enum_members_differ():
    assert config_difference({"c": Color.RED}, {"c": Color.BLUE}) == (
        f"c: enum {__name__}.Color.RED vs enum {__name__}.Color.BLUE"
    )


def test_dtypes_and_devices_differ():
    assert (
        config_difference({"d": torch.float16}, {"d": torch.bfloat16})
        == "d: torch.float16 vs torch.bfloat16"
    )
    assert config_difference({"d": torch.device("cpu")}, {"d": torch.device("meta")}) == (
        "d: device('cpu') vs device('meta')"
    )


def test_tuples_and_lists_are_the_same_config():
    assert config_signature({"x": (1, 2)}) == config_signature({"x": [1, 2]})


def test_dataclass_follows_field_order_and_type():
    assert canonical_config(Optim())["__dataclass__"]["fields"] == {"lr": 0.1, "betas": [0.9, 0.99]}
    assert config_difference({"o": Optim()}, {"o": Optim(lr=0.2)}) == "o.lr: 0.1 vs 0.2"
    assert config_difference({"o": Optim()}, {"o": OtherOptim()}) == (
        f"o: dataclass {__name__}.Optim vs dataclass {__name__}.OtherOptim"
    )
    assert config_signature(Optim()) != config_signature({"lr": 0.1, "betas": [0.9, 0.99]})


def test_generator_is_signed_by_its_current_state():
    generator = torch.Generator().manual_seed(5)
    before = config_signature({"g": generator})
    assert config_signature({"g": torch.Generator().manual_seed(5)}) == before
    torch.rand(1, generator=generator)
    assert config_signature({"g": generator}) != before
    assert config_difference({"g": torch.Generator().manual_seed(5)}, {"g": generator}).startswith(
        "g: Generator(device='cpu', state sha256 "
    )


# --- refusals name the path -------------------------------------------------------


def test_unsupported_value_names_its_path():
    config = {"model": {"layers": [{"act": "relu"}, {"act": object()}]}}
    with pytest.raises(
        TypeError, match=r"model\.layers\[1\]\.act has unsupported type builtins\.object"
    ):
        config_signature(config)


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, 1 + 2j, torch.tensor(1.0), lambda: 0, int])
def test_other_types_are_refused_not_repr_ed(value):
    with pytest.raises(TypeError, match=r"at x "):
        canonical_config({"x": value})


def test_non_str_key_names_the_path():
    with pytest.raises(TypeError, match=r"key 1 in the mapping at model\.layers\[0\]"):
        canonical_config({"model": {"layers": [{1: "a"}]}})
    with pytest.raises(TypeError, match=r"key .*Color\.RED.* at <root>"):
        canonical_config({Color.RED: 1})


def test_unsupported_top_level_value_is_refused():
    with pytest.raises(TypeError, match="<root>"):
        config_signature(object())


def test_reserved_key_next_to_others_is_refused():
    with pytest.raises(ValueError, match=r"at model uses the reserved key '__path__'"):
        canonical_config({"model": {"__path__": "a", "width": 2}})


def test_malformed_tagged_value_is_refused():
    with pytest.raises(ValueError, match=r"at x has the reserved key '__float__'"):
        canonical_config({"x": {"__float__": "1.5"}})
    with pytest.raises(ValueError, match=r"at x has the reserved key '__path__'"):
        canonical_config({"x": {"__path__": ["a"]}})


def test_self_containing_config_is_refused():
    config: dict = {"a": []}
    config["a"].append(config)
    with pytest.raises(ValueError, match=r"a\[0\] contains itself"):
        canonical_config(config)


# --- difference messages ----------------------------------------------------------


def test_equal_configs_have_no_difference():
    assert config_difference(_config(), _config()) is None


def test_value_difference_names_the_path():
    changed = _config()
    changed["optimizer"]["lr"] = 0.01
    assert config_difference(_config(), changed) == "optimizer.lr: 0.1 vs 0.01"


def test_missing_list_item_names_the_index():
    changed = _config()
    del changed["model"]["layers"][2]
    assert config_difference(_config(), changed) == "model.layers[2]: missing in b"
    assert config_difference(changed, _config()) == "model.layers[2]: missing in a"


def test_missing_key_names_the_side():
    changed = _config()
    changed["optimizer"]["momentum"] = 0.9
    assert config_difference(_config(), changed) == "optimizer.momentum: missing in a"
    assert config_difference(changed, _config()) == "optimizer.momentum: missing in b"


def test_kind_difference_is_described():
    assert (
        config_difference({"m": {"a": 1}}, {"m": [1]})
        == "m: a mapping of 1 key(s) vs a list of 1 item(s)"
    )
    assert config_difference({"m": "x"}, {"m": None}) == "m: 'x' vs None"


def test_odd_keys_are_quoted_in_paths():
    assert config_difference({"a.b": {"c d": 1}}, {"a.b": {"c d": 2}}) == "['a.b']['c d']: 1 vs 2"


def test_difference_accepts_a_canonical_form_and_a_config():
    saved = canonical_config(_config())
    changed = _config()
    changed["data"]["batch_size"] = 8
    assert config_difference(saved, changed) == "data.batch_size: 4 vs 8"
    assert config_difference(json.loads(json.dumps(saved)), OmegaConf.create(_config())) is None
