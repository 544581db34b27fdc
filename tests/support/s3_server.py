"""The S3 server the storage tests run against (shared with the cloud-storage benchmark)."""

from __future__ import annotations

from benchmarks._s3_server import ENVIRONMENT, make_bucket, moto_server

__all__ = ["ENVIRONMENT", "make_bucket", "moto_server"]
