"""Two ranks (gloo, CPU, DDP), each reading its shard through DALI, pause and resume exactly.

One launch runs the uninterrupted 2-rank run and the paused ones (rank 1 asks for the
pause: mid-epoch, and at an epoch's last batch, where it lands after the epoch-end
work); a second launch resumes each pause file in new processes. Every rank's batches,
losses, epoch-end results, model, optimizer and scheduler are compared with
``torch.equal`` to the uninterrupted run. Resuming the 2-rank pause with one process
is refused before anything changes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "nvidia.dali.plugin.pytorch",
    reason="NVIDIA DALI cannot be imported here (pip install 'trainer-resume[dali]')",
)

from support import dali_runs, dali_workers  # noqa: E402
from support.ddp_workers import describe_exits, launch, load_results  # noqa: E402

from trainer_resume.errors import ResumeStateMismatchError  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = 2
EPOCHS = 2
# Shards of 11 images, batches of 4: epochs of 3 steps. Rank 1 asks during these steps.
PAUSES = {"mid-epoch": 2, "epoch-end": 3}
LANDS = {"mid-epoch": 2, "epoch-end": 4}  # at an epoch's end: after the next epoch's first step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dali_ranks")
    root = dali_runs.write_images(out / "images")
    results = {}
    for mode in ("pause", "resume"):
        job = {"tag": mode, "mode": mode, "root": root, "pauses": PAUSES, "epochs": EPOCHS}
        codes = launch(WORLD, job, out, main=dali_workers.rank_main)
        assert codes == [0] * WORLD, describe_exits(codes, mode, out)
        results[mode] = load_results(WORLD, mode, out)
    return {"out": out, "root": root, **results}


@pytest.mark.parametrize("name", list(PAUSES))
def test_each_rank_resumes_its_dali_shard_in_new_processes_bit_identically(runs, name):
    references = [result["reference"] for result in runs["pause"]]
    # The ranks read different shards (else this would not test sharding).
    assert not torch.equal(
        references[0]["seen"][0]["batch"]["images"], references[1]["seen"][0]["batch"]["images"]
    )
    for rank in range(WORLD):
        reference = references[rank]
        epochs = [seen["epoch"] for seen in reference["seen"]]
        assert epochs == [0, 0, 0, 1, 1, 1], f"rank {rank}: step 3 ends epoch 0"
        before, after = runs["pause"][rank][name], runs["resume"][rank][name]
        what = f"rank {rank}, {name}"
        landed = LANDS[name]
        assert before["completed_steps"] == landed, what
        assert after["epoch_at_resume"] == reference["seen"][landed]["epoch"], what
        dali_runs.assert_same(reference["seen"], before["seen"] + after["seen"], f"{what}: batches")
        dali_runs.assert_same(
            reference["ends"], before["ends"] + after["ends"], f"{what}: epoch ends"
        )
        for part in ("model", "optimizer", "scheduler"):
            dali_runs.assert_same(reference[part], after[part], f"{what}: {part}")


def test_a_two_rank_dali_pause_resumed_by_one_process_is_refused_before_anything_changes(runs):
    trainer = dali_runs.DALITrainer(dali_runs.make_iterator("file", runs["root"]))
    with pytest.raises(ResumeStateMismatchError) as caught:
        trainer.resume(dali_workers.pause_file(runs["out"], "mid-epoch"))
    assert caught.value.code == 330
    message = str(caught.value)
    assert "was paused with 2 rank(s) and cannot be redistributed over 1" in message, message
    assert message.endswith("resume with 2 rank(s)"), message
    assert trainer.completed_steps == 0
    refused = dali_runs.finished(trainer, *dali_runs.train(trainer, epochs=1))
    # A trainer built the same way (its __init__ seeds torch) that was never asked to resume.
    untouched = dali_runs.DALITrainer(dali_runs.make_iterator("file", runs["root"]))
    dali_runs.assert_same(
        dali_runs.finished(untouched, *dali_runs.train(untouched, epochs=1)),
        refused,
        "after the refusal",
    )
