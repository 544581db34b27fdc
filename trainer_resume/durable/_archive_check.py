"""Structure checks of a verified ``torch.save`` archive, done before anything is unpickled.

The digest proves the bytes are the ones written, not that they form an archive
``torch.load`` reads correctly: a file can be crafted (or written by other code)
with a matching digest around a broken zip. ``torch.load`` reports such damage
with raw errors, some only half-way through unpickling, and when it maps a file
(``mmap=True``) it even trusts the sizes in the pickle and would read a tensor
past the end of a too-short record. So the archive is checked first:

- the zip directory parses, every entry is stored uncompressed, its local header
  is where the directory says and its bytes lie inside the payload;
- the archive holds its pickle (``<name>/data.pkl``) and is no TorchScript archive;
- before a mapped load, the pickle is scanned without being executed
  (``pickletools.genops``): every tensor storage it refers to names a record that
  exists and is large enough. (A load that reads each record itself meets a
  missing or short record as an error of that read, reported as a format error.)
"""

from __future__ import annotations

import functools
import io
import pickletools
import struct
import warnings
import zipfile
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..errors import CheckpointFormatError

__all__ = ["LOCAL_HEADER", "Archive", "Payload", "check_archive", "is_stored", "names_entry"]

LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (fixed fields), name length, extra length
_LOCAL_MAGIC = b"PK\x03\x04"
_DIRECTORY_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError)


class _Global:
    """A ``module.name`` reference met while scanning a pickle."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class Payload(Protocol):
    """The verified payload bytes, however they are held in memory."""

    size: int

    def reader(self) -> io.RawIOBase: ...

    def read(self, start: int, end: int) -> bytes: ...


@dataclass(frozen=True)
class Archive:
    """What the check found: the archive's folder (``prefix``, with its slash) and
    every entry's name -> (start, end) of its bytes in the payload (``records``)."""

    prefix: str
    records: dict[str, tuple[int, int]]


def check_archive(payload: Payload, where: str, *, tensors: bool = True) -> Archive:
    """Refuse a payload whose zip structure or tensor records ``torch.load`` would misread.

    Args:
        payload: The verified bytes.
        where: The file, for messages.
        tensors: Also scan the pickle for the tensor records it needs (each must
            exist and be large enough). Needed before a mapped load, which trusts
            the pickle's sizes; a load that reads each record checks them itself.

    Raises:
        CheckpointFormatError: The archive is malformed (321); the message says how.
    """
    records = _records(payload, where)
    pickles = [name for name in records if name.count("/") == 1 and name.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise CheckpointFormatError(f"{where}: the payload holds no single torch.save pickle")
    prefix = pickles[0][: -len("data.pkl")]
    if f"{prefix}constants.pkl" in records:
        raise CheckpointFormatError(f"{where}: the payload is a TorchScript archive")
    start, end = records[pickles[0]]
    needed = _storages(payload.read(start, end), where) if tensors else []
    for key, nbytes in needed:
        record = records.get(f"{prefix}data/{key}")
        if record is None:
            raise CheckpointFormatError(f"{where}: the tensor record data/{key} is missing")
        if record[1] - record[0] < nbytes:
            raise CheckpointFormatError(
                f"{where}: the tensor record data/{key} holds {record[1] - record[0]} bytes, "
                f"its tensor needs {nbytes}"
            )
    return Archive(prefix, records)


def _records(payload: Payload, where: str) -> dict[str, tuple[int, int]]:
    """Name -> (start, end) of every entry's bytes in the payload."""
    size = payload.size
    try:
        with zipfile.ZipFile(payload.reader()) as archive:
            entries = archive.infolist()
    except _DIRECTORY_ERRORS as exc:
        raise CheckpointFormatError(
            f"{where}: the payload's zip directory is unreadable ({exc})"
        ) from exc
    records: dict[str, tuple[int, int]] = {}
    for entry in entries:
        name, start = entry.filename, entry.header_offset
        # The local header and the name it should hold, in one read.
        expected = len(name.encode("utf-8", "surrogateescape"))
        head = payload.read(start, start + LOCAL_HEADER.size + expected)
        if len(head) < LOCAL_HEADER.size:
            raise CheckpointFormatError(f"{where}: zip entry {name!r} starts outside the payload")
        magic, name_length, extra_length = LOCAL_HEADER.unpack(head[: LOCAL_HEADER.size])
        name_start = start + LOCAL_HEADER.size
        stored_name = head[LOCAL_HEADER.size :]
        if name_length != expected or not names_entry(magic, stored_name, name):
            raise CheckpointFormatError(f"{where}: zip entry {name!r} has no matching local header")
        if not is_stored(entry):
            raise CheckpointFormatError(f"{where}: zip entry {name!r} is compressed")
        data_start = name_start + name_length + extra_length
        if data_start + entry.file_size > size or name in records:
            raise CheckpointFormatError(f"{where}: zip entry {name!r} is out of place or repeated")
        records[name] = (data_start, data_start + entry.file_size)
    return records


def names_entry(magic: bytes, stored_name: bytes, name: str) -> bool:
    """Whether a local header (its signature and stored name) belongs to entry ``name``."""
    return magic == _LOCAL_MAGIC and stored_name == name.encode("utf-8", "surrogateescape")


def is_stored(entry: zipfile.ZipInfo) -> bool:
    """Whether a zip entry's bytes are stored as they are (no compression)."""
    return entry.compress_type == zipfile.ZIP_STORED and entry.file_size == entry.compress_size


def _storages(data: bytes, where: str) -> list[tuple[str, int]]:
    """(record key, bytes needed) of every storage the pickle refers to, without running it.

    A symbolic stack machine over ``pickletools.genops``: opcodes move opaque stack
    slots according to their documented stack effects; only the values that make
    up torch's persistent ids (strings, ints, globals, tuples of them) are kept.
    """
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    found: list[tuple[str, int]] = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
                continue
            if name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
                continue
            if name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
                continue
            if name == "MARK":
                marks.append(len(stack))
                continue
            if name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"):
                count = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "EMPTY_TUPLE": 0}.get(name)
                cut = marks.pop() if count is None else len(stack) - count
                items = tuple(stack[cut:])
                del stack[cut:]
                stack.append(items)
                continue
            if name == "GLOBAL":
                module, _, attribute = arg.partition(" ")
                stack.append(_Global(module, attribute))
                continue
            if name == "STACK_GLOBAL":
                module, attribute = stack[-2], stack[-1]
                del stack[-2:]
                stack.append(_Global(str(module), str(attribute)))
                continue
            if name in ("BINPERSID", "PERSID"):
                saved = stack.pop() if name == "BINPERSID" else arg
                found.append(_storage_of(saved, where))
                stack.append(None)
                continue
            _apply_stack_effect(opcode, arg, stack, marks)
    except CheckpointFormatError:
        raise
    except Exception as exc:  # a malformed pickle: genops or the stack effects fail
        raise CheckpointFormatError(f"{where}: the payload's pickle is malformed ({exc})") from exc
    return found


def _apply_stack_effect(opcode: Any, arg: Any, stack: list[Any], marks: list[int]) -> None:
    before, after = opcode.stack_before, opcode.stack_after
    if pickletools.markobject in before:
        del stack[marks.pop() :]
        count = before.index(pickletools.markobject)
    elif opcode.name == "POP" and marks and marks[-1] == len(stack):
        marks.pop()  # POP of a bare mark
        count = 0
    else:
        count = len(before)
    if count:
        if count > len(stack):
            raise ValueError(f"{opcode.name} needs {count} stack items")
        del stack[-count:]
    if pickletools.markobject in after:
        marks.append(len(stack))
    elif after:
        value = arg if opcode.name in _VALUE_OPCODES else None
        stack.extend([value] * len(after))


_VALUE_OPCODES = frozenset(
    {
        "BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4",
        "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
        "SHORT_BINSTRING", "BINSTRING", "STRING", "SHORT_BINBYTES", "BINBYTES",
    }
)  # fmt: skip


def _storage_of(saved: Any, where: str) -> tuple[str, int]:
    """(key, nbytes) of one persistent id ``("storage", type, key, location, numel)``."""
    if isinstance(saved, tuple) and len(saved) == 5:
        kind, storage_type, key, _, numel = saved
        if isinstance(kind, bytes):
            kind = kind.decode("ascii", "replace")
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if kind == "storage" and isinstance(key, str) and type(numel) is int and numel >= 0:
            return key, numel * _element_size(storage_type, where)
    raise CheckpointFormatError(f"{where}: the pickle refers to a record in an unknown way")


def _element_size(storage_type: Any, where: str) -> int:
    size = _storage_element_size(storage_type.name) if isinstance(storage_type, _Global) else None
    if size is None or storage_type.module != "torch":
        raise CheckpointFormatError(f"{where}: the pickle refers to an unknown storage type")
    return size


@functools.cache
def _storage_element_size(name: str) -> int | None:
    if name == "UntypedStorage":
        return 1
    if not name.endswith("Storage"):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the typed storage classes are deprecated, not gone
        dtype = getattr(getattr(torch, name, None), "dtype", None)
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else None
