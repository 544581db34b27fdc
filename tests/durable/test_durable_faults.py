"""Failed and interrupted checkpoint writes never cost the previous checkpoint."""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer_resume._atomic import is_temp_name
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import CheckpointNotDurableError, CheckpointWriteError

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs fork, signals and rlimits")


def run_in_fresh_interpreter(target: Callable[..., None], *args: Any, timeout: float) -> Any:
    """``target(*args, report)`` in a spawned process; what it sent through ``report``.

    A child forked from the test process would inherit the locks of the test runner's
    own threads (and of whatever earlier tests in this process left running), which are
    no part of what is tested: a child started from a fresh interpreter, or forked by
    one, inherits only what the library itself started.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=target, args=(*args, send))
    child.start()
    try:
        assert receive.poll(timeout), f"the child reported nothing within {timeout} s"
        outcome = receive.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(10)
    assert child.exitcode == 0, f"the child exited with {child.exitcode}"
    return outcome


def versioned_state(version: int, *, numel: int = 64) -> dict[str, Any]:
    return {
        "version": version,
        "weight": torch.full((numel,), float(version)),
        "index": torch.arange(numel, dtype=torch.int64) * version,
        "tag": f"v{version}",
    }


def assert_state_equal(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(actual) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(actual[name], value), name
        else:
            assert actual[name] == value, name


def temp_files(directory: Path) -> list[str]:
    return sorted(entry for entry in os.listdir(directory) if is_temp_name(entry))


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(versioned_state(1), path)
    return path


def assert_previous_intact_and_retry_succeeds(path: Path) -> None:
    assert sorted(os.listdir(path.parent)) == [path.name]  # no temp file left
    assert_state_equal(load_checkpoint(path), versioned_state(1))
    save_checkpoint(versioned_state(2), path)
    assert_state_equal(load_checkpoint(path), versioned_state(2))
    assert sorted(os.listdir(path.parent)) == [path.name]


# --- in-process fault injection --------------------------------------------------------


class _RaisesWhenPickled:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> Any:
        raise self.error


def test_exception_inside_serialization_keeps_previous_file(previous: Path) -> None:
    boom = ValueError("cannot pickle this")
    with pytest.raises(CheckpointWriteError) as raised:
        save_checkpoint({"ok": torch.ones(3), "bad": _RaisesWhenPickled(boom)}, previous)
    assert raised.value.__cause__ is boom
    assert str(previous) in str(raised.value)
    assert_previous_intact_and_retry_succeeds(previous)


def test_interrupt_inside_serialization_propagates_and_removes_temp(previous: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"bad": _RaisesWhenPickled(KeyboardInterrupt())}, previous)
    assert_previous_intact_and_retry_succeeds(previous)


def _failing_after(real: Callable[..., Any], fail_at: int, error: OSError) -> Callable[..., Any]:
    calls = {"n": 0}

    def fake(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise error
        return real(*args)

    fake.calls = calls  # type: ignore[attr-defined]
    return fake


def _count_writes(monkeypatch: pytest.MonkeyPatch, path: Path) -> int:
    counting = _failing_after(os.write, 0, OSError())
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", counting)
        save_checkpoint(versioned_state(1), path.with_name("count.pt"))
    os.remove(path.with_name("count.pt"))
    return counting.calls["n"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize(
    "position", ["header-placeholder", "first-record", "middle", "final-header"]
)
def test_failed_write_keeps_previous_file(
    previous: Path, monkeypatch: pytest.MonkeyPatch, code: int, position: str
) -> None:
    total = _count_writes(monkeypatch, previous)
    fail_at = {
        "header-placeholder": 1,
        "first-record": 2,
        "middle": total // 2,
        "final-header": total,
    }[position]
    error = OSError(code, os.strerror(code))
    failing = _failing_after(os.write, fail_at, error)
    with monkeypatch.context() as patch, pytest.raises(CheckpointWriteError) as raised:
        patch.setattr(os, "write", failing)
        save_checkpoint(versioned_state(2), previous)
    assert failing.calls["n"] == fail_at  # the fault fired, and nothing was written after it
    assert raised.value.__cause__ is error
    assert_previous_intact_and_retry_succeeds(previous)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_failed_replace_keeps_previous_file(
    previous: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    error = OSError(code, os.strerror(code))
    failing = _failing_after(os.replace, 1, error)
    with monkeypatch.context() as patch, pytest.raises(CheckpointWriteError) as raised:
        patch.setattr(os, "replace", failing)
        save_checkpoint(versioned_state(2), previous)
    assert raised.value.__cause__ is error
    assert_previous_intact_and_retry_succeeds(previous)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_failed_fsync_discards_temp_without_second_fsync(
    previous: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    real_fsync = os.fsync
    synced: list[tuple[int, str]] = []
    error = OSError(code, os.strerror(code))

    def failing_fsync(fd: int) -> None:
        synced.append(
            (fd, os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else "")
        )
        if len(synced) == 1:
            raise error
        real_fsync(fd)

    with monkeypatch.context() as patch, pytest.raises(CheckpointWriteError) as raised:
        patch.setattr(os, "fsync", failing_fsync)
        save_checkpoint(versioned_state(2), previous)
    assert raised.value.__cause__ is error
    assert len(synced) == 1  # neither the temp file nor anything else was synced again
    if synced[0][1]:
        assert is_temp_name(os.path.basename(synced[0][1]))
    assert_previous_intact_and_retry_succeeds(previous)


@posix_only
def test_failed_directory_fsync_raises_write_error_after_complete_replace(
    previous: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = OSError(errno.EIO, os.strerror(errno.EIO))
    with monkeypatch.context() as patch, pytest.raises(CheckpointNotDurableError) as raised:
        patch.setattr(os, "fsync", _failing_after(os.fsync, 2, error))
        save_checkpoint(versioned_state(2), previous)
    assert raised.value.__cause__ is error
    assert isinstance(raised.value, CheckpointWriteError)  # callers that retry writes retry this
    # The message tells the truth: the new file is in place, the previous one is not intact.
    assert "new checkpoint is in place" in str(raised.value)
    assert "previous checkpoint is intact" not in str(raised.value)
    # The rename happened; the path holds one complete checkpoint and no temp is left.
    assert sorted(os.listdir(previous.parent)) == [previous.name]
    assert_state_equal(load_checkpoint(previous), versioned_state(2))


def test_missing_directory_raises_write_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointWriteError) as raised:
        save_checkpoint(versioned_state(1), tmp_path / "absent" / "ckpt.pt")
    assert isinstance(raised.value.__cause__, FileNotFoundError)


@posix_only
def test_stale_temp_of_dead_writer_is_removed_by_next_save_and_others_are_kept(
    previous: Path,
) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    dead = int(finished.stdout)
    directory = previous.parent
    stale = directory / f".ckpt.pt.{dead}.0123456789abcdef.tmp"
    live_writer = directory / f".ckpt.pt.{os.getpid()}.fedcba9876543210.tmp"
    other_target = directory / f".other.pt.{dead}.0123456789abcdef.tmp"
    unrelated = directory / "ckpt.pt.bak"
    for path in (stale, live_writer, other_target, unrelated):
        path.write_bytes(b"partial")
    save_checkpoint(versioned_state(2), previous)
    assert not stale.exists()
    assert live_writer.exists() and other_target.exists() and unrelated.exists()
    assert_state_equal(load_checkpoint(previous), versioned_state(2))


# --- child processes ---------------------------------------------------------------------


def _save_under_file_size_limit(path: str, limit: int, report: Any) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_checkpoint(versioned_state(2, numel=1 << 20), path)
    except CheckpointWriteError as exc:
        cause = exc.__cause__
        report.send(("CheckpointWriteError", exc.code, getattr(cause, "errno", None), repr(cause)))
    except BaseException as exc:  # reported, so the test shows what happened instead
        report.send((type(exc).__name__, None, None, repr(exc)))
    else:
        report.send(("saved", None, None, ""))


@posix_only
@pytest.mark.slow
def test_file_size_limit_hit_mid_write_keeps_previous_file(previous: Path) -> None:
    outcome = run_in_fresh_interpreter(
        _save_under_file_size_limit, str(previous), 1 << 20, timeout=120
    )
    assert outcome[:3] == ("CheckpointWriteError", 327, errno.EFBIG), outcome
    assert_previous_intact_and_retry_succeeds(previous)


def _overwrite_forever(path: str, first_version: int, completed: Any) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's thread pool
    version = first_version
    while True:
        save_checkpoint(versioned_state(version, numel=1 << 18), path)
        completed.value = version
        version += 1


def _kill_writers_at_random_moments(folder: str, report: Any) -> None:
    """Start and SIGKILL a writer 32 times; report how many kills landed mid-write."""
    try:
        report.send(("done", _kill_writers(Path(folder))))
    except BaseException as exc:  # reported, so the test shows what happened instead
        report.send(("failed", repr(exc)))


def _kill_writers(tmp_path: Path) -> int:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(versioned_state(0, numel=1 << 18), path)
    context = multiprocessing.get_context("fork")
    completed = context.Value("q", -1, lock=False)
    rng = random.Random(20240611)
    on_disk, kills_mid_write = 0, 0
    for _ in range(32):
        left_by_last_kill = temp_files(tmp_path)
        completed.value = -1
        child = context.Process(
            target=_overwrite_forever, args=(str(path), on_disk + 1, completed), daemon=True
        )
        child.start()
        try:
            deadline = time.monotonic() + 20
            while completed.value < on_disk + 1:  # the writer must really complete a save
                assert child.is_alive(), f"writer died on its own (exit code {child.exitcode})"
                assert time.monotonic() < deadline, "writer completed no save within 20 s"
                time.sleep(0.001)
            assert not set(left_by_last_kill) & set(temp_files(tmp_path)), (
                "stale temp survived a save"
            )
            time.sleep(rng.uniform(0.0, 0.03))
        finally:
            child.kill()
            child.join(10)
        assert child.exitcode == -signal.SIGKILL
        last_completed = completed.value
        loaded = load_checkpoint(path)
        # The kill may land between the rename and the counter update: one ahead at most.
        assert loaded["version"] in (last_completed, last_completed + 1)
        assert_state_equal(loaded, versioned_state(loaded["version"], numel=1 << 18))
        kills_mid_write += bool(temp_files(tmp_path))
        on_disk = loaded["version"]
    save_checkpoint(versioned_state(on_disk + 1), path)
    assert temp_files(tmp_path) == []
    return kills_mid_write


@posix_only
@pytest.mark.slow
def test_writer_killed_at_random_moments_always_leaves_one_complete_version(tmp_path: Path) -> None:
    # The writers are forked (a fresh interpreter for each of 32 kills would cost a
    # minute), by a spawned process rather than by the test process.
    outcome = run_in_fresh_interpreter(_kill_writers_at_random_moments, str(tmp_path), timeout=300)
    assert outcome[0] == "done", outcome[1]
    assert outcome[1] >= 1, "no kill landed during a write; the test proved nothing"


# The parent saves and loads a large file (blake3's thread pool and the digest helper
# thread start), then forks a child that does the same. It runs in a fresh interpreter:
# forked from the test process, the child would also inherit the locks of the test
# runner's own threads, which are no part of what is tested.
_FORK_AFTER_LARGE_SAVES = """
import multiprocessing, sys
import torch
from trainer_resume.durable import load_checkpoint, save_checkpoint

def save_and_load_large(path, report):
    torch.set_num_threads(1)  # a forked child must not enter the parent's thread pool
    state = {"w": torch.arange(3 << 20, dtype=torch.float32)}  # 12 MiB: hashed on threads
    try:
        save_checkpoint(state, path)
        report.send(torch.equal(load_checkpoint(path)["w"], state["w"]))
    except BaseException as exc:  # reported, so the test shows what happened instead
        report.send(repr(exc))

folder = sys.argv[1]
large = {"w": torch.ones(3 << 20)}
save_checkpoint(large, folder + "/parent.pt")
assert torch.equal(load_checkpoint(folder + "/parent.pt")["w"], large["w"])
context = multiprocessing.get_context("fork")
receive, send = context.Pipe(duplex=False)
child = context.Process(target=save_and_load_large, args=(folder + "/child.pt", send))
child.start()
if not receive.poll(60):
    child.kill()
    sys.exit("the forked child neither saved nor failed within 60 s")
print(receive.recv())
child.join(30)
"""


@posix_only
@pytest.mark.slow
def test_a_child_forked_after_large_saves_saves_and_loads_large_files(tmp_path: Path) -> None:
    # Large files are hashed on blake3's thread pool, whose threads a forked child lacks.
    done = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_LARGE_SAVES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True", done.stdout + done.stderr[-3000:]
