"""A real S3 server for the storage tests and the cloud-storage benchmark: moto's standalone
server (``moto_server -H 127.0.0.1 -p PORT``) on a free port, and the environment s3fs
reads its endpoint and credentials from."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _executable() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "moto_server")
    found = beside if os.path.exists(beside) else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
    return found


@contextlib.contextmanager
def moto_server(timeout: float = 60.0) -> Iterator[str]:
    """Run ``moto_server -H 127.0.0.1 -p PORT`` until the block ends; yields its endpoint."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [_executable(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"moto_server exited with {server.returncode}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"moto_server did not answer on {endpoint}") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def make_bucket(name: str) -> str:
    """Create bucket ``name`` on the server the environment names; returns ``s3://name``."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"
