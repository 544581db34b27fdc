"""``trainer-resume audit-loader`` on small datasets (factories in ``_audit_datasets``)."""

from __future__ import annotations

import pytest
from _audit_datasets import BAD_ID, SIZE
from _cli import TESTS, run_cli

from trainer_resume.cli import main


def audit(factory: str, *options: str):
    # The audited module is imported from the current directory, as the help text promises.
    return run_cli("audit-loader", f"_audit_datasets:{factory}", *options, cwd=TESTS, timeout=120)


def rows_of(output: str, section: str) -> list[list[str]]:
    """The table rows printed under the header line that starts with ``section``."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        rows.append(line.split())
    return rows


def test_bad_shaped_sample_is_named_by_id_before_collation_and_fails():
    result = audit("bad_shape_dataset", "--workers", "0", "--epochs", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    violations = [line for line in result.stdout.splitlines() if "VIOLATION" in line]
    assert violations == [
        f"  VIOLATION sample id {BAD_ID} (index {BAD_ID}): field 'image' has shape [1, 16, 16], "
        f"expected [3, 16, 16] (like {SIZE - 1} of {SIZE} samples)"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_good_dataset_passes_and_prints_every_runs_throughput():
    result = audit("good_dataset", "--workers", "0,2", "--epochs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: ok" in result.stdout
    workers = rows_of(result.stdout, "workers:")
    assert workers[2] == ["2", "same", "same"]  # after the header and its underline
    epochs = rows_of(result.stdout, "epochs:")[2:]
    assert [row[:5] for row in epochs if row[0] != "order:"] == [
        [w, e, str(SIZE), "0", "0"] for w in ("0", "2") for e in ("1", "2")
    ]
    throughput = rows_of(result.stdout, "throughput:")
    assert "warm-up:" in throughput[0]  # the exclusion is stated above the table
    assert throughput[1][-2:] == ["warm-up", "excluded"]
    table = [row for row in throughput if row and row[0] in ("0", "2")]
    assert [row[0] for row in table] == ["0", "2"]
    for row in table:
        epoch_rates = [float(value) for value in row[1:3]]  # every epoch's figure, not only the best
        assert all(rate > 0 for rate in epoch_rates)
        assert row[3] != "n/a"


# The cases below run main() in-process: the console script's own start-up is covered above.


@pytest.mark.slow
def test_augmentation_from_worker_rng_is_reported_as_different_contents(capsys):
    assert main(["audit-loader", "_audit_datasets:noisy_dataset", "--workers", "2", "--epochs", "1"]) == 1
    output = capsys.readouterr().out
    assert "num_workers=0 added" in output
    assert rows_of(output, "workers:")[2][:3] == ["2", "same", "DIFFER"]


@pytest.mark.slow
def test_same_augmentation_under_resumable_loader_passes_for_every_worker_count(capsys):
    argv = ["audit-loader", "_audit_datasets:resumable_noisy_loader", "--workers", "0,2", "--epochs", "2"]
    assert main(argv) == 0
    output = capsys.readouterr().out
    assert rows_of(output, "workers:")[2] == ["2", "same", "same"]
    # Endless stream in batches of 5: 2 passes of 25 samples = windows of 24, 24 and 2.
    windows = [row[:5] for row in rows_of(output, "epochs:")[2:] if row[0] != "order:"]
    full, partial = [str(SIZE), "0", "0"], ["2", "0", "not"]  # "not checked (partial)"
    expected = ((1, full), (2, full), (3, partial))
    assert windows == [[workers, str(window), *counts] for workers in "02" for window, counts in expected]


def test_duplicates_and_gaps_in_an_epoch_are_named_by_id(capsys):
    assert main(["audit-loader", "_audit_datasets:repeating_loader", "--workers", "0", "--epochs", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  DUPLICATES num_workers=0 epoch 1: ids 3" in lines
    assert "  GAPS num_workers=0 epoch 1: ids never delivered 5" in lines


def test_samples_without_an_id_field_are_a_usage_error(capsys):
    assert main(["audit-loader", "_audit_datasets:tuple_samples", "--workers", "0"]) == 2
    assert capsys.readouterr().err == "error: samples must be mappings (dicts) with an 'id' field; got tuple\n"


def test_loader_factory_without_num_workers_parameter_is_a_usage_error(capsys):
    assert main(["audit-loader", "_audit_datasets:loader_without_workers_argument"]) == 2
    assert "takes no num_workers argument" in capsys.readouterr().err


def test_unknown_factory_is_a_usage_error_naming_it(capsys):
    assert main(["audit-loader", "_audit_datasets:no_such_factory"]) == 2
    assert capsys.readouterr().err == "error: module '_audit_datasets' has no attribute 'no_such_factory'\n"
