"""The fresh storages a checkpoint is read into are mapped ahead of the reads, on a
helper thread that writes nothing and is gone when the read is over.

Residency is read from the kernel (``mincore``); loads are compared with
``torch.load`` of the same payload, tensor by tensor.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.payloads import assert_loaded_as_torch_loads, saved
from support.whole_copies import record_whole_copies

import trainer_resume.durable as durable
from trainer_resume.durable import _prefault, load_checkpoint
from trainer_resume.durable._direct_copy import Record
from trainer_resume.durable._prefault import Prefaulter, prefault_supported

needs_populate = pytest.mark.skipif(
    not prefault_supported(), reason="madvise(MADV_POPULATE_WRITE) needs Linux 5.14 or later"
)


def resident(tensor: torch.Tensor) -> tuple[int, int]:
    """(resident, all) whole pages inside ``tensor``'s memory, as the kernel reports them."""
    page = mmap.PAGESIZE
    address = tensor.data_ptr()
    start = -(-address // page) * page
    end = (address + tensor.nbytes) // page * page
    count = (end - start) // page
    flags = (ctypes.c_ubyte * count)()
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert mincore(start, end - start, flags) == 0, ctypes.get_errno()
    return sum(flag & 1 for flag in flags), count


def prefault_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "checkpoint-prefault"]


def state() -> dict[str, Any]:
    """Large and small tensors (the large one read in pieces)."""
    generator = torch.Generator().manual_seed(5)
    return {
        "big": torch.randn(3 << 20, generator=generator),  # 12 MiB, read in pieces
        "medium": [torch.randn(1 << 16, generator=generator) for _ in range(4)],
        "small": [torch.randn(7, generator=generator) for _ in range(50)],
        "step": 12,
    }


@needs_populate
def test_every_whole_page_of_fresh_storages_is_mapped_and_no_byte_changes() -> None:
    fresh = torch.empty(48 << 20, dtype=torch.uint8)  # above glibc's mmap threshold: unmapped
    written = torch.empty(40 << 20, dtype=torch.uint8)
    written[: 8 << 20] = torch.arange(8 << 20, dtype=torch.int64).remainder(251).to(torch.uint8)
    before = written[: 8 << 20].clone()
    mapped_before, pages = resident(fresh)
    assert mapped_before < pages // 100

    helper = Prefaulter([fresh, written])
    deadline = time.monotonic() + 60
    while prefault_threads() and time.monotonic() < deadline:  # the walk ends by itself
        time.sleep(0.01)
    helper.stop()

    assert resident(fresh) == (pages, pages)
    assert resident(written)[0] == resident(written)[1]
    assert torch.equal(written[: 8 << 20], before)
    assert not torch.any(fresh[:: mmap.PAGESIZE])  # fresh anonymous memory reads as zeros
    assert prefault_threads() == []


@pytest.mark.parametrize("helper", ["mapping ahead", "no helper"])
def test_a_load_equals_torch_load_with_the_pages_mapped_ahead_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helper: str
) -> None:
    path, expected = saved(tmp_path, state())
    calls: list[int] = []
    populate = _prefault._populate()
    if helper == "no helper" or populate is None:
        monkeypatch.setattr(_prefault, "_POPULATE", [None])
    else:

        def counted(address: int, length: int) -> int:
            calls.append(length)
            return populate(address, length)

        monkeypatch.setattr(_prefault, "_POPULATE", [counted])

    assert_loaded_as_torch_loads(load_checkpoint(path), expected)

    assert prefault_threads() == []
    if helper == "mapping ahead" and populate is not None:
        assert sum(calls) >= (12 << 20) - 2 * mmap.PAGESIZE  # the 12 MiB record, at least
    else:
        assert calls == []


def test_a_plan_abandoned_part_way_leaves_no_helper_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the file changed after its directory was read: the first record's local
    # header is not where the plan says, found only after every storage was made.
    path, expected = saved(tmp_path, state())
    real_plan = durable.plan_records

    def shifted(*args: Any) -> list[Record]:
        first, *rest = real_plan(*args)
        return [Record(first.name, first.header_offset + 7, first.length), *rest]

    monkeypatch.setattr(durable, "plan_records", shifted)
    taken = record_whole_copies(monkeypatch)
    assert_loaded_as_torch_loads(load_checkpoint(path), expected)
    assert taken == ["whole-copy"]
    assert prefault_threads() == []
