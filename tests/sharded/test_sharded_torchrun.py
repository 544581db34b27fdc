"""Sharded runs as torchtitan builds them, under ``torchrun`` with 2 gloo ranks.

Blocks wrapped by ``checkpoint_wrapper``, then ``torch.compile`` (replacing the block),
then ``fully_shard``: a SIGTERM to the job pauses every rank, and a new ``torchrun``
resumes the pause compiled, bit-identically to the uninterrupted run, and eager (the
paused state, exactly). Resume points of a sharded model: one rank SIGKILLed while it
writes its part of a point leaves that point incomplete, and ``resume_latest()`` in a
new ``torchrun`` continues from the newest committed one, bit-identically. Every child
runs in a process of its own (``support/sharded_torchrun_child.py``), so no compiler
thread lives in this one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from support import torchrun as launch
from support.compiled_runs import NO_COMPILER
from support.sharded_torchrun_child import (
    DYING_POINT,
    PAUSE,
    POINT_EVERY,
    POINT_STEPS,
    RESUMED_POINT,
    STEPS,
)

from trainer_resume.testing import first_difference

RANKS = (0, 1)


def torchrun(job: str, out: Path, *, signal_when_ready: bool = False, fails: bool = False) -> str:
    """Run ``sharded_torchrun_child JOB OUT`` under ``torchrun`` on 2 ranks; its output.

    ``signal_when_ready``: once rank 0 prints ``READY``, SIGTERM the job's process group
    (torchrun and its ranks, as a batch scheduler does); a job that ends without it (no
    compiler here, or a failure) is taken as it ended.
    """
    code, output = launch.run_signalled(
        launch.command("support.sharded_torchrun_child", job, str(out)),
        launch.environment(),
        signal_when_ready=signal_when_ready,
    )
    text = output.decode(errors="replace")
    # After the SIGTERM torchrun re-raises it (exit 1) once its ranks exited.
    signalled = launch.READY in output and signal_when_ready
    if fails:  # a rank was killed: torchrun stops the others and fails
        assert code not in (0, None), text[-4000:]
    else:
        assert code == (1 if signalled else 0), text[-4000:]
    return text


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharded_torchrun")
    torchrun("pause", out, signal_when_ready=True)
    if (out / NO_COMPILER).exists():
        pytest.skip((out / NO_COMPILER).read_text())
    torchrun("resume", out)
    return {
        job: [torch.load(out / f"{job}-rank{rank}.pt", weights_only=True) for rank in RANKS]
        for job in ("pause", "resume")
    }


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


@pytest.mark.slow
def test_compiled_blocks_paused_by_sigterm_resume_in_a_new_torchrun_bitwise_equal(compiled):
    for rank in RANKS:
        paused, resumed = compiled["pause"][rank], compiled["resume"][rank]
        assert paused["paused_at"] == PAUSE
        _assert_same(paused["at_pause"], resumed["at_resume"], f"rank {rank} right after resume")
        _assert_same(paused["uninterrupted"], resumed["end"], f"rank {rank} at step {STEPS}")


@pytest.mark.slow
def test_a_pause_of_compiled_blocks_resumes_into_eager_blocks_with_the_paused_state(compiled):
    for rank in RANKS:
        _assert_same(
            compiled["pause"][rank]["at_pause"],
            compiled["resume"][rank]["eager_at_resume"],
            f"rank {rank}, eager, right after resume",
        )


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharded_points")
    torchrun("points", out, fails=True)
    left = sorted(os.listdir(out / "points"))
    torchrun("latest", out)
    return {
        "left": left,
        **{
            job: [torch.load(out / f"{job}-rank{rank}.pt", weights_only=True) for rank in RANKS]
            for job in ("points", "latest")
        },
    }


@pytest.mark.slow
def test_a_rank_killed_writing_a_point_leaves_it_incomplete_and_the_earlier_ones_committed(
    points,
):
    assert f"point-{DYING_POINT:012d}.sharded" in points["left"]
    for steps in range(POINT_EVERY, DYING_POINT, POINT_EVERY):
        assert f"point-{steps:012d}.sharded" in points["left"]


@pytest.mark.slow
def test_resume_latest_in_a_new_torchrun_continues_bitwise_from_the_newest_committed_point(
    points,
):
    for rank in RANKS:
        reference, resumed = points["points"][rank], points["latest"][rank]
        assert resumed["resumed_from"].endswith(f"point-{RESUMED_POINT:012d}.sharded")
        _assert_same(reference["at_resumed_point"], resumed["at_resume"], f"rank {rank} at resume")
        _assert_same(reference["uninterrupted"], resumed["end"], f"rank {rank} at the end")


@pytest.mark.slow
def test_points_are_removed_only_for_newer_committed_ones_keeping_two(points):
    expected = [(POINT_STEPS - POINT_EVERY, True), (POINT_STEPS, True)]
    assert points["latest"][0]["points"] == expected


def test_each_rank_resumes_its_own_batchnorm_statistics_of_a_sharded_model(tmp_path: Path) -> None:
    # FSDP2 leaves buffers unsharded, one per rank; DCP writes a plain tensor once, so
    # every rank resumed one rank's statistics (a silent difference on the other).
    done = launch.run(
        launch.command("support.fsdp_buffers_child", str(tmp_path)), launch.environment()
    )
    assert done.returncode == 0, done.stdout[-4000:]
    results = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=True) for rank in RANKS]
    assert not torch.equal(results[0]["at_pause"], results[1]["at_pause"])  # they differ
    for rank, result in zip(RANKS, results):
        assert torch.equal(result["after_resume"], result["at_pause"]), rank
        assert all(torch.equal(a, b) for a, b in zip(result["expected"], result["losses"])), rank
        difference = first_difference(result["reference"], result["resumed"])
        assert difference is None, (rank, difference)
