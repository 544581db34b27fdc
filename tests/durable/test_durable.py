"""Verified checkpoint files: layout, round trip, integrity, safety and signing.

The headers are built here from the documented layout and algorithms (not from the
library's own helpers), so these tests pin the file formats as well as the behaviour.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
from support.payloads import HEADER_SIZE, LAYOUT, MARKER
from torch.utils.serialization import config as serialization_config

from trainer_resume.durable import (
    CheckpointHeader,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
    validate_key,
)
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    UnsafeCheckpointError,
)

SIGNED = 1
KEY = b"0123456789abcdef-signing-key"
KEY_CONTEXT = "trainer-resume 2026-11 checkpoint signing key for format version 2"


def digest_of(payload: bytes, version: int) -> bytes:
    """The documented payload digest: BLAKE3 in version 2, SHA-256 in version 1."""
    return blake3.blake3(payload).digest() if version == 2 else hashlib.sha256(payload).digest()


def frame(
    payload: bytes,
    *,
    version: int = 2,
    flags: int = 0,
    digest: bytes | None = None,
    signature: bytes = bytes(32),
) -> bytes:
    """Wrap ``payload`` in a header with a correct header CRC."""
    digest = digest_of(payload, min(version, 2)) if digest is None else digest
    header = bytearray(LAYOUT.pack(MARKER, version, flags, 0, len(payload), digest, signature))
    header[12:16] = struct.pack("<I", zlib.crc32(header))
    return bytes(header) + payload


def sign(key: bytes, payload: bytes, version: int = 2) -> bytes:
    """The documented signature over marker, version, flags, length and digest:
    keyed BLAKE3 with a key derived by BLAKE3's derive_key mode (v2), HMAC-SHA256 (v1)."""
    fields = struct.pack("<HHQ", version, SIGNED, len(payload))
    message = MARKER + fields + digest_of(payload, version)
    if version == 1:
        return hmac.new(key, message, hashlib.sha256).digest()
    derived = blake3.blake3(key, derive_key_context=KEY_CONTEXT).digest()
    return blake3.blake3(message, key=derived).digest()


def torch_payload(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def nested_state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    weights = OrderedDict(
        [
            ("linear.weight", torch.randn(4, 3, generator=generator)),
            ("linear.bias", torch.randn(4, generator=generator, dtype=torch.float64)),
        ]
    )
    return {
        "model": weights,
        "step": 12345,
        "huge_int": 2**62 + 3,
        "lr": 0.0125,
        "name": "run-α",
        "flags": [True, False, None],
        "pair": (1, "two", 3.0),
        "buffers": {
            "mask": torch.tensor([True, False, True]),
            "half": torch.arange(6, dtype=torch.float16).reshape(2, 3),
            "bf16": torch.linspace(0, 1, 5, dtype=torch.bfloat16),
            "ids": torch.arange(10, dtype=torch.int64),
            "empty": torch.empty(0, 3),
        },
    }


def assert_same(actual: Any, expected: Any) -> None:
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert torch.equal(actual, expected)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for name in expected:
            assert_same(actual[name], expected[name])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    else:
        assert actual == expected


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(nested_state(), path)
    return path


# --- round trip and layout ---------------------------------------------------


def test_nested_state_round_trips_with_types_order_and_values(saved: Path) -> None:
    assert_same(load_checkpoint(saved), nested_state())


def test_module_state_dict_keeps_version_metadata_and_loads_into_fresh_module(
    tmp_path: Path,
) -> None:
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    source(torch.randn(8, 3))  # moves the BatchNorm running statistics
    save_checkpoint(source.state_dict(), tmp_path / "m.pt")
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert loaded._metadata == source.state_dict()._metadata
    target = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    target.load_state_dict(loaded)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_tensors_sharing_storage_still_share_it_after_load(tmp_path: Path) -> None:
    base = torch.arange(12.0)
    save_checkpoint({"base": base, "view": base[2:8].view(2, 3)}, tmp_path / "s.pt")
    loaded = load_checkpoint(tmp_path / "s.pt")
    loaded["base"][3] = -1.0
    assert loaded["view"][0, 1].item() == -1.0


def test_loaded_entries_keep_identity_parameter_type_and_requires_grad(tmp_path: Path) -> None:
    shared = torch.arange(4.0)
    weight = torch.nn.Parameter(torch.randn(2, 3))
    frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    save_checkpoint({"a": shared, "b": shared, "w": weight, "f": frozen}, tmp_path / "p.pt")
    loaded = load_checkpoint(tmp_path / "p.pt")
    assert loaded["a"] is loaded["b"]
    assert type(loaded["w"]) is torch.nn.Parameter and loaded["w"].requires_grad
    assert type(loaded["f"]) is torch.nn.Parameter and not loaded["f"].requires_grad
    assert torch.equal(loaded["w"], weight) and torch.equal(loaded["f"], frozen)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_loaded_tensors_do_not_keep_the_verified_copy_mapped(tmp_path: Path) -> None:
    # An optimizer keeps its loaded state as is: were the tensors views of the copy, the
    # whole copy would stay in memory for the rest of the run.
    state = {"w": torch.randn(1 << 20), "m": {"exp_avg": torch.randn(1 << 18)}}
    save_checkpoint(state, tmp_path / "big.pt")
    loaded = load_checkpoint(tmp_path / "big.pt")
    maps = Path("/proc/self/maps").read_text()
    assert "trainer-resume-payload" not in maps
    assert torch.equal(loaded["w"], state["w"])
    assert torch.equal(loaded["m"]["exp_avg"], state["m"]["exp_avg"])
    loaded["m"]["exp_avg"].add_(1.0)  # ordinary, writable memory
    assert torch.equal(loaded["m"]["exp_avg"], state["m"]["exp_avg"] + 1.0)


def test_saved_file_is_documented_header_followed_by_plain_torch_payload(saved: Path) -> None:
    data = saved.read_bytes()
    marker, version, flags, crc, length, digest, signature = LAYOUT.unpack(data[:HEADER_SIZE])
    payload = data[HEADER_SIZE:]
    assert (marker, version, flags, length) == (MARKER, 2, 0, len(payload))
    assert crc == zlib.crc32(data[:12] + bytes(4) + data[16:HEADER_SIZE])
    assert digest == blake3.blake3(payload).digest()
    assert signature == bytes(32)
    assert_same(torch.load(io.BytesIO(payload), weights_only=True), nested_state())


def test_signed_file_carries_documented_keyed_blake3_signature(tmp_path: Path) -> None:
    path = tmp_path / "signed.pt"
    save_checkpoint(nested_state(), path, key=KEY)
    data = path.read_bytes()
    _, _, flags, _, _, _, signature = LAYOUT.unpack(data[:HEADER_SIZE])
    assert flags == SIGNED
    assert signature == sign(KEY, data[HEADER_SIZE:])


@pytest.mark.parametrize("signed", [False, True])
def test_version_1_files_stay_readable(tmp_path: Path, signed: bool) -> None:
    payload = torch_payload(nested_state())
    path = tmp_path / "v1.pt"
    signature = sign(KEY, payload, version=1) if signed else bytes(32)
    path.write_bytes(frame(payload, version=1, flags=SIGNED if signed else 0, signature=signature))
    assert_same(load_checkpoint(path, key=KEY if signed else None), nested_state())
    header = read_checkpoint_header(path)
    assert (header.format_version, header.algorithm) == (1, "SHA-256")
    assert header.digest == hashlib.sha256(payload).hexdigest()


def test_version_1_file_with_altered_payload_is_refused(tmp_path: Path) -> None:
    payload = bytearray(torch_payload(nested_state()))
    path = tmp_path / "v1.pt"
    framed = bytearray(frame(bytes(payload), version=1))
    framed[-30] ^= 0x04
    path.write_bytes(bytes(framed))
    with pytest.raises(CheckpointCorruptedError):
        load_checkpoint(path)


def test_torch_crc32_is_skipped_while_writing_and_restored_per_thread(tmp_path: Path) -> None:
    # The zip's per-record CRC fields stay zero: torch computed none (the digest covers the bytes).
    save_checkpoint({"w": torch.arange(1000.0)}, tmp_path / "c.pt")
    payload = (tmp_path / "c.pt").read_bytes()[HEADER_SIZE:]
    records = payload.count(b"PK\x01\x02")
    starts = [i for i in range(len(payload)) if payload.startswith(b"PK\x01\x02", i)]
    crcs = [payload[i + 16 : i + 20] for i in starts]
    assert records >= 2 and all(crc == bytes(4) for crc in crcs)
    # This thread's setting is back, and a writer thread never changes another thread's.
    assert serialization_config.save.compute_crc32 is True
    seen: list[bool] = []
    inside = threading.Event()
    release = threading.Event()

    class Slow:
        def __reduce__(self) -> Any:
            inside.set()
            release.wait(30)
            return (int, (1,))

    writer = threading.Thread(target=save_checkpoint, args=({"x": Slow()}, tmp_path / "t.pt"))
    writer.start()
    assert inside.wait(30)
    seen.append(serialization_config.save.compute_crc32)  # while the writer is in torch.save
    release.set()
    writer.join(30)
    assert seen == [True]
    plain = torch.load(io.BytesIO(torch_payload({"w": torch.ones(2)})), weights_only=True)
    assert plain["w"].sum() == 2


def test_large_tensors_round_trip_and_match_their_digest(tmp_path: Path) -> None:
    # Records of several MiB take the path that hashes while writing.
    state = {
        "big": torch.arange(3 << 20, dtype=torch.float32),
        "small": torch.ones(3),
        "bigger": torch.arange(5 << 20),
    }
    path = tmp_path / "big.pt"
    save_checkpoint(state, path)
    payload = path.read_bytes()[HEADER_SIZE:]
    assert read_checkpoint_header(path).digest == blake3.blake3(payload).hexdigest()
    assert_same(load_checkpoint(path), state)


def test_read_checkpoint_header_reports_fields_checked_against_bytes(tmp_path: Path) -> None:
    save_checkpoint(nested_state(), tmp_path / "plain.pt")
    save_checkpoint(nested_state(), tmp_path / "signed.pt", key=KEY)
    for name, signed in (("plain.pt", False), ("signed.pt", True)):
        payload = (tmp_path / name).read_bytes()[HEADER_SIZE:]
        digest = blake3.blake3(payload).hexdigest()
        expected = CheckpointHeader(2, len(payload), digest, signed, "BLAKE3")
        assert read_checkpoint_header(tmp_path / name) == expected
    assert read_checkpoint_header(tmp_path / "signed.pt", key=KEY).signed


def test_map_location_is_applied_to_loaded_tensors(saved: Path) -> None:
    loaded = load_checkpoint(saved, map_location="meta")
    assert loaded["model"]["linear.weight"].device.type == "meta"


# --- format and integrity errors ----------------------------------------------


@pytest.mark.parametrize("reader", [load_checkpoint, read_checkpoint_header])
def test_missing_file_raises_file_not_found(tmp_path: Path, reader: Any) -> None:
    with pytest.raises(FileNotFoundError):
        reader(tmp_path / "absent.pt")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(torch_payload({"w": torch.ones(2)}), id="plain-torch-save"),
        pytest.param(b"step: 10\nlr: 0.1\n", id="text"),
        pytest.param(b"\x00" * 200, id="zeros"),
        pytest.param(frame(torch_payload({"w": 1}), version=3), id="unknown-version"),
        pytest.param(
            frame(torch_payload({"w": 1}), signature=b"\x01" * 32), id="unsigned-with-signature"
        ),
        pytest.param(frame(torch_payload({"w": 1}), flags=0x8000), id="unknown-flag"),
        pytest.param(frame(pickle.dumps({"w": 1})), id="payload-not-a-torch-archive"),
    ],
)
@pytest.mark.parametrize("reader", [load_checkpoint, read_checkpoint_header])
def test_file_of_another_format_raises_format_error(
    tmp_path: Path, content: bytes, reader: Any
) -> None:
    path = tmp_path / "other.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointFormatError):
        reader(path)


def _cut_points(size: int) -> list[int]:
    return [0, 1, 7, 8, 12, 40, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, size // 2, size - 1]


@pytest.mark.parametrize("reader", [load_checkpoint, read_checkpoint_header])
def test_truncated_file_raises_corrupted_at_every_cut_point(saved: Path, reader: Any) -> None:
    data = saved.read_bytes()
    for cut in _cut_points(len(data)):
        saved.write_bytes(data[:cut])
        with pytest.raises(CheckpointCorruptedError):
            reader(saved)


def test_trailing_bytes_raise_corrupted(saved: Path) -> None:
    with saved.open("ab") as file:
        file.write(b"\x00")
    with pytest.raises(CheckpointCorruptedError):
        load_checkpoint(saved)


# Every header field (marker, version, flags, CRC, length, digest, HMAC slot) and
# every part of the payload (zip headers, pickle, tensor bytes, central directory).
HEADER_OFFSETS = [0, 5, 8, 9, 10, 13, 16, 23, 24, 55, 56, 87]
PAYLOAD_PLACES = ["zip-local-header", "pickle", "tensor-bytes", "central-directory", "last-byte"]


def _payload_offset(data: bytes, place: str) -> int:
    weight = nested_state()["model"]["linear.weight"].numpy().tobytes()
    offsets = {
        "zip-local-header": HEADER_SIZE + 3,
        "pickle": data.index(b"linear.weight"),
        "tensor-bytes": data.index(weight) + 5,
        "central-directory": data.rindex(b"PK\x01\x02") + 2,
        "last-byte": len(data) - 1,
    }
    return offsets[place]


@pytest.mark.parametrize("where", HEADER_OFFSETS + PAYLOAD_PLACES)
@pytest.mark.parametrize("mask", [0x01, 0xFF])
def test_flipped_byte_raises_corrupted(saved: Path, where: int | str, mask: int) -> None:
    data = bytearray(saved.read_bytes())
    offset = where if isinstance(where, int) else _payload_offset(bytes(data), where)
    data[offset] ^= mask
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptedError):
        load_checkpoint(saved)
    with pytest.raises(CheckpointCorruptedError):
        read_checkpoint_header(saved)


# --- unsafe payloads ------------------------------------------------------------


class _CreatesFile:
    """Pickles as a call to ``open(path, "w")``: unpickling it creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_payload_that_would_run_code_is_live_when_loaded_unsafely(tmp_path: Path) -> None:
    # Control for the next tests: the same kind of payload does run code without weights_only.
    marker = tmp_path / "control-ran"
    torch.load(io.BytesIO(torch_payload({"x": _CreatesFile(marker)})), weights_only=False)
    assert marker.exists()


def test_unsafe_payload_in_valid_file_raises_unsafe_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    path.write_bytes(frame(torch_payload({"x": _CreatesFile(marker)})))
    assert read_checkpoint_header(path).payload_length > 0  # the file itself is intact
    with pytest.raises(UnsafeCheckpointError) as raised:
        load_checkpoint(path)
    assert isinstance(raised.value.__cause__, pickle.UnpicklingError)
    assert "open" in str(raised.value)
    assert not marker.exists()


def test_unsafe_object_saved_by_save_checkpoint_is_refused_on_load(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    save_checkpoint({"x": _CreatesFile(marker)}, tmp_path / "evil.pt")
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


def test_altered_unsafe_payload_is_rejected_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    payload = torch_payload({"x": _CreatesFile(marker)})
    path = tmp_path / "evil.pt"
    path.write_bytes(frame(payload, digest=blake3.blake3(b"something else").digest()))
    with pytest.raises(CheckpointCorruptedError):
        load_checkpoint(path)
    assert not marker.exists()


# --- signing ----------------------------------------------------------------------


def test_signed_file_loads_with_its_key(tmp_path: Path) -> None:
    save_checkpoint(nested_state(), tmp_path / "s.pt", key=KEY)
    assert_same(load_checkpoint(tmp_path / "s.pt", key=KEY), nested_state())


def test_signed_file_loads_without_key_after_digest_check(tmp_path: Path) -> None:
    save_checkpoint(nested_state(), tmp_path / "s.pt", key=KEY)
    assert_same(load_checkpoint(tmp_path / "s.pt"), nested_state())


def test_wrong_key_raises_signature_error(tmp_path: Path) -> None:
    save_checkpoint(nested_state(), tmp_path / "s.pt", key=KEY)
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(tmp_path / "s.pt", key=KEY[:-1] + b"!")
    with pytest.raises(CheckpointSignatureError):
        read_checkpoint_header(tmp_path / "s.pt", key=KEY[:-1] + b"!")


def test_unsigned_file_raises_signature_error_when_key_given(saved: Path) -> None:
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(saved, key=KEY)


def test_payload_swapped_with_recomputed_digest_is_caught_only_by_key(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    save_checkpoint({"lr": 0.1}, path, key=KEY)
    original_signature = LAYOUT.unpack(path.read_bytes()[:HEADER_SIZE])[6]
    forged = torch_payload({"lr": 100.0})
    path.write_bytes(frame(forged, flags=SIGNED, signature=original_signature))
    assert load_checkpoint(path) == {"lr": 100.0}  # the digest alone cannot tell
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(path, key=KEY)


def test_forged_signature_is_rejected_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    path.write_bytes(
        frame(torch_payload({"x": _CreatesFile(marker)}), flags=SIGNED, signature=b"\x01" * 32)
    )
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(path, key=KEY)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("key", "error"),
    [("0123456789abcdef-str", TypeError), (b"", ValueError), (b"15-bytes-short!", ValueError)],
)
def test_key_that_is_not_bytes_of_at_least_16_is_an_argument_error(
    tmp_path: Path, key: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        save_checkpoint({"a": 1}, tmp_path / "x.pt", key=key)
    assert not (tmp_path / "x.pt").exists()
    with pytest.raises(error):
        load_checkpoint(tmp_path / "x.pt", key=key)
    with pytest.raises(error):
        validate_key(key)


def test_key_of_16_bytes_or_more_signs_and_any_other_key_is_refused(tmp_path: Path) -> None:
    assert validate_key(bytearray(16)) == bytes(16)
    save_checkpoint({"a": 1}, tmp_path / "x.pt", key=bytes(16))
    assert load_checkpoint(tmp_path / "x.pt", key=bytes(16)) == {"a": 1}
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(tmp_path / "x.pt", key=bytes(15) + b"\x01")
