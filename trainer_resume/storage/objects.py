"""Objects at URLs: written whole or not at all, read by range, listed, removed.

An object store has no rename, so the local recipe (temp file, fsync, rename) has an
object-store twin: the bytes go up as one upload to the target's own key (S3: a
multipart upload of a few parts at a time; an object under two parts: one PUT; other
stores: their file object, streamed), and the store makes the object visible only when
the upload is completed, after the last byte. A write that fails is abandoned (the
multipart upload aborted), so the previous object at the URL stays, intact. A writer
killed mid-upload cannot abort its upload: the next write to that key, and the cleanup
of a resume-point directory, abort the incomplete uploads they find there that no write
of this process is still sending (another process writing the same key at the same time
is a second writer, which the resume points' lock refuses). Stores not known to show an
upload only once it is complete (fsspec's ``memory://``, for one, shows a file as soon
as it is opened) are written beside the target under a hidden temp name and moved into
place.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import StorageUnavailableError
from .urls import filesystem

__all__ = [
    "BLOCK_SIZE",
    "READ_BLOCK_SIZE",
    "ObjectReader",
    "abort_stale_uploads",
    "create_exclusive",
    "exists",
    "is_dir",
    "list_names",
    "open_for_read",
    "read_object",
    "remove",
    "size_of",
    "upload",
]

# Part size of a multipart upload: the memory a write holds beside the payload, and few
# enough requests for a multi-gigabyte object (s3fs's own default).
BLOCK_SIZE = 50 << 20
# A front-to-back read fetches this much ahead of what it was asked for (s3fs's own
# default, what ``fs.open(url, "rb")`` reads with): the memory a read holds beside the
# loaded tensors.
READ_BLOCK_SIZE = 50 << 20

# Keys (as filesystem paths) this process is uploading now: never aborted as stale.
_sending: dict[str, int] = {}
_sending_lock = threading.Lock()


@contextlib.contextmanager
def _in_flight(path: str) -> Iterator[None]:
    with _sending_lock:
        _sending[path] = _sending.get(path, 0) + 1
    try:
        yield
    finally:
        with _sending_lock:
            _sending[path] -= 1
            if not _sending[path]:
                del _sending[path]


def upload(url: str, pieces: Iterable[bytes | memoryview], *, size: int | None = None) -> None:
    """Write ``pieces``, in order, as the object at ``url``: visible whole or not at all.

    ``size``, when known, lets an object smaller than two parts go up as one request (one
    PUT, as ``fs.pipe`` sends it) instead of a multipart upload of four.

    Raises:
        OSError and whatever the filesystem raises: the upload was abandoned; the
            previous object at ``url`` is intact.
    """
    fs, path = filesystem(url)
    abort_stale_uploads(url, exact=True)
    if _protocols(fs) & _VISIBLE_ON_COMPLETION:
        with _in_flight(path):
            if size is not None and size < 2 * BLOCK_SIZE:
                fs.pipe_file(path, b"".join(pieces))
                fs.invalidate_cache(path)
            elif hasattr(fs, "split_path") and hasattr(fs, "_call_s3"):
                _multipart(fs, path, pieces)
            else:
                _stream(fs, path, pieces)
        return
    # A store whose file objects may show an object before it is closed (fsspec's
    # memory://, others unknown here): written beside the target, then moved there.
    temp = f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[-1]}.{secrets.token_hex(8)}.tmp"
    try:
        _stream(fs, temp, pieces)
        fs.mv(temp, path)
    except BaseException:
        try:
            fs.rm_file(temp)
        except Exception:  # noqa: BLE001 - never written, or already moved
            pass
        raise


# Stores whose uploads become visible only once complete (S3 CompleteMultipartUpload or
# one PUT, GCS's finalized upload, Azure's block list commit).
_VISIBLE_ON_COMPLETION = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def _protocols(fs: Any) -> set[str]:
    protocol = fs.protocol
    return {protocol} if isinstance(protocol, str) else set(protocol)


def _stream(fs: Any, path: str, pieces: Iterable[bytes | memoryview]) -> None:
    handle = fs.open(path, "wb", block_size=BLOCK_SIZE)
    try:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            # A part at a time: a file object uploads all it holds at once, so a large
            # piece handed over whole would become one part of its size (and one copy).
            for start in range(0, view.nbytes, BLOCK_SIZE):
                handle.write(view[start : start + BLOCK_SIZE])
        # close() completes the upload: only then does the object appear.
        handle.close()
    except BaseException:
        _discard(handle)
        raise


# Parts of a multipart upload sent at once (S3): the memory a large write holds beside
# the payload is this many parts. One kept pace with fs.pipe's ten on a local server
# (benchmarks/cloud_storage.py); a distant bucket may gain from more.
PARTS_IN_FLIGHT = 1


def _parts(pieces: Iterable[bytes | memoryview]) -> Iterator[bytes]:
    """``pieces`` cut and joined into parts of :data:`BLOCK_SIZE` bytes (the last shorter)."""
    part = bytearray()
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while view.nbytes:
            take = min(view.nbytes, BLOCK_SIZE - len(part))
            part += view[:take]
            view = view[take:]
            if len(part) == BLOCK_SIZE:
                yield bytes(part)
                part = bytearray()
    if part:
        yield bytes(part)


def _multipart(fs: Any, path: str, pieces: Iterable[bytes | memoryview]) -> None:
    """One S3 multipart upload of ``pieces``, :data:`PARTS_IN_FLIGHT` parts at a time;
    aborted on any failure, so nothing becomes visible."""
    import asyncio

    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)
    upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]

    async def send(batch: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
        async def one(number: int, body: bytes) -> dict[str, Any]:
            sent = await fs._call_s3(
                "upload_part",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
            )
            return {"PartNumber": number, "ETag": sent["ETag"]}

        return list(await asyncio.gather(*(one(number, body) for number, body in batch)))

    try:
        done: list[dict[str, Any]] = []
        batch: list[tuple[int, bytes]] = []
        for number, body in enumerate(_parts(pieces), start=1):
            batch.append((number, body))
            if len(batch) == PARTS_IN_FLIGHT:
                done += sync(fs.loop, send, batch)
                batch = []
        if batch:
            done += sync(fs.loop, send, batch)
        fs.call_s3(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": done},
        )
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the write's own error is the one to report
            pass
        raise
    finally:
        fs.invalidate_cache(path)


def _discard(handle: Any) -> None:
    try:
        handle.discard()  # aborts a multipart upload; nothing becomes visible
    except Exception:  # noqa: BLE001 - the write's own error is the one to report
        pass


def create_exclusive(url: str, data: bytes) -> bool:
    """Create the object at ``url`` holding ``data`` unless one exists (S3 ``If-None-Match``).

    Returns:
        Whether this call created it. Stores without conditional writes create it
        whether or not it exists (see docs/cloud-storage.md).
    """
    fs, path = filesystem(url)
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    except Exception as exc:  # botocore names a failed precondition, fsspec may not map it
        if "PreconditionFailed" in repr(exc) or "412" in str(exc):
            return False
        raise
    return True


def read_object(url: str) -> bytes:
    """The whole object (small objects only: lock records)."""
    fs, path = filesystem(url)
    return fs.cat_file(path)


def _info(url: str) -> dict[str, Any] | None:
    """What the store says of ``url`` (``None``: nothing there).

    fsspec's ``isfile`` / ``isdir`` answer ``False`` for any failure; an endpoint that
    cannot be reached or a request refused is not "nothing there" (a resume would then
    start over), so only ``FileNotFoundError`` means that here.

    Raises:
        StorageUnavailableError: the store did not answer (355).
    """
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    with _answered(url):
        try:
            return dict(fs.info(path))
        except FileNotFoundError:
            pass
    _check_bucket(fs, path, url)
    return None


# Stores whose paths begin with a bucket (a container) that must exist before any object.
_BUCKETED = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def _check_bucket(fs: Any, path: str, url: str) -> None:
    """After "nothing at ``path``": refuse a bucket that does not exist (355).

    A mistyped or deleted bucket answers "not found" for every key in it; taken for an
    empty run, a requeued job would start over (or find no resume point) instead of
    being told. Asked at every "not found" (one more request), so a bucket deleted
    during the run is told too.

    Raises:
        StorageUnavailableError: the bucket does not exist, or the store did not answer.
    """
    protocols = _protocols(fs)
    if not protocols & _BUCKETED:
        return
    bucket = path.strip("/").split("/", 1)[0]
    if not bucket:
        return
    fs.invalidate_cache(bucket)
    try:
        with _answered(url):
            fs.info(bucket)
    except FileNotFoundError:
        raise StorageUnavailableError(
            f"{url}: the bucket {bucket!r} does not exist (a mistyped or deleted bucket is "
            "not an empty run): fix the URL or create the bucket"
        ) from None


@contextlib.contextmanager
def _answered(url: str) -> Iterator[None]:
    """Raise a failure of a query of the store as :class:`StorageUnavailableError` (355)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001 - botocore's, aiohttp's, fsspec's: all say "no answer"
        raise StorageUnavailableError(f"{url}: {type(error).__name__}: {error}") from error


def exists(url: str) -> bool:
    """Whether an object exists at ``url`` (a failure to ask raises 355)."""
    info = _info(url)
    return info is not None and info.get("type") == "file"


def is_dir(url: str) -> bool:
    """Whether objects exist under ``url`` as a prefix (a "directory"; a failure to ask raises 355)."""
    info = _info(url)
    return info is not None and info.get("type") == "directory"


def size_of(url: str) -> int:
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    with _answered(url):
        return int(fs.size(path))


def list_names(url: str) -> list[str]:
    """The names of the objects directly under the prefix ``url``, sorted; [] if none."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    try:
        with _answered(url):
            entries = fs.ls(path, detail=True, refresh=True)
    except FileNotFoundError:
        _check_bucket(fs, path, url)
        return []
    names = []
    for entry in entries:
        if entry.get("type") != "file":
            continue
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        names.append(name)
    return sorted(names)


def remove(url: str) -> None:
    """Remove the object at ``url`` (a missing one raises ``FileNotFoundError``)."""
    fs, path = filesystem(url)
    if not exists(url):
        raise FileNotFoundError(url)
    fs.rm_file(path)
    fs.invalidate_cache(path)


def open_for_read(url: str) -> Any:
    """A seekable binary file object over the object at ``url`` (``size`` attribute set)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return fs.open(path, "rb", block_size=READ_BLOCK_SIZE, cache_type="readahead")


class ObjectReader:
    """The object at ``url`` read by position: a read that goes on where the last one
    ended streams through a read-ahead buffer; any other one (a header, a zip directory
    at the end) is one ranged request for exactly its bytes, so the stream's buffer is
    neither refilled for it nor moved away.

    Raises:
        FileNotFoundError: no object at ``url``.
    """

    def __init__(self, url: str) -> None:
        self._fs, self._path = filesystem(url)
        self._handle = open_for_read(url)
        self.size = int(self._handle.size)
        self._next: int | None = None
        self._lock = threading.Lock()

    def pread_into(self, view: memoryview, position: int) -> int:
        count = max(0, min(len(view), self.size - position))
        with self._lock:
            if not count:
                data = b""
            elif position == self._next:
                self._handle.seek(position)
                data = self._handle.read(count)
            else:
                data = self._fs.cat_file(self._path, start=position, end=position + count)
            self._next = position + len(data)
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._handle.close()


def abort_stale_uploads(url: str, *, exact: bool = False) -> list[str]:
    """Abort the incomplete multipart uploads of ``url`` (``exact``) or of every key under
    it, except those this process is sending; returns their keys.

    Only stores with multipart uploads that can be listed (S3) have any; elsewhere an
    unfinished upload never becomes an object and expires with the store's own rules.
    """
    fs, path = filesystem(url)
    lister = getattr(fs, "list_multipart_uploads", None)
    if lister is None or not hasattr(fs, "split_path"):
        return []
    bucket, key, _ = fs.split_path(path)
    prefix = key if exact else (key.rstrip("/") + "/" if key else "")
    try:
        uploads = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
    except Exception:  # noqa: BLE001 - cleanup is best effort; the write goes on
        return []
    aborted = []
    for found in uploads.get("Uploads", []):
        name = found.get("Key", "")
        if (exact and name != key) or f"{bucket}/{name}" in _sending:
            continue
        try:
            fs.call_s3(
                "abort_multipart_upload", Bucket=bucket, Key=name, UploadId=found["UploadId"]
            )
        except Exception:  # noqa: BLE001 - another cleanup was quicker
            continue
        aborted.append(name)
    return aborted
