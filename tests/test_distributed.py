"""Collective pause/resume on torch.distributed (gloo, CPU, DDP-wrapped model).

The reference is an uninterrupted 2-rank run of ``STEPS`` steps. A second 2-rank run
pauses after step ``PAUSE`` (requested on rank 1 only: all ranks must agree) and
new processes resume it with 2, 1 or 3 ranks.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from support.ddp_workers import DDPTrainer, describe_exits, launch, load_results

from trainer_resume.distributed import DISTRIBUTED_KEY
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

STEPS = 9
PAUSE = 3
WORLD = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ddp")
    pause_file = out / "pause.pt"
    codes = launch(WORLD, {"tag": "reference", "steps": STEPS}, out)
    assert codes == [0, 0], describe_exits(codes, "reference", out)
    job = {"tag": "paused", "steps": STEPS, "requests": {PAUSE: [str(pause_file), 1]}}
    codes = launch(WORLD, job, out)
    assert codes == [0, 0], describe_exits(codes, "paused", out)
    return {
        "out": out,
        "pause_file": pause_file,
        "reference": load_results(WORLD, "reference", out),
        "paused": load_results(WORLD, "paused", out),
    }


def _resume(runs: dict[str, Any], world: int, tag: str, **job: Any) -> list[dict[str, Any]]:
    out = runs["out"]
    codes = launch(world, {"tag": tag, "resume": str(runs["pause_file"]), **job}, out)
    assert codes == [0] * world, describe_exits(codes, tag, out)
    return load_results(world, tag, out)


def _assert_equal(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _global_ids(results: list[dict[str, Any]]) -> collections.Counter:
    return collections.Counter(i for result in results for step in result["ids"] for i in step)


def test_a_pause_requested_on_one_rank_pauses_every_rank_at_the_same_step(runs):
    assert [result["paused_at"] for result in runs["paused"]] == [[PAUSE], [PAUSE]]
    checkpoint = load_checkpoint(runs["pause_file"])
    assert checkpoint["completed_steps"] == PAUSE
    assert checkpoint[DISTRIBUTED_KEY]["world_size"] == WORLD
    positions = [
        rank["loaders"]["train"]["sampler"]["consumed"]
        for rank in checkpoint[DISTRIBUTED_KEY]["ranks"]
    ]
    assert (
        positions == [PAUSE * WORLD * 2] * WORLD
    )  # the global position: k steps x W ranks x batch 2


def test_same_world_size_resume_in_new_processes_is_bitwise_equal_to_the_uninterrupted_run(
    runs,
):
    resumed = _resume(runs, WORLD, "same", steps=STEPS)
    for rank in range(WORLD):
        reference, before, after = (
            runs["reference"][rank],
            runs["paused"][rank],
            resumed[rank],
        )
        assert after["warnings"] == []
        _assert_equal(reference["model"], after["model"], f"rank {rank} model")
        _assert_equal(reference["optimizer"], after["optimizer"], f"rank {rank} optimizer")
        _assert_equal(
            reference["batches"],
            before["batches"] + after["batches"],
            f"rank {rank} batches",
        )


@pytest.mark.parametrize(("world", "more"), [(1, 12), (3, 4)])
def test_resume_with_another_world_size_consumes_exactly_the_uninterrupted_global_stream(
    runs, world, more
):
    # Samples left after the pause: (STEPS - PAUSE) * WORLD * 2 = 24 = world * more * 2.
    resumed = _resume(runs, world, f"world{world}", more=more)
    assert _global_ids(runs["paused"]) + _global_ids(resumed) == _global_ids(runs["reference"])
    converted = PAUSE * WORLD // world
    for result in resumed:
        assert result["resumed_steps"] == converted
        assert result["scheduler_last_epoch"] == converted + more
        assert len(result["warnings"]) == 1 and "sample-exact" in result["warnings"][0]


@pytest.mark.parametrize("victim", ["rank1-before-gather", "rank0-at-rename"])
def test_a_rank_killed_during_the_pause_leaves_the_previous_committed_pause(runs, tmp_path, victim):
    pause_file = tmp_path / "pause.pt"
    kill = [1, 2 * PAUSE, "state"] if victim.startswith("rank1") else [0, 2 * PAUSE, "replace"]
    job = {
        "tag": "kill",
        "steps": STEPS,
        "requests": {PAUSE: [str(pause_file), 1], 2 * PAUSE: [str(pause_file), 1]},
        "continue_after_pause": True,
        "kill": kill,
    }
    codes = launch(WORLD, job, tmp_path)
    report = describe_exits(codes, "kill", tmp_path)
    assert codes[kill[0]] == -9, report  # the victim died by SIGKILL
    assert codes[1 - kill[0]] != 0, report  # the survivor did not finish the run
    committed = load_checkpoint(pause_file)  # verified: the partial pause never replaced it
    first = load_checkpoint(runs["pause_file"])  # the same run's pause at PAUSE, from the fixture
    assert committed["completed_steps"] == PAUSE
    _assert_equal(first["objects"], committed["objects"], "objects")
    _assert_equal(first[DISTRIBUTED_KEY], committed[DISTRIBUTED_KEY], "per-rank states")


def test_rank_states_that_cannot_be_redistributed_fail_before_any_state_changes(runs, tmp_path):
    checkpoint = load_checkpoint(runs["pause_file"])
    checkpoint[DISTRIBUTED_KEY]["ranks"][1]["extra"] = {"marker": 2}  # rank-specific extra state
    mismatched = tmp_path / "mismatched.pt"
    save_checkpoint(checkpoint, mismatched)
    caller_rng = random_state()
    try:
        trainer = DDPTrainer()  # one process, no process group: world size 1 != 2
        before = {
            "model": {k: v.clone() for k, v in trainer.module.state_dict().items()},
            "loader": trainer.loader.state_dict(),
            "steps": trainer.completed_steps,
            "scheduler": trainer.scheduler.state_dict(),
            "rng": random_state(),
        }
        with pytest.raises(ResumeStateMismatchError, match="extra states differ"):
            trainer.resume(mismatched)
        after = {
            "model": trainer.module.state_dict(),
            "loader": trainer.loader.state_dict(),
            "steps": trainer.completed_steps,
            "scheduler": trainer.scheduler.state_dict(),
            "rng": random_state(),
        }
        _assert_equal(
            {k: v for k, v in before.items() if k != "scheduler"},
            {k: v for k, v in after.items() if k != "scheduler"},
            "state",
        )
        assert before["scheduler"]["last_epoch"] == after["scheduler"]["last_epoch"]
        assert not trainer.locked and not trainer.paused
        trainer.loader.close()
    finally:
        restore_random_state(caller_rng)


def test_a_config_value_per_rank_resumes_on_as_many_ranks_and_a_changed_one_is_refused(
    runs, tmp_path
):
    # As `device: cuda:${oc.env:LOCAL_RANK}` signs: each rank's own value, not rank 0's.
    pause_file = tmp_path / "pause.pt"
    per_rank = {str(rank): {"device": f"cpu:{rank}"} for rank in range(WORLD)}
    job = {
        "tag": "paused",
        "steps": STEPS,
        "requests": {PAUSE: [str(pause_file), 1]},
        "rank_config": per_rank,
    }
    codes = launch(WORLD, job, tmp_path)
    assert codes == [0, 0], describe_exits(codes, "paused", tmp_path)
    job = {"tag": "resumed", "steps": STEPS, "resume": str(pause_file), "rank_config": per_rank}
    codes = launch(WORLD, job, tmp_path)
    assert codes == [0, 0], describe_exits(codes, "resumed", tmp_path)
    for rank, (expected, actual) in enumerate(
        zip(runs["reference"], load_results(WORLD, "resumed", tmp_path))
    ):
        for record in ("model", "optimizer"):
            _assert_equal(expected[record], actual[record], f"rank {rank} {record}")

    # Rank 1's value changed to rank 0's: checked against rank 0's, it would pass.
    changed = {**per_rank, "1": {"device": "cpu:0"}}
    job = {"tag": "changed", "steps": STEPS, "resume": str(pause_file), "rank_config": changed}
    codes = launch(WORLD, job, tmp_path)
    assert codes[1] != 0, describe_exits(codes, "changed", tmp_path)
    error = (tmp_path / "error_changed_rank1.txt").read_text()
    assert "[323]" in error and "device: 'cpu:1' in the paused run, 'cpu:0' in this run" in error
