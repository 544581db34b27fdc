"""Loading reads each tensor record once, straight into a storage of its own, and
falls back to a whole verified copy when the zip directory cannot be trusted.

Every load is compared with ``torch.load`` of the same payload, tensor by tensor.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from support.payloads import assert_loaded_as_torch_loads, saved
from support.whole_copies import record_whole_copies

import trainer_resume.durable as durable
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.durable._direct_copy import Record
from trainer_resume.errors import UnsafeCheckpointError

PATHS = ("read-ahead", "whole-copy")


@pytest.fixture(params=PATHS)
def load_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Runs the test on each load path; records which one each load took."""
    taken: list[str] = []
    if request.param == "whole-copy":
        monkeypatch.setattr(durable, "read_ahead_supported", lambda: False)
    real_direct, real_sealed = durable.load_read_ahead, durable.load_payload

    def direct(*args: Any) -> Any:
        taken.append("read-ahead")
        return real_direct(*args)

    def sealed(*args: Any) -> Any:
        taken.append("whole-copy")
        return real_sealed(*args)

    monkeypatch.setattr(durable, "load_read_ahead", direct)
    monkeypatch.setattr(durable, "load_payload", sealed)
    taken.append(request.param)  # first entry: the path this run asked for
    return taken


def varied_state() -> dict[str, Any]:
    """Every kind of tensor layout a training state holds, large and small."""
    torch.manual_seed(3)
    base = torch.randn(6, 5)
    shared = torch.arange(10, dtype=torch.int64)
    return {
        "big": torch.randn(3 << 20),  # 12 MiB: read in several pieces
        "many": [torch.randn(7) for _ in range(300)],  # served from read blocks
        "dtypes": {
            str(dtype): torch.arange(12).to(dtype)
            for dtype in (
                torch.float16,
                torch.bfloat16,
                torch.float64,
                torch.int8,
                torch.uint8,
                torch.bool,
                torch.complex64,
            )
        },
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "view": base[1:4, 2:],
        "transposed": base.t(),
        "base": base,
        "alias": [shared, shared[3:7]],
        "parameter": torch.nn.Parameter(torch.randn(4, 2)),
        "frozen": torch.nn.Parameter(torch.randn(3), requires_grad=False),
        "ordered": OrderedDict(b=torch.ones(2), a=1, c="text", d=None, e=(1.5, [2])),
    }


def test_every_layout_loads_as_torch_load_loads_it_on_either_path(
    tmp_path: Path, load_path: list[str]
) -> None:
    path, expected = saved(tmp_path, varied_state())
    loaded = load_checkpoint(path)
    assert_loaded_as_torch_loads(loaded, expected)
    assert load_path[1:] == [load_path[0]]
    assert loaded["alias"][1].untyped_storage().data_ptr() == (
        loaded["alias"][0].untyped_storage().data_ptr()
    )
    loaded["alias"][0][4] = -1  # still one storage: the view sees the write
    assert loaded["alias"][1][1].item() == -1


def test_each_loaded_storage_is_its_own_allocation_of_its_record_size(tmp_path: Path) -> None:
    # Were the tensors views of one buffer, an optimizer adopting its loaded state
    # would keep the whole payload (model weights included) alive for the run.
    state = {"w": torch.randn(1 << 18), "m": {"exp_avg": torch.randn(1 << 16)}, "s": torch.ones(3)}
    path, _ = saved(tmp_path, state)
    loaded = load_checkpoint(path)
    storages = [loaded["w"], loaded["m"]["exp_avg"], loaded["s"]]
    for tensor in storages:
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    starts = sorted(tensor.untyped_storage().data_ptr() for tensor in storages)
    assert len(set(starts)) == 3
    loaded["m"]["exp_avg"].add_(1.0)  # ordinary, writable memory
    assert torch.equal(loaded["m"]["exp_avg"], state["m"]["exp_avg"] + 1.0)
    assert torch.equal(loaded["w"], state["w"])


def _shifted(records: list[Record], change: str) -> list[Record]:
    first, *rest = records
    if change == "offset":  # the first record's header elsewhere: no local header there
        return [Record(first.name, first.header_offset + 7, first.length), *rest]
    # the last record shorter than in the verified directory
    *head, last = records
    return [*head, Record(last.name, last.header_offset, last.length - 4)]


@pytest.mark.parametrize("change", ["offset", "length"])
def test_a_directory_that_disagrees_with_the_verified_bytes_falls_back_to_a_whole_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    # As if the file changed between reading its directory and reading its bytes:
    # the plan is not trusted; the whole payload is copied, verified and loaded.
    path, expected = saved(tmp_path, varied_state())
    real_plan = durable.plan_records
    monkeypatch.setattr(durable, "plan_records", lambda *args: _shifted(real_plan(*args), change))
    taken = record_whole_copies(monkeypatch)
    assert_loaded_as_torch_loads(load_checkpoint(path), expected)
    assert taken == ["whole-copy"]


def test_loading_on_a_map_location_moves_every_tensor_there(tmp_path: Path) -> None:
    path, expected = saved(tmp_path, {"w": torch.randn(5), "n": [torch.arange(3)]})
    loaded = load_checkpoint(path, map_location="meta")
    assert loaded["w"].device.type == "meta" and loaded["w"].shape == (5,)
    assert loaded["n"][0].device.type == "meta" and loaded["n"][0].dtype == torch.int64
    on_cpu = load_checkpoint(path, map_location=lambda storage, location: storage)
    assert_loaded_as_torch_loads(on_cpu, expected)


class Allowed:
    """A user class, loadable only once it is allowed with ``safe_globals``."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def test_a_user_class_is_refused_unless_allowed_exactly_as_torch_load_does(
    tmp_path: Path, load_path: list[str]
) -> None:
    path = tmp_path / "user.ckpt"
    save_checkpoint({"user": Allowed(torch.arange(3))}, path)
    with pytest.raises(UnsafeCheckpointError, match="Allowed"):
        load_checkpoint(path)
    with torch.serialization.safe_globals([Allowed]):
        loaded = load_checkpoint(path)
    assert type(loaded["user"]) is Allowed
    assert torch.equal(loaded["user"].value, torch.arange(3))
    assert load_path[1:] == [load_path[0]] * 2
