"""Under ``torchrun --max-restarts 1``, a rank SIGKILLed mid-step costs exactly one restart:
the epoch loop with fork workers and resume points, ``resume_latest()`` at start, ends
bit-identical to an uninterrupted run, whichever rank was killed (rank 0 writes the points).

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch's default, the rendezvous store is
shared with the ranks' process group and gloo fails to connect again after any restart,
with or without this library (pytorch/pytorch#135712), as docs/distributed.md says.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from support import torchrun
from support.ddp_workers import SIZE
from support.elastic_child import BATCH, EPOCHS, POINT_EVERY, assert_same_final_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun, fork and SIGKILL"),
]

WORLD = 2
STEPS_PER_EPOCH = SIZE // (BATCH * WORLD)  # 6
KILL_STEP = 10  # mid-way through the second epoch (steps 7 to 12)
RESUMED_AT = KILL_STEP // POINT_EVERY * POINT_EVERY  # the newest point: step 8
TIMEOUT_S = 600.0  # bounds a hang: two generations of two ranks import torch
ENVIRONMENT = torchrun.environment(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def _torchrun(out: Path, *arguments: str, max_restarts: int) -> None:
    """Run the epoch-loop child under torchrun; asserts it exits 0."""
    command = torchrun.command(
        "support.elastic_child", str(out), *arguments, ranks=WORLD, max_restarts=max_restarts
    )
    log = out / "torchrun.txt"
    # Its own session, so that a timeout ends every process it started.
    with open(log, "wb") as output:
        process = torchrun.start(command, ENVIRONMENT, output)
        try:
            code = process.wait(timeout=TIMEOUT_S)
        finally:
            torchrun.kill_if_running(process)
    assert code == 0, log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    _torchrun(out, max_restarts=0)
    return out


@pytest.mark.parametrize("killed", [0, 1])
def test_a_rank_killed_mid_step_costs_one_restart_and_the_run_stays_bit_identical(
    reference: Path, tmp_path: Path, killed: int
) -> None:
    assert (KILL_STEP - 1) // STEPS_PER_EPOCH == 1 and KILL_STEP % POINT_EVERY != 0
    _torchrun(tmp_path, str(killed), str(KILL_STEP), max_restarts=1)
    ranks = range(WORLD)
    # Exactly one restart: two generations started, the second finished.
    assert sorted(path.name for path in tmp_path.glob("start_*")) == [
        f"start_a{attempt}_r{rank}.txt" for attempt in (0, 1) for rank in ranks
    ]
    assert sorted(path.name for path in tmp_path.glob("result_*")) == [
        f"result_a1_r{rank}.pt" for rank in ranks
    ]
    # The other rank's SIGTERM from torchrun was no pause: a pause needs every rank.
    assert not (tmp_path / "points" / "pause.ckpt").exists()
    last = EPOCHS * STEPS_PER_EPOCH
    for rank in ranks:
        assert (tmp_path / f"start_a1_r{rank}.txt").read_text() == str(RESUMED_AT)
        expected = torch.load(reference / f"losses_a0_r{rank}.pt")
        assert sorted(expected) == list(range(1, last + 1))
        killed_run = torch.load(tmp_path / f"losses_a0_r{rank}.pt")
        restarted = torch.load(tmp_path / f"losses_a1_r{rank}.pt")
        assert sorted(killed_run) == list(range(1, KILL_STEP))  # killed inside step 10
        assert sorted(restarted) == list(range(RESUMED_AT + 1, last + 1))
        for losses in (killed_run, restarted):  # bit for bit, the redone steps too
            assert losses == {step: expected[step] for step in losses}, f"rank {rank}"
        assert torch.load(tmp_path / f"result_a1_r{rank}.pt")["restarts"] == 1
        assert_same_final_state(
            reference / f"result_a0_r{rank}.pt", tmp_path / f"result_a1_r{rank}.pt"
        )
