"""Fuzzed checkpoint files: every damaged or malformed file is refused with a catalogue
error, damaged bytes before torch.load is even called, and a trainer is never touched.

The file is kept small (a few KiB) so that thousands of variants take seconds. Every
test runs on both load paths: tensor records read ahead into their own storages, and
the whole payload copied (the path taken when the zip directory cannot be planned from).
"""

from __future__ import annotations

import functools
import io
import random
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
from support.payloads import HEADER_SIZE, LAYOUT, MARKER
from support.trainers import TinyTrainer

import trainer_resume.durable as durable
from trainer_resume.durable import (
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    ResumeError,
)
from trainer_resume.testing import first_difference

KEY = b"fuzzing-signing-key-0123456789"


def small_state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(3)
    return {
        "weight": torch.randn(8, 4, generator=generator),
        "ids": torch.arange(6),
        "step": 17,
        "nested": {"lr": 0.5, "names": ["a", "b"]},
    }


@pytest.fixture(autouse=True, params=["read-ahead", "whole-copy"])
def load_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "whole-copy":
        monkeypatch.setattr(durable, "read_ahead_supported", lambda: False)
    return str(request.param)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "good.ckpt"
    save_checkpoint(small_state(), path)
    return path.read_bytes()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts unpickling calls (``torch.load`` and the zip loader under it, which the
    read-ahead load calls directly): damaged bytes must be refused before any."""
    calls: list[str] = []

    def counting(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def count(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, count)

    counting(torch, "load")
    counting(torch.serialization, "_load")
    return calls


def refused(path: Path, data: bytes) -> ResumeError:
    path.write_bytes(data)
    with pytest.raises(ResumeError) as raised:
        load_checkpoint(path)
    return raised.value


def reframed(payload: bytes, *, flags: int = 0, signature: bytes = bytes(32)) -> bytes:
    """A header that is valid for ``payload`` (correct length, BLAKE3 and CRC)."""
    digest = blake3.blake3(payload).digest()
    header = bytearray(LAYOUT.pack(MARKER, 2, flags, 0, len(payload), digest, signature))
    header[12:16] = struct.pack("<I", zlib.crc32(header))
    return bytes(header) + payload


# --- damaged bytes: refused before torch.load ------------------------------------------


def test_1000_random_single_bit_flips_are_all_refused_as_corrupted_before_loading(
    tmp_path: Path, good: bytes, loads: list[str]
) -> None:
    rng = random.Random(20261201)
    bits = rng.sample(range(len(good) * 8), 1000)
    bits[:8] = range(0, 64, 8)  # the marker's bytes, always among them
    path = tmp_path / "flipped.ckpt"
    for bit in bits:
        data = bytearray(good)
        data[bit // 8] ^= 1 << (bit % 8)
        error = refused(path, bytes(data))
        assert type(error) is CheckpointCorruptedError, (bit, error)
    assert loads == []


def test_every_truncation_length_is_refused_as_corrupted_before_loading(
    tmp_path: Path, good: bytes, loads: list[str]
) -> None:
    path = tmp_path / "cut.ckpt"
    for length in range(len(good)):  # every length: the file is small
        error = refused(path, good[:length])
        assert type(error) is CheckpointCorruptedError, (length, error)
    assert loads == []


@pytest.mark.parametrize("change", ["xor-ff", "zero", "plus-one"])
def test_every_header_byte_altered_is_refused_before_loading(
    tmp_path: Path, good: bytes, loads: list[str], change: str
) -> None:
    path = tmp_path / "header.ckpt"
    for offset in range(HEADER_SIZE):
        data = bytearray(good)
        old = data[offset]
        data[offset] = {"xor-ff": old ^ 0xFF, "zero": 0, "plus-one": (old + 1) % 256}[change]
        if data == good:
            continue  # the byte already had that value
        error = refused(path, bytes(data))
        assert isinstance(error, (CheckpointCorruptedError, CheckpointFormatError)), (offset, error)
    assert loads == []


# --- broken zips behind a valid header -------------------------------------------------


def _payload(good: bytes) -> bytes:
    """A torch.save archive of the same state with torch's CRCs (zipfile checks them on read)."""
    buffer = io.BytesIO()
    torch.save(small_state(), buffer)
    return buffer.getvalue()


def _rezip(payload: bytes, keep: Callable[[str], bool], *, compress: bool = False) -> bytes:
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(payload)) as source,
        zipfile.ZipFile(
            out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        ) as target,
    ):
        for info in source.infolist():
            if keep(info.filename):
                target.writestr(info.filename, source.read(info.filename))
    return out.getvalue()


def _replace_record(payload: bytes, suffix: str, content: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(payload)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = content if info.filename.endswith(suffix) else source.read(info.filename)
            target.writestr(info.filename, data)
    return out.getvalue()


def _damage_at(payload: bytes, signature: bytes, offset: int) -> bytes:
    data = bytearray(payload)
    data[payload.rindex(signature) + offset] ^= 0x5A
    return bytes(data)


BEFORE_UNPICKLING: dict[str, Callable[[bytes], bytes]] = {
    "central-directory-signature": lambda p: _damage_at(p, b"PK\x01\x02", 1),
    # torch writes zip64 end records; readers take the directory's place and size from them.
    "central-directory-offset": lambda p: _damage_at(p, b"PK\x06\x06", 48),
    "central-directory-size": lambda p: _damage_at(p, b"PK\x06\x06", 40),
    "zip64-end-record-signature": lambda p: _damage_at(p, b"PK\x06\x06", 1),
    "local-header-of-last-entry": lambda p: _damage_at(p, b"PK\x03\x04", 2),
    # The last entry's local header names another entry, or gives its name another length.
    "local-header-name-of-last-entry": lambda p: _damage_at(p, b"PK\x03\x04", 30),
    "local-header-name-length-of-last-entry": lambda p: _damage_at(p, b"PK\x03\x04", 26),
    "end-record-removed": lambda p: p[: p.rindex(b"PK\x05\x06")],
    "truncated-by-100": lambda p: p[:-100],
    "first-half-only": lambda p: p[: len(p) // 2],
    "no-pickle-record": lambda p: _rezip(p, lambda name: not name.endswith("data.pkl")),
    "compressed-records": lambda p: _rezip(p, lambda name: True, compress=True),
}
WHILE_UNPICKLING: dict[str, Callable[[bytes], bytes]] = {
    "missing-tensor-record": lambda p: _rezip(p, lambda name: not name.endswith("/data/0")),
    "pickle-is-garbage": lambda p: _replace_record(p, "data.pkl", b"\x00garbage" * 8),
    "pickle-truncated": lambda p: _replace_record(p, "data.pkl", b"\x80\x02}q\x00(X"),
    "tensor-record-too-short": lambda p: _replace_record(p, "/data/0", b"\x00" * 4),
}


@pytest.mark.parametrize("damage", sorted(BEFORE_UNPICKLING))
def test_broken_zip_behind_a_valid_header_is_refused_before_loading(
    tmp_path: Path, good: bytes, loads: list[str], damage: str
) -> None:
    data = reframed(BEFORE_UNPICKLING[damage](_payload(good)))
    error = refused(tmp_path / "zip.ckpt", data)
    assert type(error) is CheckpointFormatError, error
    with pytest.raises(CheckpointFormatError):
        read_checkpoint_header(tmp_path / "zip.ckpt")
    assert loads == []


@pytest.mark.parametrize("damage", sorted(WHILE_UNPICKLING))
def test_broken_records_behind_a_valid_header_are_refused_with_format_error(
    tmp_path: Path, good: bytes, damage: str
) -> None:
    # The zip itself is sound; the weights-only unpickler meets the damage and
    # nothing it built reaches the caller.
    data = reframed(WHILE_UNPICKLING[damage](_payload(good)))
    error = refused(tmp_path / "records.ckpt", data)
    assert type(error) is CheckpointFormatError, error


def test_nesting_deeper_than_the_limit_is_refused_with_format_error(tmp_path: Path) -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(400):
        inner.append([])
        inner = inner[0]
    buffer = io.BytesIO()
    torch.save(deep, buffer)  # torch.save itself accepts 400 levels
    error = refused(tmp_path / "deep.ckpt", reframed(buffer.getvalue()))
    assert type(error) is CheckpointFormatError and "deeper" in str(error)
    with pytest.raises(ValueError, match="deeper"):
        save_checkpoint(deep, tmp_path / "deep-saved.ckpt")
    assert not (tmp_path / "deep-saved.ckpt").exists()


def test_resume_from_any_kind_of_bad_file_leaves_the_trainer_untouched(
    tmp_path: Path, good: bytes
) -> None:
    source = TinyTrainer()
    source.train_step()
    pause = tmp_path / "pause.ckpt"
    source.pause(pause)
    data = pause.read_bytes()
    buffer = io.BytesIO()
    torch.save(torch.load(io.BytesIO(data[HEADER_SIZE:]), weights_only=True), buffer)
    payload = buffer.getvalue()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    variants = {
        "bit-flip": bytes(flipped),
        "truncated": data[: len(data) - 7],
        "header-byte": data[:9] + b"\x07" + data[10:],
        **{name: reframed(make(payload)) for name, make in BEFORE_UNPICKLING.items()},
        **{name: reframed(make(payload)) for name, make in WHILE_UNPICKLING.items()},
    }
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.train_step()
    before = trainer.state()
    for name, content in variants.items():
        bad = tmp_path / f"{name}.ckpt"
        bad.write_bytes(content)
        with pytest.raises(ResumeError):
            trainer.resume(bad)
        difference = first_difference(before, trainer.state())
        assert difference is None, f"{name}: {difference.describe()}"
        assert not trainer.locked and not trainer.paused, name


# --- a signed file rewritten while it is loaded ------------------------------------------


def test_signed_file_rewritten_while_loading_is_never_accepted_with_other_bytes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "signed.ckpt"
    original = {"weight": torch.zeros(1 << 16), "step": 1}
    save_checkpoint(original, path, key=KEY)
    signed = path.read_bytes()
    # The attacker's version: same header (it cannot sign), weights changed.
    tampered_state = {"weight": torch.ones(1 << 16), "step": 1}
    buffer = io.BytesIO()
    torch.save(tampered_state, buffer)
    forged = reframed(buffer.getvalue(), flags=1, signature=signed[56:HEADER_SIZE])
    stop = threading.Event()

    def rewrite_in_place() -> None:
        versions = [forged, signed]
        turn = 0
        with open(path, "r+b", buffering=0) as file:
            while not stop.is_set():
                data = versions[turn % 2]
                for start in range(0, len(data), 4096):  # torn, chunk by chunk
                    file.seek(start)
                    file.write(data[start : start + 4096])
                file.truncate(len(data))
                turn += 1

    writer = threading.Thread(target=rewrite_in_place, daemon=True)
    writer.start()
    accepted = refused_count = 0
    try:
        for _ in range(300):
            try:
                loaded = load_checkpoint(path, key=KEY)
            except (CheckpointCorruptedError, CheckpointSignatureError, CheckpointFormatError):
                refused_count += 1
                continue
            accepted += 1
            assert torch.equal(loaded["weight"], original["weight"]), "tampered weights accepted"
    finally:
        stop.set()
        writer.join(30)
    assert accepted + refused_count == 300
    assert refused_count > 0, "no load overlapped a rewrite; the test proved nothing"


# --- the command line -------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated-by-100", "missing-tensor-record"])
def test_inspect_of_a_broken_zip_prints_one_error_line_and_exits_3(
    tmp_path: Path, good: bytes, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    from trainer_resume.cli import main

    make = {**BEFORE_UNPICKLING, **WHILE_UNPICKLING}[damage]
    path = tmp_path / "broken.ckpt"
    path.write_bytes(reframed(make(_payload(good))))
    assert main(["inspect", str(path)]) == 3
    captured = capsys.readouterr()
    assert captured.err.startswith("error [321]: ") and captured.err.count("\n") == 1
    assert captured.out == ""
