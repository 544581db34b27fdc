"""Sharded pauses of an FSDP2 (``fully_shard``) run with 2 gloo ranks on CPU, resumed anew.

One 2-rank run pauses to one directory after step ``FIRST``, pauses again after
``SECOND`` (the commit switches generations) and, pausing after ``KILLED``, loses rank
1 to SIGKILL while it writes its files. The reference is the same run uninterrupted.
"""

from __future__ import annotations

import collections
import os
import shutil
from typing import Any

import pytest
from support.ddp_workers import describe_exits, launch, load_results
from support.fsdp_workers import rank_main

from trainer_resume.durable import load_checkpoint
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

STEPS = 7
FIRST, SECOND, KILLED = 2, 3, 5
WORLD = 2


def _launch(world: int, job: dict[str, Any], out) -> list[int | None]:
    return launch(world, job, out, main=rank_main)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fsdp")
    pause = out / "pause"
    codes = _launch(WORLD, {"tag": "reference", "steps": STEPS, "snapshot_at": SECOND}, out)
    assert codes == [0, 0], describe_exits(codes, "reference", out)
    job = {
        "tag": "killed",
        "steps": STEPS,
        "requests": {FIRST: [str(pause), 1], SECOND: [str(pause), 0], KILLED: [str(pause), 1]},
        "continue_after_pause": True,
        "kill": [1, KILLED],
    }
    codes = _launch(WORLD, job, out)
    return {
        "out": out,
        "pause": pause,
        "codes": codes,
        "reference": load_results(WORLD, "reference", out),
    }


def _resume(runs: dict[str, Any], world: int, tag: str, **job: Any) -> list[dict[str, Any]]:
    out = runs["out"]
    codes = _launch(world, {"tag": tag, **job}, out)
    assert codes == [0] * world, describe_exits(codes, tag, out)
    return load_results(world, tag, out)


def _assert_equal(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def test_a_rank_killed_while_writing_leaves_the_previous_pause_committed_and_the_partial_one_unread(
    runs,
):
    report = describe_exits(runs["codes"], "killed", runs["out"])
    assert runs["codes"][1] == -9, report  # the victim died by SIGKILL
    assert runs["codes"][0] != 0, report  # the survivor did not finish the run
    manifest = load_checkpoint(runs["pause"] / "manifest.ckpt")
    assert manifest["completed_steps"] == SECOND
    generations = sorted(entry for entry in os.listdir(runs["pause"]) if entry.startswith("gen-"))
    # The first pause's generation went once the second committed; the partial one is left unnamed.
    assert [name.split("-")[1] for name in generations] == [str(SECOND), str(KILLED)]
    assert manifest["generation"].startswith(f"gen-{SECOND}-")


def test_same_world_size_resume_in_new_processes_is_bitwise_equal_to_the_uninterrupted_run(runs):
    resumed = _resume(runs, WORLD, "same", resume=str(runs["pause"]), steps=STEPS)
    for rank in range(WORLD):
        reference, after = runs["reference"][rank], resumed[rank]
        assert after["resumed_steps"] == SECOND and after["warnings"] == []
        # Local shards, loader, scheduler, extra state, step count and this rank's RNG.
        _assert_equal(reference["local"], after["local"], f"rank {rank} local state")
        _assert_equal(reference["full"], after["full"], f"rank {rank} gathered state")
        _assert_equal(reference["batches"][SECOND:], after["batches"], f"rank {rank} batches")


def test_resume_on_one_rank_reshards_the_state_and_consumes_exactly_the_uninterrupted_global_stream(
    runs,
):
    # Samples left after the pause: (STEPS - SECOND) * WORLD * 2 = 16 = 8 steps of 2 on one rank.
    [resumed] = _resume(runs, 1, "one", resume=str(runs["pause"]), more=8)
    reference = runs["reference"]
    for name in ("model", "optimizer"):
        _assert_equal(
            reference[0]["snapshot"][name], resumed["resumed_full"][name], f"resharded {name}"
        )
    before = collections.Counter(
        i for result in reference for step in result["ids"][:SECOND] for i in step
    )
    everything = collections.Counter(
        i for result in reference for step in result["ids"] for i in step
    )
    assert before + collections.Counter(i for step in resumed["ids"] for i in step) == everything
    assert resumed["resumed_steps"] == SECOND * WORLD
    assert len(resumed["warnings"]) == 1 and "sample-exact" in resumed["warnings"][0]


def test_a_tampered_shard_is_refused_on_every_rank_before_any_state_changes(runs, tmp_path):
    copy = tmp_path / "pause"
    shutil.copytree(runs["pause"], copy)
    generation = load_checkpoint(copy / "manifest.ckpt")["generation"]
    shard = copy / generation / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    results = _resume(runs, WORLD, "tampered", resume=str(copy), refusal=True)
    errors = [result["error"] for result in results]
    assert all(error.startswith("CheckpointCorruptedError: [322]") for error in errors), errors
    # The rank that verified the shard names it; the other says which rank refused.
    others = [error for error in errors if "refused on rank" in error]
    assert len(others) == 1, errors
    assert all("__1_0.distcp: BLAKE3 digest differs" in error for error in errors), errors
    assert all(result["unchanged"] and not result["locked"] for result in results)


def test_a_pause_inside_a_sharded_window_is_refused_on_one_rank_and_changes_nothing(runs):
    # Two micro-batches per optimizer step; the pause after step 3 is inside a window.
    out, pause = runs["out"], runs["out"] / "window_pause"
    job = {"tag": "window", "trainer": "window", "steps": 3, "requests": {3: [str(pause), 0]}}
    codes = _launch(WORLD, job, out)
    assert codes == [0, 0], describe_exits(codes, "window", out)
    [refused] = _resume(runs, 1, "window_one", trainer="window", resume=str(pause), refusal=True)
    assert refused["error"].startswith("ResumeStateMismatchError: [330]"), refused["error"]
    assert "inside a gradient-accumulation window of a sharded model" in refused["error"]
    assert refused["unchanged"] and not refused["locked"]
