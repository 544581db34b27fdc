"""cpu_state: independent CPU snapshots of nested tensor state."""

from __future__ import annotations

import io
from collections import OrderedDict, namedtuple

import torch
from torch import nn

from trainer_resume.state import cpu_state


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def test_copy_is_independent_of_later_in_place_model_changes():
    model = _model()
    snapshot = cpu_state(model.state_dict())
    expected = {key: value.clone() for key, value in model.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    model.train()
    model(torch.randn(5, 4))  # updates BatchNorm running stats and num_batches_tracked in place
    for key, value in expected.items():
        assert torch.equal(snapshot[key], value), key
    assert not torch.equal(snapshot["0.weight"], model.state_dict()["0.weight"])
    assert int(snapshot["1.num_batches_tracked"]) == 0


def test_copy_shares_no_storage_with_cpu_source():
    state = {"w": torch.arange(6.0)}
    snapshot = cpu_state(state)
    assert snapshot["w"].untyped_storage().data_ptr() != state["w"].untyped_storage().data_ptr()
    state["w"].zero_()
    assert torch.equal(snapshot["w"], torch.arange(6.0))


def test_copy_detaches_from_autograd():
    parameter = nn.Parameter(torch.ones(3))
    snapshot = cpu_state({"p": parameter})
    assert type(snapshot["p"]) is torch.Tensor
    assert not snapshot["p"].requires_grad


def test_ordered_dict_and_metadata_are_kept():
    state = _model().state_dict()
    snapshot = cpu_state(state)
    assert type(snapshot) is OrderedDict
    assert list(snapshot) == list(state)
    assert snapshot._metadata == state._metadata
    assert snapshot._metadata is not state._metadata
    assert snapshot._metadata["1"] == {"version": 2}


def test_batchnorm_loads_the_copy_with_version_handling():
    source = _model()
    source.train()
    source(torch.randn(8, 4))
    snapshot = cpu_state(source.state_dict())
    target = _model()
    target.load_state_dict(snapshot, strict=True)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_old_batchnorm_metadata_survives_and_lets_a_state_without_num_batches_tracked_load():
    # A version-1 BatchNorm state has no num_batches_tracked; load_state_dict adds it only
    # when the metadata says version 1, so the metadata must survive the copy.
    state = nn.BatchNorm1d(3).state_dict()
    del state["num_batches_tracked"]
    state._metadata[""]["version"] = 1
    snapshot = cpu_state(state)
    assert snapshot._metadata[""] == {"version": 1}
    target = nn.BatchNorm1d(3)
    target.load_state_dict(snapshot, strict=True)
    assert int(target.num_batches_tracked) == 0


def test_tied_weights_stay_shared_in_the_copy():
    model = nn.Module()
    model.encoder = nn.Linear(3, 3, bias=False)
    model.decoder = nn.Linear(3, 3, bias=False)
    model.decoder.weight = model.encoder.weight
    state = model.state_dict()
    assert (
        state["encoder.weight"] is not state["decoder.weight"]
    )  # state_dict detaches each name separately
    snapshot = cpu_state(state)
    assert snapshot["encoder.weight"] is snapshot["decoder.weight"]
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    pointers = {
        loaded[key].untyped_storage().data_ptr() for key in ("encoder.weight", "decoder.weight")
    }
    assert len(pointers) == 1


def test_different_views_of_one_storage_are_copied_separately():
    base = torch.arange(10.0)
    snapshot = cpu_state([base[:5], base[5:], base[:5]])
    assert torch.equal(snapshot[0], torch.arange(5.0))
    assert torch.equal(snapshot[1], torch.arange(5.0, 10.0))
    assert snapshot[0] is snapshot[2]
    assert snapshot[0] is not snapshot[1]


def test_lists_tuples_and_named_tuples_are_rebuilt_with_copies():
    Pair = namedtuple("Pair", "first second")
    tensor = torch.ones(2)
    state = {
        "list": [tensor, 1],
        "tuple": (tensor * 2, "x"),
        "pair": Pair(tensor * 3, None),
        "empty": torch.empty(0),
    }
    snapshot = cpu_state(state)
    assert type(snapshot) is dict
    assert (
        type(snapshot["list"]) is list
        and type(snapshot["tuple"]) is tuple
        and type(snapshot["pair"]) is Pair
    )
    tensor.fill_(9.0)
    assert torch.equal(snapshot["list"][0], torch.ones(2))
    assert (
        snapshot["list"][1] == 1 and snapshot["tuple"][1] == "x" and snapshot["pair"].second is None
    )
    assert torch.equal(snapshot["tuple"][0], torch.full((2,), 2.0))
    assert torch.equal(snapshot["pair"].first, torch.full((2,), 3.0))
    assert snapshot["empty"].shape == (0,)


def test_optimizer_state_copy_loads_and_is_independent():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    snapshot = cpu_state(optimizer.state_dict())
    expected = snapshot["state"][0]["exp_avg"].clone()
    optimizer.step()
    assert torch.equal(snapshot["state"][0]["exp_avg"], expected)
    assert not torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], expected)
    fresh = torch.optim.AdamW(model.parameters(), lr=0.01)
    fresh.load_state_dict(snapshot)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], expected)
