"""``trainer-resume audit-loader`` on IterableDatasets: items identified by content, each
delivered exactly once across workers, and resumes checked against the uninterrupted run."""

from __future__ import annotations

import pytest
from support.audit_datasets import ItemStream

from trainer_resume.cli import main


def audit(capsys, factory: str, *options: str) -> tuple[int, str]:
    status = main(
        ["audit-loader", f"support.audit_datasets:{factory}", "--batch-size", "4", *options]
    )
    return status, capsys.readouterr().out


def rows_of(output: str, section: str) -> list[list[str]]:
    """The rows of the table under the line that starts with ``section``: the lines after
    its underline, up to a blank line, less the notes (``ok: ...``, ``order: ...``)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    underline = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("---"))
    rows = []
    for line in lines[underline + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        if not cells[0].endswith(":") and not line.startswith("   "):
            rows.append(cells)
    return rows


def test_a_stateful_stream_is_read_whole_and_every_resume_matches_the_uninterrupted_run(capsys):
    status, output = audit(capsys, "item_stream", "--workers", "0", "--epochs", "2")
    assert status == 0, output
    assert (
        "  factory returned an IterableDataset; the audit loads it with "
        "ResumableDataLoader(batch_size=4, resumable=True), no collation"
    ) in output.splitlines()
    assert [row[:2] for row in rows_of(output, "contract:")[:2]] == [
        ["id", "int"],
        ["image", "Tensor"],
    ]
    batches = -(-ItemStream.ITEMS // 4)  # 8 per pass
    assert rows_of(output, "resume:") == [
        ["0", "1", str(2 * batches - 1), "same"],
        ["0", "4", str(2 * batches - 4), "same"],
        ["0", "8", "(end", "of", "pass", "1)", str(batches), "same"],
    ]
    assert output.rstrip().endswith("result: ok")


def test_a_state_that_does_not_hold_the_position_is_caught_by_the_resume_check(capsys):
    status, output = audit(capsys, "forgetful_stream", "--workers", "0", "--epochs", "2")
    assert status == 1
    assert [" ".join(row) for row in rows_of(output, "resume:")] == [
        "0 1 15 DIFFER: batch 2 differs",
        "0 4 12 DIFFER: batch 5 differs",
        "0 8 (end of pass 1) 8 same",  # a pass that has ended starts over anyway
    ]
    assert "result: 2 problem(s) found" in output


def test_a_stream_without_a_state_is_read_and_its_refusal_is_the_finding(capsys):
    status, output = audit(capsys, "plain_items", "--workers", "0", "--epochs", "1")
    assert status == 1
    assert "the audit loads it with DataLoader(batch_size=4), no collation" in output
    resume = next(line for line in output.splitlines() if line.startswith("resume:"))
    assert resume.startswith("resume: not checked: ResumableDataLoader refuses the dataset: [332] ")
    assert "PlainItems is an IterableDataset without state_dict() and load_state_dict()" in resume
    assert "result: 1 problem(s) found" in output


@pytest.mark.slow
def test_two_workers_that_shard_the_stream_deliver_each_item_once_and_resume_exactly(capsys):
    status, output = audit(capsys, "noisy_item_stream", "--workers", "0,2", "--epochs", "2")
    assert status == 0, output
    assert "  global generators the items draw from: torch" in output.splitlines()
    assert "the items draw from the global generator(s) torch" in output  # counts only
    assert rows_of(output, "workers:") == [["2", "30,", "30", "exactly", "once"]]
    resumes = rows_of(output, "resume:")
    assert [row[0] for row in resumes] == ["0"] * 3 + ["2"] * 3
    assert all(row[-1] == "same" for row in resumes)


@pytest.mark.slow
def test_workers_that_each_read_the_whole_stream_are_named_with_the_extra_items(capsys):
    status, output = audit(capsys, "unsharded_item_stream", "--workers", "2", "--epochs", "1")
    assert status == 1
    assert "num_workers=0 added" in output
    assert " ".join(rows_of(output, "workers:")[0]) == (
        "2 60 DIFFER at pass 1: 30 extra, 0 missing"
    )
    assert "a worker that does not shard the stream" in output
