"""The temp files of durable writes: named within the file-name limit, cleaned before a write,
never another host's; and a failing close of the file being replaced is a catalogue error."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer_resume import _atomic
from trainer_resume._atomic import is_temp_name
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import CheckpointWriteError

NAME_MAX = 255


def _dead_pid() -> int:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(finished.stdout)


def _temps(directory: Path) -> list[str]:
    return sorted(entry for entry in os.listdir(directory) if is_temp_name(entry))


@pytest.mark.parametrize("name", ["a" * NAME_MAX, "é" * (NAME_MAX // 2), "p" * 200 + ".ckpt"])
def test_a_target_with_a_name_up_to_the_limit_is_written_through_a_temp_name_within_it(
    tmp_path, monkeypatch, name
):
    target = tmp_path / name
    assert len(os.fsencode(name)) <= NAME_MAX
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT:
            opened.append(os.path.basename(os.fspath(path)))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", recording_open)
    save_checkpoint({"w": torch.arange(3)}, target)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(target)["w"], torch.arange(3))
    [temp] = opened
    assert is_temp_name(temp) and len(os.fsencode(temp)) <= NAME_MAX
    assert _temps(tmp_path) == []


def test_a_dead_writers_temp_is_removed_before_the_next_write_to_its_target(tmp_path, monkeypatch):
    target = tmp_path / ("b" * 240)  # long: its temps carry a shortened stem
    save_checkpoint({"v": 1}, target)
    stale = tmp_path / _atomic._temp_name(target.name).replace(
        f"-{os.getpid()}.", f"-{_dead_pid()}."
    )
    stale.write_bytes(b"\0" * 4096)  # a dead writer's temp: the space the next write needs
    other_target = tmp_path / _atomic._temp_name("other.ckpt").replace(
        f"-{os.getpid()}.", f"-{_dead_pid()}."
    )
    other_target.write_bytes(b"partial")
    present_at_create: list[bool] = []
    real_open = os.open

    def checking_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT:
            present_at_create.append(stale.exists())
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", checking_open)
    save_checkpoint({"v": 2}, target)
    monkeypatch.undo()
    assert present_at_create == [False]  # gone before the new temp was created
    assert load_checkpoint(target) == {"v": 2}
    assert other_target.exists()  # another target's temps are that target's writes' business


def test_temps_of_another_host_are_kept_and_a_dead_local_writers_are_removed(tmp_path):
    dead = _dead_pid()
    local = tmp_path / _atomic._temp_name("ckpt.pt").replace(f"-{os.getpid()}.", f"-{dead}.")
    other_host = "0" * 8 if _atomic._HOST != "0" * 8 else "1" * 8
    remote = tmp_path / local.name.replace(f".{_atomic._HOST}-", f".{other_host}-")
    earlier_version = tmp_path / f".ckpt.pt.{dead}.0123456789abcdef.tmp"  # no host in the name
    for path in (local, remote, earlier_version):
        path.write_bytes(b"partial")
    save_checkpoint({"v": 1}, tmp_path / "ckpt.pt")
    assert not local.exists() and not earlier_version.exists()
    assert remote.exists()  # its writer may be alive on the other host


def test_a_failing_close_of_the_file_about_to_be_replaced_is_a_write_error_with_the_os_error(
    tmp_path, monkeypatch
):
    target = tmp_path / "ckpt.pt"
    save_checkpoint({"v": 1}, target)
    read_only: list[int] = []
    real_open, real_close = os.open, os.close

    def tracking_open(path: Any, flags: int, *args: Any) -> int:
        fd = real_open(path, flags, *args)
        if os.fspath(path) == str(target) and not flags & (os.O_WRONLY | os.O_RDWR):
            read_only.append(fd)
        return fd

    def failing_close(fd: int) -> None:
        real_close(fd)
        if fd in read_only:  # a deferred error reported by close(), as NFS does
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "close", failing_close)
    with pytest.raises(
        CheckpointWriteError, match=r"could not write .*ckpt\.pt: OSError\(5"
    ) as raised:
        save_checkpoint({"v": 2}, target)
    monkeypatch.undo()
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.__cause__.errno == errno.EIO
    assert read_only  # the close that failed was that of the file being replaced
    assert load_checkpoint(target) == {"v": 1}
    assert _temps(tmp_path) == []
