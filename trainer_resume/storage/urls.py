"""Which paths are URLs, the fsspec filesystem that serves each, and its options.

A path with a scheme (``s3://bucket/run/pause.ckpt``, ``gs://...``, ``memory://...``)
goes to object storage through ``fsspec``; ``file://`` names a local path and is
handled as one. Credentials and endpoints come from the environment as the fsspec
implementation reads them (for S3: the ``AWS_*`` variables, ``AWS_ENDPOINT_URL``
included), plus the options given for a URL prefix with
:func:`set_storage_options` (where a path is configured: ``ResumePoints``,
``ResumeCallback``, ``ResumableTrainer`` take ``storage_options=``).

A scheme with no installed implementation is refused with
:class:`~trainer_resume.errors.StorageURLError` (353), naming the package to install:
such a path never becomes a local folder named ``s3:``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import StorageURLError

__all__ = [
    "basename",
    "check_location",
    "filesystem",
    "is_url",
    "join",
    "local_path",
    "normalized",
    "parent",
    "set_storage_options",
]

# "scheme://": two characters at least, so a Windows drive ("C:\\", "C:/") is no URL.
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+)://")
# "s3:/bucket/...": a URL with one slash missing (a local folder named "s3:" otherwise).
_ONE_SLASH = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):/(?!/)")
# A scheme's usual package, for the message (fsspec names some itself).
_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "adl": "adlfs",
    "hf": "huggingface_hub",
    "oci": "ocifs",
    "oss": "ossfs",
    "r2": "s3fs",
}
_options: dict[str, dict[str, Any]] = {}
_options_lock = threading.Lock()


def is_url(path: Any) -> bool:
    """Whether ``path`` is a string with a scheme other than ``file://``."""
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return match is not None and match.group("scheme").lower() != "file"


def normalized(url: str) -> str:
    """``url`` with its scheme in lower case (``S3://b/k`` is ``s3://b/k``: schemes are
    case-insensitive, fsspec's registry is not)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme.lower()}://{rest}"


def check_local_path(path: str) -> None:
    """Refuse a local path that reads as a URL with one slash missing (``s3:/bucket/run``),
    which would otherwise become a local folder named ``s3:`` (353)."""
    match = _ONE_SLASH.match(path)
    if match is None:
        return
    scheme = match.group("scheme").lower()
    if scheme == "file" or not (scheme in _PACKAGES or _fsspec_knows(scheme)):
        return
    rest = path[match.end() :]
    raise StorageURLError(
        f"{path!r} reads as a {scheme}:// URL with a slash missing: write "
        f"'{scheme}://{rest}' (or './{path}' for a local folder named '{match.group('scheme')}:')"
    )


def _fsspec_knows(scheme: str) -> bool:
    """Whether fsspec has an implementation (installed or not) registered for ``scheme``."""
    import fsspec
    from fsspec.registry import known_implementations

    return scheme in known_implementations or scheme in fsspec.registry


def local_path(path: Any) -> Any:
    """``path`` with a ``file://`` scheme removed (other values unchanged)."""
    if isinstance(path, str) and path[:7].lower() == "file://":
        return path[7:]
    return path


def set_storage_options(url: str, options: Mapping[str, Any] | None) -> None:
    """Use ``options`` (fsspec storage options) for every path under ``url``.

    The longest registered prefix of a path wins. ``None`` or an empty mapping removes
    the prefix's options. Local paths take no options.

    Raises:
        TypeError: ``options`` is not a mapping with string keys.
        StorageURLError: ``url`` has a scheme with no installed implementation (353).
    """
    if not is_url(url):
        if options:
            raise ValueError(f"storage_options apply to URLs (s3://...), not to {url!r}")
        return
    if options is not None and (
        not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options)
    ):
        raise TypeError(f"storage_options must be a mapping of str keys, got {options!r}")
    check_location(url)
    with _options_lock:
        if options:
            _options[url.rstrip("/")] = dict(options)
        else:
            _options.pop(url.rstrip("/"), None)


def _options_for(url: str) -> dict[str, Any]:
    with _options_lock:
        best = ""
        for prefix in _options:
            if (url == prefix or url.startswith(prefix + "/")) and len(prefix) > len(best):
                best = prefix
        return dict(_options.get(best, {}))


def check_location(path: Any) -> None:
    """Refuse a URL whose scheme has no installed fsspec implementation (353); a no-op
    for local paths. Called where a path is given, long before anything is written."""
    if is_url(path):
        filesystem(path)


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem that serves ``url`` and the path it takes.

    Raises:
        StorageURLError: no installed implementation for the scheme (353), naming the
            package to install.
    """
    url = normalized(url)
    scheme = url.split("://", 1)[0]
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError as exc:  # pragma: no cover - fsspec is a dependency
        raise StorageURLError(f"{url}: fsspec is not installed (pip install fsspec)") from exc
    package = _PACKAGES.get(scheme)
    if not _fsspec_knows(scheme):
        known = f"; install {package}" if package else ""
        raise StorageURLError(f"{url}: fsspec knows no scheme {scheme!r}{known}")
    try:
        fs, path = fsspec.core.url_to_fs(url, **_options_for(url))
    except ImportError as exc:
        wanted = package or known_implementations.get(scheme, {}).get("err", "its package")
        raise StorageURLError(
            f"{url}: the {scheme}:// implementation is not installed; install {wanted}"
            + (" (pip install 'trainer-resume[s3]')" if package == "s3fs" else "")
        ) from exc
    except Exception as exc:  # noqa: BLE001 - e.g. hdfs:// without a JVM: no filesystem
        raise StorageURLError(
            f"{url}: the {scheme}:// filesystem could not be set up: "
            f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        ) from exc
    return fs, path


def join(location: Any, name: str) -> str:
    """``name`` inside the directory (or prefix) ``location``."""
    location = local_path(location)
    if is_url(location):
        return location.rstrip("/") + "/" + name
    return os.path.join(os.fspath(location), name)


def basename(path: Any) -> str:
    """The last component of a path or URL."""
    path = local_path(path)
    if is_url(path):
        return path.rstrip("/").rsplit("/", 1)[-1]
    return os.path.basename(os.fspath(path))


def parent(path: Any) -> str:
    """The directory (or prefix) that holds ``path``."""
    path = local_path(path)
    if is_url(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(os.fspath(path)))
