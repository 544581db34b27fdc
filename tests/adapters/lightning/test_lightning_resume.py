"""A Lightning fit paused by a real SIGTERM and resumed in a fresh process equals an
uninterrupted fit bit for bit; plain Lightning does not.

Every run is a child process (``support/lightning_child.py``): a Dropout model, Adam, a
per-step LR schedule and a ResumableDataLoader with 2 workers and random
augmentation. The reference runs without ResumeCallback, so the callback must not
change training either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support import lightning_procs as procs

pytestmark = pytest.mark.slow

STEPS = 10
# name: (epoch_batches (0: one endless epoch, Lightning prefetches), pause step)
# (A pause in the middle of a later epoch is LOOP_SCENARIOS' epochs_of_the_drop_in_loader;
# one at an epoch's last batch, in a new process, is its epoch_end_validation_two_loaders_dictconfig,
# and at a later epoch's last batch test_lightning_pause_points.py's, in one process.)
SCENARIOS = {
    "mid_epoch_prefetching_loader": (0, 5),
}


def _options(epoch_batches: int, pause_step: int) -> list[str]:
    return [
        "--steps",
        str(STEPS),
        "--epoch-batches",
        str(epoch_batches),
        "--pause-step",
        str(pause_step),
    ]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[int, dict[str, Any]] = {}

    def reference(epoch_batches: int) -> dict[str, Any]:
        if epoch_batches not in cache:
            out = tmp_path_factory.mktemp(f"reference_{epoch_batches}")
            done = procs.run(
                procs.child_command("reference", out, *_options(epoch_batches, 0)),
                out / "stderr.txt",
            )
            assert done.returncode == 0, procs.describe_failure(done, out / "stderr.txt")
            cache[epoch_batches] = torch.load(out / "result_reference.pt", weights_only=True)
        return cache[epoch_batches]

    return reference


def _pause_then_resume(
    out: Path, mode: str, epoch_batches: int, pause_step: int
) -> tuple[dict, dict, int]:
    options = _options(epoch_batches, pause_step)
    return _pause_then_resume_with(out, mode, options, f"STEP {pause_step}")


def _pause_then_resume_with(
    out: Path, mode: str, options: list[str], line: str
) -> tuple[dict, dict, int]:
    status, lines = procs.run_and_signal(
        procs.child_command(mode, out, *options),
        out / f"stderr_{mode}.txt",
        line=line,
        signum=procs.SIGTERM,
    )
    written = out / f"result_{mode}.pt"
    assert written.is_file(), f"{mode} run wrote no result after SIGTERM: " + procs.describe_exit(
        status, lines, out / f"stderr_{mode}.txt"
    )
    first = torch.load(written, weights_only=True)
    second_mode = mode.replace("pause", "resume")
    done = procs.run(
        procs.child_command(second_mode, out, *options), out / f"stderr_{second_mode}.txt"
    )
    assert done.returncode == 0, procs.describe_failure(done, out / f"stderr_{second_mode}.txt")
    second = torch.load(out / f"result_{second_mode}.pt", weights_only=True)
    return first, second, status


def _assert_optimizer_states_equal(expected: dict, actual: dict) -> None:
    assert expected["state"].keys() == actual["state"].keys()
    for index, state in expected["state"].items():
        assert state.keys() == actual["state"][index].keys()
        for name, value in state.items():
            assert torch.equal(value, actual["state"][index][name]), (
                f"optimizer state {index}.{name}"
            )
    for group, other in zip(expected["param_groups"], actual["param_groups"]):
        assert group == other


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sigterm_pause_and_fresh_process_resume_equal_uninterrupted_fit(
    scenario: str, tmp_path: Path, references: Any
) -> None:
    epoch_batches, pause_step = SCENARIOS[scenario]
    reference = references(epoch_batches)

    paused, resumed, status = _pause_then_resume(tmp_path, "pause", epoch_batches, pause_step)

    assert status == 0
    # The resumed fit completed: the run is marked finished and its pause file retired.
    assert not (tmp_path / "pause.ckpt").exists() and (tmp_path / "pause.ckpt.finished").is_file()
    assert paused["paused_at_step"] == pause_step and paused["global_step"] == pause_step
    assert sorted(paused["losses"]) == list(range(1, pause_step + 1))
    assert sorted(resumed["losses"]) == list(range(pause_step + 1, STEPS + 1))
    losses = {**paused["losses"], **resumed["losses"]}
    for step in range(1, STEPS + 1):
        assert torch.equal(losses[step], reference["losses"][step]), f"loss of step {step}"
    assert reference["model"].keys() == resumed["model"].keys()
    for name, value in reference["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    _assert_optimizer_states_equal(reference["optimizer"], resumed["optimizer"])


def test_signal_is_sent_at_a_line_that_arrives_together_with_the_previous_one(
    tmp_path: Path,
) -> None:
    # Both lines in one write, as a busy parent reads them after a fast step; the
    # child exits 3 if no signal comes and 7 from its handler.
    child = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: os._exit(7))\n"
        "os.write(1, b'STEP 5\\nSTEP 6\\n')\n"
        "time.sleep(30)\n"
        "os._exit(3)\n"
    )

    status, lines = procs.run_and_signal(
        [procs.sys.executable, "-c", child],
        tmp_path / "stderr.txt",
        line="STEP 6",
        signum=procs.SIGTERM,
        timeout=60,
    )

    assert (status, lines) == (7, ["STEP 5", "STEP 6"])


def test_plain_lightning_checkpoint_resume_ends_with_different_weights(
    tmp_path: Path, references: Any
) -> None:
    epoch_batches, pause_step = SCENARIOS["mid_epoch_prefetching_loader"]
    reference = references(epoch_batches)

    stopped, resumed, _ = _pause_then_resume(tmp_path, "plain-pause", epoch_batches, pause_step)

    # Same run up to the stop: the difference comes from the resume alone.
    assert sorted(stopped["losses"]) == list(range(1, pause_step + 1))
    for step in range(1, pause_step + 1):
        assert torch.equal(stopped["losses"][step], reference["losses"][step])
    assert resumed["global_step"] == STEPS
    assert not torch.equal(resumed["losses"][pause_step + 1], reference["losses"][pause_step + 1])
    assert any(
        not torch.equal(value, resumed["model"][name]) for name, value in reference["model"].items()
    )


# name: (child options, the line after which SIGTERM is sent, the step the pause lands on)
LOOP_SCENARIOS: dict[str, tuple[list[str], str, int]] = {
    # 4 batches per epoch, validation after each; the pause on epoch 0's last batch.
    # Two train loaders (a dict) and OmegaConf hyper-parameters in the same run.
    "epoch_end_validation_two_loaders_dictconfig": (
        [
            "--steps",
            "8",
            "--epoch-batches",
            "4",
            "--validate",
            "--two-loaders",
            "--dictconfig",
            "--pause-step",
            "4",
        ],
        "STEP 4",
        4,
    ),
    # 6 batches per epoch (the bundled per-epoch batch sampler), validation at its middle
    # and end: the pause on the middle one; the resumed fit crosses into the next epoch.
    "val_check_interval_step": (
        [
            "--steps",
            "9",
            "--epoch-loader",
            "batch-sampler",
            "--validate",
            "--val-check-interval",
            "0.5",
            "--pause-step",
            "3",
        ],
        "STEP 3",
        3,
    ),
    # max_epochs=3 of the shuffled drop-in loader with 2 workers (6 batches per epoch),
    # the pause in the middle of the second epoch.
    "epochs_of_the_drop_in_loader": (
        ["--steps", "-1", "--max-epochs", "3", "--epoch-loader", "drop-in", "--pause-step", "8"],
        "STEP 8",
        8,
    ),
    # Accumulation over 2 batches; SIGTERM after batch 5 (mid-accumulation): the pause
    # is deferred to batch 6, the optimizer step 3.
    "mid_accumulation": (
        ["--steps", "5", "--epoch-batches", "4", "--accumulate", "2", "--pause-batch", "5"],
        "BATCH 5",
        3,
    ),
}


@pytest.fixture(scope="module")
def loop_references(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, dict[str, Any]] = {}

    def reference(scenario: str) -> dict[str, Any]:
        if scenario not in cache:
            out = tmp_path_factory.mktemp(f"reference_{scenario}")
            options, _, _ = LOOP_SCENARIOS[scenario]
            done = procs.run(procs.child_command("reference", out, *options), out / "stderr.txt")
            assert done.returncode == 0, procs.describe_failure(done, out / "stderr.txt")
            cache[scenario] = torch.load(out / "result_reference.pt", weights_only=True)
        return cache[scenario]

    return reference


def _assert_same_tensors(expected: dict[str, Any], actual: dict[str, Any], what: str) -> None:
    assert sorted(expected) == sorted(actual), what
    for key, value in expected.items():
        assert torch.equal(value, actual[key]), f"{what} {key}"


@pytest.mark.parametrize("scenario", list(LOOP_SCENARIOS))
def test_sigterm_pause_with_validation_accumulation_epochs_and_two_loaders_resumes_exactly(
    scenario: str, tmp_path: Path, loop_references: Any
) -> None:
    options, line, pause_step = LOOP_SCENARIOS[scenario]
    reference = loop_references(scenario)

    paused, resumed, status = _pause_then_resume_with(tmp_path, "pause", options, line)

    assert status == 0 and paused["paused_at_step"] == pause_step
    # Every training batch, and every validation batch (with its draw from the global
    # RNG), at the same place: the paused process ran no validation after the pause.
    trained = {**paused["batch_losses"], **resumed["batch_losses"]}
    _assert_same_tensors(reference["batch_losses"], trained, "training batch")
    assert not set(paused["batch_losses"]) & set(resumed["batch_losses"])
    validated = {**paused["val_losses"], **resumed["val_losses"]}
    _assert_same_tensors(reference["val_losses"], validated, "validation batch")
    assert not any(key.startswith(f"s{pause_step}b") for key in paused["val_losses"])
    if "--max-epochs" in options:
        epochs = int(options[options.index("--max-epochs") + 1])
        for losses in (reference["batch_losses"], trained):
            per_epoch = [sum(key.startswith(f"e{e}b") for key in losses) for e in range(epochs)]
            assert per_epoch == [6] * epochs
    _assert_same_tensors(reference["model"], resumed["model"], "weight")
    _assert_optimizer_states_equal(reference["optimizer"], resumed["optimizer"])
