"""Canonical module names: the unwrapped module's names, matched onto a module however wrapped.

``torch.compile`` here only builds the ``OptimizedModule`` (its names); nothing is compiled.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from trainer_resume._module_names import (
    canonical_parameters,
    canonical_state,
    describe_key_difference,
    live_state,
    loading_module,
    match_names,
    strip_wrapper_names,
)


def _network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.Linear(4, 2)))


def _wrapped(kind: str) -> nn.Module:
    """The same network (same weights) wrapped as ``kind`` says."""
    network = _network()
    if kind == "checkpointed":  # activation checkpointing on blocks, as torchtitan applies it
        network[0] = checkpoint_wrapper(network[0])
        network[2] = checkpoint_wrapper(network[2])
        return network
    if kind == "compiled blocks":  # torchtitan's per-block torch.compile, replacing each block
        network[0] = torch.compile(network[0])
        network[2] = torch.compile(checkpoint_wrapper(network[2]))
        return network
    wrappers = {
        "plain": lambda m: m,
        "compiled": torch.compile,
        "parallel": nn.DataParallel,
        "compiled parallel": lambda m: torch.compile(nn.DataParallel(m)),
        "parallel compiled": lambda m: nn.DataParallel(torch.compile(m)),
    }
    return wrappers[kind](network)


KINDS = (
    "plain",
    "compiled",
    "parallel",
    "compiled parallel",
    "parallel compiled",
    "checkpointed",
    "compiled blocks",
)
PLAIN_KEYS = list(_network().state_dict())
PLAIN_PARAMETERS = [name for name, _ in _network().named_parameters()]


@pytest.mark.parametrize("kind", KINDS)
def test_a_wrapped_modules_state_and_parameters_have_the_unwrapped_modules_names(kind):
    module = _wrapped(kind)
    assert list(canonical_state(module)) == PLAIN_KEYS
    assert [name for name, _ in canonical_parameters(module)] == PLAIN_PARAMETERS
    assert [p for _, p in canonical_parameters(module)] == list(module.parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_the_canonical_state_keeps_each_submodules_version(kind):
    metadata = canonical_state(_wrapped(kind))._metadata
    assert metadata["1"] == {"version": 2}  # BatchNorm's, which load_state_dict reads
    assert set(metadata) == set(_network().state_dict()._metadata)


@pytest.mark.parametrize("saved_kind", KINDS)
@pytest.mark.parametrize("live_kind", KINDS)
@pytest.mark.parametrize("names", ["canonical", "the wrappers'"])
def test_a_state_of_any_wrapping_loads_strictly_into_any_other(saved_kind, live_kind, names):
    saved = _wrapped(saved_kind)
    with torch.no_grad():
        for param in saved.parameters():
            param.add_(1.0)  # distinguishable from the live module's initial weights
    # "the wrappers'": the state_dict() an earlier release saved as it was.
    state = canonical_state(saved) if names == "canonical" else saved.state_dict()
    live = _wrapped(live_kind)
    live.load_state_dict(live_state(state, live), strict=True)
    assert list(canonical_state(live)) == PLAIN_KEYS
    for (key, expected), actual in zip(
        canonical_state(saved).items(), canonical_state(live).values()
    ):
        assert torch.equal(expected, actual), key


class Averaged(nn.Module):
    """An EMA-style holder whose own submodule is called ``module`` (timm's ModelEmaV2)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = _network()


def test_a_submodule_of_the_users_called_module_keeps_its_name_under_ddp_style_wrappers():
    names = list(_network().state_dict())
    assert list(canonical_state(Averaged())) == [f"module.{n}" for n in names]
    assert list(canonical_state(nn.DataParallel(Averaged()))) == [f"module.{n}" for n in names]
    # An earlier release's file of the DataParallel-wrapped holder: module.module.<name>.
    earlier = nn.DataParallel(Averaged()).state_dict()
    assert list(live_state(earlier, Averaged())) == [f"module.{n}" for n in names]
    # Its own file (canonical) into itself, unchanged.
    own = Averaged().state_dict()
    assert live_state(own, Averaged()) is own


def test_names_that_match_nothing_stay_as_they_are_for_load_state_dict_to_name():
    state = OrderedDict(canonical_state(_network()))
    state["extra.weight"] = torch.zeros(1)
    renamed = live_state(state, torch.compile(_network()))
    assert "extra.weight" in renamed
    assert "_orig_mod.0.weight" in renamed


def test_two_saved_names_never_stand_for_one_live_name():
    assert match_names(["_orig_mod.w", "w"], {"w"}) == {"w": "w"}


def test_an_export_leaves_out_compile_and_checkpoint_names_but_keeps_a_module_that_may_be_the_users():
    compiled = torch.compile(checkpoint_wrapper(nn.DataParallel(_network())))
    stripped = strip_wrapper_names(compiled.state_dict())
    assert list(stripped) == [f"module.{name}" for name in PLAIN_KEYS]


def test_a_key_difference_names_the_first_keys_side_by_side_and_a_prefix_on_either_side():
    saved = ["0.weight", "0.bias"]
    held = ["net.0.weight", "net.0.bias"]
    described = describe_key_difference(saved, held)
    assert described == (
        "missing from the checkpoint: 'net.0.weight', 'net.0.bias'; not in this model: "
        "'0.weight', '0.bias'; first differing keys: '0.weight' in the checkpoint, "
        "'net.0.weight' in this model (every differing key has the prefix 'net.' more in this "
        "model: a module of your own wraps the model on one side only; wrap it as it was when "
        "the pause was written)"
    )
    assert "the first differing key has the prefix 'net.' more in the checkpoint" in (
        describe_key_difference(["net.0.weight", "net.2.bias"], ["0.weight", "3.bias"])
    )
    assert describe_key_difference(["0.weight"], ["0.weight_orig"]).endswith(
        "(one is the start of the other)"
    )
    assert describe_key_difference(["a.weight"], ["b.weight"]).endswith(
        "first differing keys: 'a.weight' in the checkpoint, 'b.weight' in this model"
    )
    assert describe_key_difference(["a"] * 5, []) == ("not in this model: 'a', 'a', 'a' and 2 more")


class _Scaled(nn.DataParallel):
    """A wrapper with a parameter of its own, named as one of the model's."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self.scale = nn.Parameter(torch.full((1,), 2.0))


class _WithScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _network()
        self.scale = nn.Parameter(torch.full((1,), 3.0))


def _loaded(saved: dict[str, torch.Tensor], module: nn.Module) -> nn.Module:
    """``saved`` loaded as ``resume()`` loads a module's state (strictly)."""
    target = loading_module(module)
    target.load_state_dict(live_state(saved, target))
    return module


def _assert_same_state(expected: nn.Module, actual: nn.Module) -> None:
    want, have = expected.state_dict(), actual.state_dict()
    assert list(want) == list(have)
    for key, value in want.items():
        assert torch.equal(value, have[key]), key


def test_a_wrapper_with_a_parameter_of_its_own_is_part_of_the_model_and_keeps_every_name():
    # Both are named "scale": made canonical, one would be lost; loaded into the model
    # inside, the wrapper's would be refused part-way.
    saved = _Scaled(_WithScale())
    keys = list(canonical_state(saved))
    assert keys[:2] == ["scale", "module.scale"] and len(keys) == len(saved.state_dict())
    fresh = _Scaled(_WithScale())
    with torch.no_grad():
        for param in fresh.parameters():
            param.add_(1.0)
    _assert_same_state(saved, _loaded(dict(canonical_state(saved)), fresh))
    assert loading_module(torch.compile(fresh)) is fresh


class _Renaming(nn.Module):
    """A state_dict hook names ``head.*`` ``out_head.*`` (a load pre-hook maps them back)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

        def renamed(module: nn.Module, state: dict, prefix: str, local: dict) -> None:
            for key in [k for k in state if k.startswith(f"{prefix}head.")]:
                state[f"{prefix}out_{key[len(prefix) :]}"] = state.pop(key)

        def back(state: dict, prefix: str, *_: object) -> None:
            for key in [k for k in state if k.startswith(f"{prefix}out_head.")]:
                state[f"{prefix}{key[len(prefix) + 4 :]}"] = state.pop(key)

        self._register_state_dict_hook(renamed)
        self._register_load_state_dict_pre_hook(back)


def test_a_key_a_state_dict_hook_renamed_loses_the_wrappers_names_and_loads_into_any_wrapping():
    torch.manual_seed(0)
    saved = _Renaming()
    state = canonical_state(torch.compile(saved))
    assert list(state) == ["body.weight", "body.bias", "out_head.weight", "out_head.bias"]
    torch.manual_seed(1)
    _assert_same_state(saved, _loaded(dict(state), nn.DataParallel(_Renaming())).module)
