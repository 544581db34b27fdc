"""One moto S3 server per test process, its endpoint and credentials in the environment
(inherited by the children the tests start), and a fresh bucket per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from support.s3_server import ENVIRONMENT, make_bucket, moto_server

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as patch:
        for name, value in {**ENVIRONMENT, "AWS_ENDPOINT_URL": endpoint}.items():
            patch.setenv(name, value)
        yield endpoint


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """``s3://<fresh bucket>`` on the session's server."""
    return make_bucket(f"test-{os.getpid()}-{next(_buckets)}")
