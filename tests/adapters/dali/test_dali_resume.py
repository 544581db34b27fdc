"""A trainer fed by DALI pipelines, paused by SIGTERM and resumed in a new process, is bit-identical.

One child process runs every case uninterrupted and then paused at each point (mid-epoch
and at an epoch's last batch, for each last_batch_policy, an external source and a
reader with shuffle_after_epoch=True); a second one resumes every pause file. Every
remaining batch, loss, epoch number, the model and the optimizer are compared with
``torch.equal`` to the uninterrupted run.
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
from support import dali_child  # noqa: E402
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


def _assert_same_batches(expected: list[dict], got: list[dict], what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches instead of {len(expected)}"
    for number, (a, b) in enumerate(zip(expected, got)):
        assert a["epoch"] == b["epoch"], (
            f"{what}: batch {number} is in epoch {b['epoch']}, not {a['epoch']}"
        )
        assert a["batch"].keys() == b["batch"].keys()
        for name in a["batch"]:
            assert torch.equal(a["batch"][name], b["batch"][name]), f"{what}: batch {number} {name}"
        assert torch.equal(a["loss"], b["loss"]), f"{what}: loss {number}"


def _assert_same_state(expected, got, what: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(expected, got), what
    elif isinstance(expected, dict):
        assert expected.keys() == got.keys(), what
        for key in expected:
            _assert_same_state(expected[key], got[key], f"{what}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(got), what
        for index, (a, b) in enumerate(zip(expected, got)):
            _assert_same_state(a, b, f"{what}[{index}]")
    else:
        assert expected == got, what


CASES = [(kind, policy, step) for kind, policy, points in dali_child.CASES for step in points]


@pytest.mark.parametrize(("kind", "policy", "step"), CASES)
def test_a_sigterm_pause_resumed_in_a_new_process_continues_bit_identically(
    runs, kind, policy, step
):
    paused, resumed = runs
    reference = paused[(kind, policy, None)]
    before = paused[(kind, policy, step)]["seen"]
    after = resumed[(kind, policy, step)]
    what = f"{kind} {policy} paused after step {step}"
    _assert_same_batches(reference["seen"][:step], before, f"{what} (before the pause)")
    # After an epoch's last batch the first pass reads the next epoch (no empty pass).
    assert after["epoch_at_resume"] == reference["seen"][step]["epoch"], what
    _assert_same_batches(reference["seen"][step:], after["seen"], what)
    _assert_same_state(reference["model"], after["model"], f"{what}: model")
    _assert_same_state(reference["optimizer"], after["optimizer"], f"{what}: optimizer")


def test_the_pause_points_include_each_epochs_last_batch_and_later_epochs(runs):
    # The cases above would prove less if no pause fell on an epoch's last batch.
    paused, _ = runs
    for kind, policy, points in dali_child.CASES:
        epochs = [seen["epoch"] for seen in paused[(kind, policy, None)]["seen"]]
        assert epochs[-1] == dali_child.dali_runs.EPOCHS - 1, (kind, policy)
        last_batches = {k for k in range(1, len(epochs)) if epochs[k] != epochs[k - 1]}
        assert last_batches & set(points), (kind, policy, points)


def test_shuffle_after_epoch_reads_every_epoch_in_a_new_order(runs):
    paused, _ = runs
    seen = paused[("shuffle_after_epoch", "PARTIAL", None)]["seen"]
    orders = [
        torch.cat([s["batch"]["images"][:, 0, 0, 0] for s in seen if s["epoch"] == e])
        for e in range(dali_child.dali_runs.EPOCHS)
    ]
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])


def test_inspect_shows_the_dali_pipelines_and_their_checkpoint_sizes(runs, capsys):
    paused, _ = runs
    path = paused[("file", "PARTIAL", 6)]["path"]  # after epoch 0's last batch
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
