"""``trainer-resume audit-loader`` on small datasets (factories in ``support.audit_datasets``)."""

from __future__ import annotations

import pytest
from support.audit_datasets import BAD_ID, SIZE
from support.cli import TESTS, run_cli

from trainer_resume.cli import main


def audit(factory: str, *options: str):
    # The audited module is imported from the current directory, as the help text promises.
    return run_cli(
        "audit-loader", f"support.audit_datasets:{factory}", *options, cwd=TESTS, timeout=120
    )


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


def test_bad_shaped_sample_is_named_by_index_before_collation_and_fails():
    result = audit("bad_shape_dataset", "--workers", "0", "--epochs", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    violations = [line for line in result.stdout.splitlines() if "VIOLATION" in line]
    assert violations == [
        f"  VIOLATION sample index {BAD_ID}: field 'image' has shape [1, 16, 16], "
        f"expected [3, 16, 16] (like {SIZE - 1} of {SIZE} samples)"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_good_dataset_passes_and_prints_every_runs_throughput():
    result = audit("good_dataset", "--workers", "0,2", "--epochs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: ok" in result.stdout
    workers = rows_of(result.stdout, "workers:")
    assert workers[2] == ["2", "same", "same", "same"]  # after the header and its underline
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
        epoch_rates = [
            float(value) for value in row[1:3]
        ]  # every epoch's figure, not only the best
        assert all(rate > 0 for rate in epoch_rates)
        assert row[3] != "n/a"


# The cases below run main() in-process: the console script's own start-up is covered above.


@pytest.mark.slow
def test_augmentation_from_worker_rng_is_reported_as_different_contents(capsys):
    assert (
        main(
            [
                "audit-loader",
                "support.audit_datasets:noisy_dataset",
                "--workers",
                "2",
                "--epochs",
                "1",
            ]
        )
        == 1
    )
    output = capsys.readouterr().out
    assert "num_workers=0 added" in output
    assert rows_of(output, "workers:")[2][:3] == ["2", "same", "DIFFER"]
    assert "field 'image' differs" in output


@pytest.mark.slow
def test_same_augmentation_under_resumable_loader_passes_for_every_worker_count(capsys):
    argv = [
        "audit-loader",
        "support.audit_datasets:resumable_noisy_loader",
        "--workers",
        "0,2",
        "--epochs",
        "2",
    ]
    assert main(argv) == 0
    output = capsys.readouterr().out
    assert rows_of(output, "workers:")[2] == ["2", "same", "same", "same"]
    # Endless stream in batches of 5: 2 passes of 25 samples = windows of 24, 24 and 2.
    windows = [row[:5] for row in rows_of(output, "epochs:")[2:] if row[0] != "order:"]
    full, partial = [str(SIZE), "0", "0"], ["2", "0", "not"]  # "not checked (partial)"
    expected = ((1, full), (2, full), (3, partial))
    assert windows == [
        [workers, str(window), *counts] for workers in "02" for window, counts in expected
    ]


def test_duplicates_and_gaps_in_an_epoch_are_named_by_index(capsys):
    assert (
        main(
            [
                "audit-loader",
                "support.audit_datasets:repeating_loader",
                "--workers",
                "0",
                "--epochs",
                "1",
            ]
        )
        == 1
    )
    lines = capsys.readouterr().out.splitlines()
    assert "  DUPLICATES num_workers=0 epoch 1: indices 3" in lines
    assert "  GAPS num_workers=0 epoch 1: indices never delivered 5" in lines


@pytest.mark.slow
def test_tuple_samples_are_identified_by_index_and_compared_whole(capsys):
    assert (
        main(
            [
                "audit-loader",
                "support.audit_datasets:tuple_dataset",
                "--workers",
                "0,2",
                "--epochs",
                "2",
            ]
        )
        == 0
    )
    output = capsys.readouterr().out
    contract = rows_of(output, "contract:")
    assert [row[:4] for row in contract[2:5]] == [
        ["(sample)", "tuple", "-", "[2]"],
        ["[0]", "Tensor", "float32", "[3,"],
        ["[1]", "int", "-", "-"],
    ]
    assert "  global generators dataset[i] draws from: none" in output.splitlines()
    assert rows_of(output, "workers:")[2] == ["2", "same", "same", "same"]
    assert "result: ok" in output


@pytest.mark.slow
def test_augmented_tuple_samples_name_the_differing_element_and_the_worker_rng_cause(capsys):
    argv = [
        "audit-loader",
        "support.audit_datasets:noisy_tuple_dataset",
        "--workers",
        "2",
        "--epochs",
        "1",
    ]
    assert main(argv) == 1
    output = capsys.readouterr().out
    assert "  global generators dataset[i] draws from: torch" in output.splitlines()
    row = rows_of(output, "workers:")[2]
    assert (
        " ".join(row) == "2 same DIFFER at epoch 1, position 0 (index 0): field '[0]' differs same"
    )
    causes = output[output.index("known causes:") :]
    assert "samples: dataset[i] draws from the global generator(s) torch" in causes
    assert "ResumableDataLoader seeds every sample" in causes
    assert "order:" not in causes


@pytest.mark.slow
def test_shuffled_plain_loader_with_main_process_augmentation_explains_the_global_generator(capsys):
    argv = [
        "audit-loader",
        "support.audit_datasets:shuffled_noisy_tuple_loader",
        "--workers",
        "2",
        "--epochs",
        "2",
    ]
    assert main(argv) == 1
    output = capsys.readouterr().out
    order = rows_of(output, "workers:")[2]
    # The first epoch is shuffled from the same seed; num_workers=0 then augments in the main
    # process, drawing from the generator that shuffles the second epoch.
    assert order[:5] == ["2", "DIFFER", "at", "epoch", "2,"]
    causes = output[output.index("known causes:") :]
    assert "order: dataset[i] draws from torch's global generator" in causes
    assert "also seeds\n    the shuffle" in causes


def test_loader_factory_without_num_workers_parameter_is_a_usage_error(capsys):
    assert main(["audit-loader", "support.audit_datasets:loader_without_workers_argument"]) == 2
    assert "takes no num_workers argument" in capsys.readouterr().err


def test_an_empty_dataset_is_a_usage_error_not_a_pass(capsys):
    assert main(["audit-loader", "support.audit_datasets:empty_dataset"]) == 2
    assert capsys.readouterr().err == (
        "error: support.audit_datasets:empty_dataset gave an empty dataset (len 0): there is "
        "nothing to audit; return the dataset the training run reads\n"
    )


def test_unknown_factory_is_a_usage_error_naming_it(capsys):
    assert main(["audit-loader", "support.audit_datasets:no_such_factory"]) == 2
    assert (
        capsys.readouterr().err
        == "error: module 'support.audit_datasets' has no attribute 'no_such_factory'\n"
    )


def test_a_factory_that_is_not_callable_is_a_usage_error_naming_its_type(capsys):
    assert main(["audit-loader", "support.audit_datasets:SIZE"]) == 2
    assert (
        capsys.readouterr().err
        == "error: support.audit_datasets:SIZE is an int, not a callable factory\n"
    )
