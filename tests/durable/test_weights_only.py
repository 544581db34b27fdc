"""One rule for what a weights-only load reads back, checked before pause files and reuse samples are written."""

from __future__ import annotations

import io
from collections import OrderedDict

import numpy as np
import pytest
import torch

from trainer_resume.checks.pause_state import check_saveable
from trainer_resume.checks.weights_only import refused_entry
from trainer_resume.loaders.reuse.store import check_storable


class _Sub(torch.Tensor):
    pass


ACCEPTED_EVERYWHERE = {
    "tensors": [torch.zeros(2), torch.nn.Parameter(torch.ones(1))],
    "scalars": [True, 1, 2.5, 1j, "s", None, torch.float16, torch.device("cpu")],
    "containers": (OrderedDict(a=1), torch.Size([2, 3]), {(1, 2): [3]}),
}
REFUSED = [
    np.zeros(2),
    np.float64(1.0),
    torch.zeros(2).as_subclass(_Sub),
    object(),
    range(3),
    frozenset({1}),
]


def _loads_weights_only(value) -> bool:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:
        return False
    return True


@pytest.mark.parametrize(
    "value",
    [ACCEPTED_EVERYWHERE, b"x", b"", bytearray(b"x"), {1, 2}, *REFUSED],
    # type names, not reprs: an object's repr holds its address, which differs per process
    ids=lambda value: type(value).__name__,
)
def test_the_check_agrees_with_the_installed_torchs_weights_only_load(value):
    assert (refused_entry({"v": value}, "state") is None) == _loads_weights_only({"v": value})


def test_pause_and_reuse_checks_name_the_same_refused_entry():
    state = {"pool": [torch.zeros(1), np.zeros(2)]}
    with pytest.raises(
        TypeError,
        match=r"^checkpoint\['pool'\]\[1\] is a numpy.ndarray \(convert with torch",
    ):
        check_saveable(state)
    with pytest.raises(
        TypeError,
        match=r"index 3 .*: sample\['pool'\]\[1\] is a numpy.ndarray \(convert with torch",
    ):
        check_storable(state, index=3)


def test_a_refused_dict_key_is_named_as_a_key():
    assert (
        refused_entry({np.int64(1): 0}, "state")
        == "a key of state is a numpy.int64 (convert with torch.from_numpy)"
    )


def test_a_self_referencing_list_is_checked_once():
    looped: list = [1]
    looped.append(looped)
    assert refused_entry(looped, "state") is None


class _Allowed:
    pass


def test_a_class_allowed_with_add_safe_globals_is_accepted_like_the_loader_does():
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([_Allowed])
    try:
        assert refused_entry({"v": _Allowed()}, "state") is None
        assert _loads_weights_only({"v": _Allowed()})
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)
    assert refused_entry({"v": _Allowed()}, "state") == f"state['v'] is a {__name__}._Allowed"
