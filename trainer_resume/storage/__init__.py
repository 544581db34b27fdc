"""Paths that are URLs: object storage through fsspec (``s3://``, ``gs://``, ``memory://``).

:mod:`.urls` tells URLs from local paths, refuses a scheme with nothing installed to
read it (353) and keeps the storage options given for a prefix; :mod:`.objects` writes
an object whole or not at all and reads, lists and removes objects; :mod:`.paths` is
what the rest of the package calls with a path that may be either. docs/cloud-storage.md
says what the promises of a local disk mean on an object store.
"""

from __future__ import annotations

import os

from . import paths
from .urls import is_url, set_storage_options

__all__ = ["exists", "is_url", "set_storage_options"]


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether a pause file (or anything) is at ``path``, a local path or a URL.

    What a launch script asks before ``resume(path)``: ``os.path.exists`` answers
    ``False`` for every URL, so a requeued job would start over.

    Raises:
        StorageUnavailableError: the store did not answer, or the URL's bucket does not
            exist (355): never taken for "nothing there".
        StorageURLError: no installed fsspec implementation reads the URL's scheme, or the
            URL is misspelt (353).
    """
    return paths.exists(path)
