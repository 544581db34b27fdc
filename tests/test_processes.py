"""A process named earlier has ended only when that is certain: a pid gone, a zombie or a
pid reused, in this process space; anything that cannot be checked counts as running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support import process_tree
from support.process_names import NAME_SCRIPT, name_of_an_ended_process, named_child

from trainer_resume.processes.names import ended, this_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _waiting_child() -> tuple[subprocess.Popen[str], dict]:
    # It prints its name, then waits for its stdin to close.
    return named_child(script=NAME_SCRIPT + "sys.stdin.read()\n")


def test_this_process_is_named_by_pid_host_boot_pid_namespace_and_start_time():
    name = this_process()
    assert name["pid"] == os.getpid()
    assert isinstance(name["start"], int) and name["start"] > 0
    assert name["boot"] and name["pidns"].startswith("pid:[")
    assert json.loads(json.dumps(name)) == name  # recorded as JSON
    assert not ended(name)


def test_a_running_child_has_not_ended_and_a_reaped_or_zombie_one_has():
    child, name = _waiting_child()
    try:
        assert not ended(name)
        child.stdin.close()  # it exits; not reaped yet: a zombie
        deadline = time.monotonic() + 60
        while process_tree.state(child.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert ended(name)
    finally:
        child.kill()
        child.wait(timeout=60)
    assert ended(name)  # reaped: its pid is gone


def test_a_pid_now_running_with_another_start_time_has_ended():
    assert ended({**this_process(), "start": this_process()["start"] + 1})


@pytest.mark.parametrize(
    "change",
    [
        {"host": "elsewhere"},
        {"boot": "00000000-0000-0000-0000-000000000000"},
        {"pidns": "pid:[1]"},
        {"start": None},
        {"boot": None},
        {"pid": "not a pid"},
    ],
)
def test_a_process_that_cannot_be_checked_from_here_counts_as_running(change):
    name = name_of_an_ended_process()
    assert ended(name)
    assert not ended({**name, **change})


def test_a_name_without_the_linux_fields_counts_as_running():
    name = name_of_an_ended_process()
    assert not ended({"pid": name["pid"], "host": name["host"]})
