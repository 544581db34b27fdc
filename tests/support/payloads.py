"""A checkpoint saved, the payload inside it as ``torch.load`` reads it, and the
comparison of a load with that, tensor by tensor."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import torch

from trainer_resume.durable import save_checkpoint

# The documented header, before the torch.save payload: marker, version, flags, header
# CRC-32, payload length, payload digest, signature slot; 88 bytes, little-endian.
MARKER = b"\x89TRCKPT\n"
LAYOUT = struct.Struct("<8sHHIQ32s32s")
HEADER_SIZE = 88
assert LAYOUT.size == HEADER_SIZE


def saved(tmp_path: Path, state: Any) -> tuple[Path, Any]:
    """``state`` saved as a checkpoint, and ``torch.load`` of the same payload."""
    path = tmp_path / "state.ckpt"
    save_checkpoint(state, path)
    payload = path.read_bytes()[HEADER_SIZE:]
    return path, torch.load(io.BytesIO(payload), weights_only=True)


def assert_loaded_as_torch_loads(loaded: Any, expected: Any, where: str = "") -> None:
    assert type(loaded) is type(expected), where
    if isinstance(expected, torch.Tensor):
        assert loaded.dtype == expected.dtype, where
        assert loaded.shape == expected.shape and loaded.stride() == expected.stride(), where
        assert loaded.storage_offset() == expected.storage_offset(), where
        assert loaded.requires_grad == expected.requires_grad, where
        assert loaded.untyped_storage().nbytes() == expected.untyped_storage().nbytes(), where
        assert torch.equal(loaded, expected), where
    elif isinstance(expected, dict):
        assert list(loaded) == list(expected), where
        for name in expected:
            assert_loaded_as_torch_loads(loaded[name], expected[name], f"{where}.{name}")
    elif isinstance(expected, (list, tuple)):
        assert len(loaded) == len(expected), where
        for index, (left, right) in enumerate(zip(loaded, expected)):
            assert_loaded_as_torch_loads(left, right, f"{where}[{index}]")
    else:
        assert loaded == expected, where
