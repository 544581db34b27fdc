"""A trainer fed by DALI pipelines, paused and resumed in a new process, is bit-identical.

The loop is the usual one, with its epoch-end work (a per-epoch scheduler step and a
validation drawing random numbers) after the inner loop. One child process runs every
case uninterrupted and then paused at each point (mid-epoch and at an epoch's last
batch, for each last_batch_policy, an external source and a reader with
shuffle_after_epoch=True; by SIGTERM, or by request_pause with pause_if_requested()
after the epoch-end work); a second one resumes every pause file. Every remaining
batch, loss, epoch number, epoch-end result, the model, the optimizer and the scheduler
are compared with ``torch.equal`` to the uninterrupted run.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip(
    "nvidia.dali.plugin.pytorch",
    reason="NVIDIA DALI cannot be imported here (pip install 'trainer-resume[dali]')",
)

import nvidia.dali  # noqa: E402
from support import dali_child, dali_runs  # noqa: E402
from support import lightning_procs as procs  # noqa: E402

from trainer_resume import load_checkpoint  # noqa: E402
from trainer_resume.cli import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dali")
    outcome = []
    for mode in ("pause", "resume"):
        log = workdir / f"{mode}.log"
        done = procs.run(procs.child_command(mode, workdir, child="support.dali_child"), log)
        assert done.returncode == 0 and "DONE" in done.stdout, procs.describe_failure(done, log)
        outcome.append(torch.load(workdir / f"{mode}.pt", weights_only=False))
    return tuple(outcome)


def _ends_an_epoch(reference: dict, step: int) -> bool:
    epochs = [seen["epoch"] for seen in reference["seen"]]
    return epochs[step] != epochs[step - 1]


CASES = [
    pytest.param(loop, kind, policy, step, id=f"{loop}-{kind}-{policy}-{step}")
    for loop, cases in dali_child.LOOPS.items()
    for kind, policy, points in cases
    for step in points
]


@pytest.mark.parametrize(("loop", "kind", "policy", "step"), CASES)
def test_a_pause_resumed_in_a_new_process_continues_bit_identically(runs, loop, kind, policy, step):
    paused, resumed = runs
    reference = paused[(kind, policy)]
    before = paused[(loop, kind, policy, step)]
    after = resumed[(loop, kind, policy, step)]
    what = f"{loop} loop, {kind} {policy} asked to pause in step {step}"
    # At an epoch's last batch the plain loop's pause lands after the epoch-end work, when
    # the next epoch's first step ends; pause_if_requested() lands it right after that work.
    landed = step + 1 if loop == "step" and _ends_an_epoch(reference, step) else step
    assert before["completed_steps"] == landed, what
    dali_runs.assert_same(reference["seen"][:landed], before["seen"], f"{what} (before the pause)")
    # After an epoch's last batch the first pass reads the next epoch (no empty pass).
    assert after["epoch_at_resume"] == reference["seen"][landed]["epoch"], what
    dali_runs.assert_same(reference["seen"][landed:], after["seen"], what)
    # Every epoch's end work ran once, before the pause or after the resume.
    dali_runs.assert_same(reference["ends"], before["ends"] + after["ends"], f"{what}: epoch ends")
    for name in ("model", "optimizer", "scheduler"):
        dali_runs.assert_same(reference[name], after[name], f"{what}: {name}")


def test_the_pause_points_include_each_epochs_last_batch_and_later_epochs(runs):
    # The cases above would prove less if no pause fell on an epoch's last batch.
    paused, _ = runs
    for cases in dali_child.LOOPS.values():
        for kind, policy, points in cases:
            reference = paused[(kind, policy)]
            assert reference["seen"][-1]["epoch"] == dali_child.dali_runs.EPOCHS - 1
            assert any(_ends_an_epoch(reference, step) for step in points), (kind, policy)


def test_shuffle_after_epoch_reads_every_epoch_in_a_new_order(runs):
    paused, _ = runs
    seen = paused[("shuffle_after_epoch", "PARTIAL")]["seen"]
    orders = [
        torch.cat([s["batch"]["images"][:, 0, 0, 0] for s in seen if s["epoch"] == e])
        for e in range(dali_child.dali_runs.EPOCHS)
    ]
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])


def test_inspect_shows_the_dali_pipelines_and_their_checkpoint_sizes(runs, capsys):
    paused, _ = runs
    # Written by pause_if_requested() after epoch 0's end work: DALI's reset() is still due.
    path = paused[("epoch_end", "file", "PARTIAL", 6)]["path"]
    saved = load_checkpoint(path)["loaders"]["train"]["checkpoints"]
    assert len(saved) == 1
    assert main(["inspect", path]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train")]
    assert lines[0].split() == ["train", "?", "epoch", "1", "0", "batches", "0", "1"]
    assert lines[1] == (
        f"train: DALI {nvidia.dali.__version__}, 1 pipeline(s), checkpoints "
        f"{saved[0].numel():,} B; DALI's reset() is due before the next batch"
    )
    assert main(["inspect", path, "--json"]) == 0
    position = json.loads(capsys.readouterr().out)["loaders"]["train"]
    assert position["dali"] == {
        "version": nvidia.dali.__version__,
        "pipelines": 1,
        "checkpoint_bytes": [saved[0].numel()],
        "pending_reset": True,
    }
    assert (position["epoch"], position["delivered_batches"]) == (1, 0)
