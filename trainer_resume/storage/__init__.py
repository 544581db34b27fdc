"""Paths that are URLs: object storage through fsspec (``s3://``, ``gs://``, ``memory://``).

:mod:`.urls` tells URLs from local paths, refuses a scheme with nothing installed to
read it (353) and keeps the storage options given for a prefix; :mod:`.objects` writes
an object whole or not at all and reads, lists and removes objects; :mod:`.paths` is
what the rest of the package calls with a path that may be either. docs/cloud-storage.md
says what the promises of a local disk mean on an object store.
"""

from __future__ import annotations

from .urls import is_url, set_storage_options

__all__ = ["is_url", "set_storage_options"]
