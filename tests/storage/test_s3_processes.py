"""Against a real S3 server (moto): a pause written on SIGTERM, an 800 MB pause killed
mid-upload and resume points killed with SIGKILL, each taken up in another process and
continued bit-identically to an uninterrupted run."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import s3fs
from support.point_trainers import points_trainer
from support.s3_children import BlobTrainer, big_pause, pause_on_sigterm, points_until_killed
from support.s3_server import ENVIRONMENT
from support.trainers import TinyTrainer, trained_state, uninterrupted_state

from trainer_resume.difference import first_difference
from trainer_resume.errors import ResumePointsInUseError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.name != "posix", reason="needs SIGKILL and a fork server"),
]

WAIT_S = 120.0
BLOB_BYTES = 800 << 20


@pytest.fixture(scope="module")
def context() -> multiprocessing.context.BaseContext:
    # One server imports torch (and torch._dynamo, which the optimizers import on first
    # use) once; every child is forked from it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "support.s3_children"])
    return context


@pytest.fixture
def environment(s3_endpoint: str) -> dict[str, str]:
    """What a child needs to reach the server (the fork server may predate the fixture)."""
    return {**ENVIRONMENT, "AWS_ENDPOINT_URL": s3_endpoint}


def wait_for(condition: Callable[[], Any], child: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = condition()
        if found:
            return found
        assert child.is_alive(), f"child exited with {child.exitcode} before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_sigterm_pause_to_s3_resumes_bit_identically_in_another_process_with_no_local_folder(
    context: Any, environment: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    url = f"{bucket}/runs/exp1/pause.ckpt"
    child = context.Process(target=pause_on_sigterm, args=(environment, str(tmp_path), url))
    child.start()
    wait_for((tmp_path / "ready").exists, child, "three steps")
    os.kill(child.pid, signal.SIGTERM)
    child.join(WAIT_S)
    assert child.exitcode == 0
    paused_at = int((tmp_path / "paused").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paused", "ready"]  # no "s3:" folder

    resumed = TinyTrainer()
    resumed.resume(url)
    assert resumed.completed_steps == paused_at >= 4
    steps = paused_at + 5
    assert first_difference(uninterrupted_state(steps), trained_state(resumed, steps)) is None


def _uploads(fs: s3fs.S3FileSystem, url: str) -> list[dict[str, Any]]:
    bucket, key = url[len("s3://") :].split("/", 1)
    found = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
    return [upload for upload in found.get("Uploads", []) if upload["Key"] == key]


def _parts(fs: s3fs.S3FileSystem, url: str, upload: dict[str, Any]) -> int:
    bucket, key = url[len("s3://") :].split("/", 1)
    found = fs.call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload["UploadId"])
    return len(found.get("Parts", []))


def test_an_800mb_pause_killed_mid_upload_leaves_the_previous_pause_which_resumes_exactly(
    context: Any, environment: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    url = f"{bucket}/runs/big/pause.ckpt"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    child = context.Process(target=big_pause, args=(environment, str(tmp_path), url, BLOB_BYTES))
    child.start()
    wait_for((tmp_path / "uploading").exists, child, "the big pause")
    # Killed once the server holds a part of the big pause's upload: mid-upload.
    wait_for(
        lambda: any(_parts(fs, url, upload) for upload in _uploads(fs, url)),
        child,
        "a part of the upload",
    )
    child.kill()
    child.join(WAIT_S)
    assert child.exitcode == -signal.SIGKILL
    assert _uploads(fs, url), "the killed upload should be left incomplete on the server"
    assert fs.size(url[len("s3://") :]) < 1 << 20  # the previous, small pause

    resumed = BlobTrainer()
    resumed.resume(url)
    assert resumed.completed_steps == 2 and resumed.blob.numel() == 0
    assert first_difference(uninterrupted_state(6, BlobTrainer), trained_state(resumed, 6)) is None
    resumed.pause(url)  # the next write to the key aborts the killed one's upload
    assert _uploads(fs, url) == []


def test_resume_points_at_s3_killed_with_sigkill_resume_exactly_and_refuse_a_second_writer(
    context: Any, environment: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    url = f"{bucket}/runs/points"
    child = context.Process(target=points_until_killed, args=(environment, str(tmp_path), url))
    child.start()
    wait_for((tmp_path / "ready").exists, child, "the point of step 6")
    second = points_trainer(url, every_steps=1)
    with pytest.raises(ResumePointsInUseError, match=f"process {child.pid} on host"):
        second.train_step()
    child.kill()
    child.join(WAIT_S)
    assert child.exitcode == -signal.SIGKILL

    resumed = points_trainer(url, every_steps=2, keep=2, when_busy="wait")
    resumed.resume_latest()
    assert resumed.completed_steps >= 6
    steps = resumed.completed_steps + 4
    # The killed writer's lock is taken over: its process has ended.
    assert first_difference(uninterrupted_state(steps), trained_state(resumed, steps)) is None
    resumed.finish(f"{url}/pause.ckpt")  # waits for the last point, lets the lock go
    assert not s3fs.S3FileSystem(skip_instance_cache=True).exists(
        f"{url[len('s3://') :]}/.trainer-resume.lock"
    )
