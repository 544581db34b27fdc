"""A sharded pause under attack and under failing disks, with 2 gloo ranks in one launch.

Unsigned pauses are the case: whoever can write the directory can recompute every
digest of the manifest. What must hold anyway: no pickled code runs on any rank,
every refusal is a catalogue error on every rank, and no rank's state changes (no
partial restore). The scenarios run in ``support.sharded_attacks``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from support.ddp_workers import describe_exits, launch, load_results
from support.sharded_attacks import PAUSED_AT, rank_main

from trainer_resume.durable import load_checkpoint
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

WORLD = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("attacks")
    work = out / "work"
    work.mkdir()
    codes = launch(WORLD, {"tag": "attacks", "directory": str(work)}, out, main=rank_main)
    assert codes == [0] * WORLD, describe_exits(codes, "attacks", out)
    return {"work": work, "results": load_results(WORLD, "attacks", out)}


def _errors(runs: dict[str, Any], scenario: str) -> list[str]:
    records = [result[scenario] for result in runs["results"]]
    for rank, record in enumerate(records):
        assert record["unchanged"], f"rank {rank} changed: {record}"
        assert not record["locked"], f"rank {rank} is locked: {record}"
    return [record["error"] for record in records]


def test_a_pause_written_by_this_version_resumes_through_the_allowlisted_reader(runs):
    for rank, result in enumerate(runs["results"]):
        difference = first_difference(result["paused"], result["resumed"])
        assert difference is None, f"rank {rank}: {difference.describe()}"


@pytest.mark.parametrize("scenario", ["metadata_payload", "byte_entry_payload"])
def test_a_pickled_payload_in_an_unsigned_pause_runs_on_no_rank_and_is_refused(runs, scenario):
    errors = _errors(runs, scenario)
    assert not (runs["work"] / f"{scenario}.ran").exists()
    if scenario == "metadata_payload":
        refused = "dcp/.metadata: global builtins.exec is not part of DCP's metadata"
    else:
        refused = (
            "reading the shards failed on rank 0: DCP byte entry "
            "optimizers.model.param_groups.0.lr: Unsupported global: GLOBAL exec was not an "
            "allowed global by default; nothing was restored"
        )
    for error in errors:
        assert error.startswith("UnsafeCheckpointError: [328] "), errors
        assert error.endswith(refused), errors


def test_a_shard_rewritten_after_verification_is_refused_on_every_rank_with_nothing_restored(runs):
    errors = _errors(runs, "shard_rewritten_after_verification")
    for error in errors:
        assert error.startswith("CheckpointCorruptedError: [322] "), errors
        # Both ranks read from rank 1's file (it holds some of rank 0's entries too).
        assert "reading the shards failed on rank " in error, errors
        assert error.endswith(
            "__1_0.distcp: BLAKE3 digest differs from the manifest; nothing was restored"
        ), errors


@pytest.mark.parametrize(
    ("scenario", "missing"),
    [
        ("shard_left_out_of_manifest", "names dcp/__1_0.distcp, which the manifest does not list"),
        ("rank_file_deleted", "rank-1.ckpt is missing"),
        ("metadata_deleted", "dcp/.metadata is missing"),
    ],
)
def test_a_file_missing_from_the_pause_or_its_manifest_is_refused_on_every_rank(
    runs, scenario, missing
):
    errors = _errors(runs, scenario)
    for error in errors:
        assert error.startswith("CheckpointCorruptedError: [322] "), errors
        assert missing in error, errors


def test_a_full_disk_while_shards_are_written_fails_the_pause_on_every_rank_with_327(runs):
    errors = _errors(runs, "full_disk")
    for error in errors:
        assert error.startswith("CheckpointWriteError: [327] "), errors
        assert "writing the shards failed on rank 1 (OSError: [Errno 28] " in error, errors
        assert error.endswith("the previous pause is intact"), errors
    assert not any(result["full_disk"]["paused"] for result in runs["results"])
    pause = runs["work"] / "pause"
    manifest = load_checkpoint(pause / "manifest.ckpt")
    assert manifest["completed_steps"] == PAUSED_AT
    assert os.path.isdir(pause / manifest["generation"])
