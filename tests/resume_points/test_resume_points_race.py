"""``resume_latest`` beside a live writer that takes a point every step and keeps one.

A requeued job may start while its predecessor still writes: every point the reader
chooses may be removed by the writer's retention before it is read. The reader must
then fall back (read the directory again), never fail, and always resume exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.name != "posix", reason="POSIX file semantics"),
]

ROUNDS = 200
TIMEOUT_S = 540


def _start(*arguments: str) -> subprocess.Popen:
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(tests), str(tests.parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "support.point_race", *arguments],
        cwd=tests,
        env={**os.environ, "PYTHONPATH": path},
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_reader_beside_a_writer_with_keep_1_resumes_200_times_exactly_and_never_fails(
    tmp_path,
):
    directory, stop, result = tmp_path / "points", tmp_path / "stop", tmp_path / "result.json"
    writer = _start("writer", str(directory), str(stop))
    started = time.monotonic()
    try:
        reader = _start("reader", str(directory), str(ROUNDS), str(result))
        try:
            _, reader_errors = reader.communicate(timeout=TIMEOUT_S)
        finally:
            reader.kill()
        assert reader.returncode == 0, reader_errors[-3000:]
    finally:
        stop.touch()
        _, writer_errors = writer.communicate(timeout=120)
    assert writer.returncode == 0, writer_errors[-3000:]
    record = json.loads(result.read_text())
    print(
        f"{ROUNDS} resumes in {time.monotonic() - started:.1f} s, steps "
        f"{record['steps'][0]}..{record['steps'][-1]}, listings with a vanished point: "
        f"{record['vanished']}"
    )
    assert record["errors"] == []
    assert record["warnings"] == []
    assert record["differences"] == []
    assert len(record["steps"]) == ROUNDS
    assert record["steps"] == sorted(record["steps"])  # keep=1: the newest only moves on
    assert record["steps"][-1] > record["steps"][0]  # the writer ran beside the reader
