"""Resume points under torch.distributed (gloo, CPU, DDP-wrapped model).

All ranks take each point at the same step (also one asked for by ``checkpoint()`` on
rank 1 only), rank 0 writes it, and new processes continue from the newest point with
``resume_latest``, bit-identically to an uninterrupted run.
"""

from __future__ import annotations

import pytest
from support.ddp_workers import describe_exits, launch, load_results

from trainer_resume import load_checkpoint
from trainer_resume.distributed import DISTRIBUTED_KEY
from trainer_resume.resume_points.files import list_points
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

STEPS = 9
WORLD = 2
# Two ranks train 9 small steps: seconds on an idle machine,
# minutes on a saturated one; a hung collective still ends the run at this deadline.
LAUNCH_TIMEOUT_S = 300.0


def _run(world: int, job: dict, out) -> list[dict]:
    codes = launch(world, job, out, timeout=LAUNCH_TIMEOUT_S)
    assert codes == [0] * world, describe_exits(codes, job["tag"], out)
    return load_results(world, job["tag"], out)


def _assert_equal(expected, actual, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def test_ranks_take_points_together_and_resume_latest_continues_bit_identically(tmp_path):
    points = tmp_path / "points"
    reference = _run(WORLD, {"tag": "reference", "steps": STEPS}, tmp_path)
    crashed = _run(
        WORLD,
        {"tag": "points", "steps": 7, "points": [str(points), 3], "checkpoint": [5, 1]},
        tmp_path,
    )
    assert [steps for steps, _ in list_points(points)] == [3, 5, 6]
    newest = load_checkpoint(points / "point-000000000006.ckpt")
    assert newest[DISTRIBUTED_KEY]["world_size"] == WORLD
    for rank in range(WORLD):
        _assert_equal(
            reference[rank]["ids"][:7], crashed[rank]["ids"], f"rank {rank} batches with points"
        )

    resumed = _run(
        WORLD,
        {"tag": "latest", "steps": STEPS, "points": [str(points), 3], "resume_latest": True},
        tmp_path,
    )
    for rank in range(WORLD):
        assert resumed[rank]["resumed_steps"] == 6
        _assert_equal(
            reference[rank]["ids"][6:], resumed[rank]["ids"], f"rank {rank} batches after resume"
        )
        for name in ("model", "optimizer"):
            _assert_equal(reference[rank][name], resumed[rank][name], f"rank {rank} {name}")
