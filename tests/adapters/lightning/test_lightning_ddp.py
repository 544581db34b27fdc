"""Lightning ``strategy="ddp"`` on 2 CPU processes: a fit paused by a real SIGTERM (sent to
rank 0 only) and resumed in fresh processes equals an uninterrupted fit bit for bit, on
both ranks.

``strategy="ddp"`` on CPU starts rank 1 through Lightning's subprocess launcher (the
child script runs again with the rank in its environment). The loader is a
``ResumableDataLoader`` whose ``InfiniteRandomSampler`` shards the global stream by
the process group (``use_distributed_sampler=False``); Lightning saves rank 0's loader
state only, which holds the global position every rank resumes from.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import lightning_procs as procs

from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

STEPS = 8
PAUSE = 3
OPTIONS = ["--steps", str(STEPS), "--pause-step", str(PAUSE)]


def _command(mode: str, out: Path) -> list[str]:
    return procs.child_command(mode, out, *OPTIONS, child="support.lightning_ddp_child")


def _results(out: Path, mode: str) -> list[dict]:
    return [
        torch.load(out / f"result_{mode}_rank{rank}.pt", weights_only=True) for rank in range(2)
    ]


def _assert_equal(expected, actual, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def test_ddp_fit_paused_by_sigterm_on_rank_0_resumes_bitwise_equal_on_both_ranks(
    tmp_path,
):
    reference = procs.run(_command("reference", tmp_path), tmp_path / "stderr_reference.txt")
    assert reference.returncode == 0, procs.describe_failure(
        reference, tmp_path / "stderr_reference.txt"
    )
    status, _ = procs.run_and_signal(
        _command("pause", tmp_path),
        tmp_path / "stderr_pause.txt",
        line=f"STEP {PAUSE}",
        signum=procs.SIGTERM,
    )
    assert status == 0, (tmp_path / "stderr_pause.txt").read_text()[-3000:]
    resumed = procs.run(_command("resume", tmp_path), tmp_path / "stderr_resume.txt")
    assert resumed.returncode == 0, procs.describe_failure(resumed, tmp_path / "stderr_resume.txt")
    expected, paused, after = (
        _results(tmp_path, "reference"),
        _results(tmp_path, "pause"),
        _results(tmp_path, "resume"),
    )
    for rank in range(2):
        assert paused[rank]["paused_at_step"] == PAUSE
        assert sorted(paused[rank]["losses"]) == list(range(1, PAUSE + 1))
        assert sorted(after[rank]["losses"]) == list(range(PAUSE + 1, STEPS + 1))
        _assert_equal(
            expected[rank]["losses"],
            {**paused[rank]["losses"], **after[rank]["losses"]},
            f"rank {rank} losses",
        )
        _assert_equal(expected[rank]["model"], after[rank]["model"], f"rank {rank} model")
        _assert_equal(
            expected[rank]["optimizer"],
            after[rank]["optimizer"],
            f"rank {rank} optimizer",
        )
    # The ranks saw different data: the stream was sharded, not replicated.
    assert not torch.equal(expected[0]["losses"][1], expected[1]["losses"][1])


EPOCH_BATCHES = 4  # per rank: 16 samples, batch size 2, 2 ranks
EPOCHS = 2


def test_ddp_fit_paused_at_an_epochs_last_batch_trains_the_next_epoch_on_the_uninterrupted_batches(
    tmp_path,
):
    # Lightning's own DistributedSampler, its epoch set by the fit loop: the resumed fit
    # makes its train iterator before the loop sets the next epoch.
    pause_step = EPOCH_BATCHES  # epoch 0's last batch
    options = ["--epochs", str(EPOCHS), "--pause-step", str(pause_step)]
    for mode in ("reference", "pause", "resume"):
        command = procs.child_command(mode, tmp_path, *options, child="support.lightning_ddp_child")
        log = tmp_path / f"stderr_{mode}.txt"
        run = procs.run(command, log)
        assert run.returncode == 0, procs.describe_failure(run, log)
    expected, paused, after = (
        _results(tmp_path, "reference"),
        _results(tmp_path, "pause"),
        _results(tmp_path, "resume"),
    )
    for rank in range(2):
        assert paused[rank]["paused_at_step"] == pause_step  # at the epoch's last batch itself
        assert sorted(after[rank]["batch_losses"]) == [
            f"e1b{batch}" for batch in range(EPOCH_BATCHES)
        ]
        assert {"end/train_mean", "end/train_rank_max", "e1/train_mean"} <= set(
            expected[rank]["epoch_metrics"]
        )
        for record in ("batch_losses", "val_losses", "epoch_metrics"):
            _assert_equal(
                expected[rank][record],
                {**paused[rank][record], **after[rank][record]},
                f"rank {rank} {record}",
            )
        _assert_equal(expected[rank]["model"], after[rank]["model"], f"rank {rank} model")
        _assert_equal(
            expected[rank]["optimizer"], after[rank]["optimizer"], f"rank {rank} optimizer"
        )
    # The ranks read different shards of each epoch; epoch-level means are synced over them.
    assert torch.equal(
        expected[0]["epoch_metrics"]["end/train_mean"],
        expected[1]["epoch_metrics"]["end/train_mean"],
    )
    assert not torch.equal(expected[0]["batch_losses"]["e1b0"], expected[1]["batch_losses"]["e1b0"])
