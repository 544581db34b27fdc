"""ResumableTrainer, SIGTERM to the process group and the same command again: the resumed
run trains what an uninterrupted run trains, micro-batch by micro-batch.

Two child processes serve every case (transformers takes seconds to import): the
first runs, per variant, the uninterrupted ``ResumableTrainer`` and one run per
signal, each a fresh trainer that sends SIGTERM to its own process group during a
chosen micro-batch and pauses; the second resumes each pause file with a fresh
trainer, as a new command would, trains to the end, and runs once more (which must
say the run is finished).

The variants cover every pair of {random MLM collator, random ``__getitem__``} x
{0, 2 workers} x {accumulation 1, 2}, plus an epoch of 11 batches with accumulation
2 (its last window holds one batch); each is signalled mid-epoch, during its first
epoch's last step and in its second epoch (mid-window where accumulating), and one
during the evaluation at its first epoch's end, whose loader has workers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import lightning_procs as procs
from support.hf_runs import variant, variant_name

from trainer_resume.difference import first_difference

pytestmark = pytest.mark.slow

# (variant, [(micro-batch signalled in, the step the pause lands after, where)])
CASES: list[tuple[dict[str, Any], list[tuple[int, int, str]]]] = [
    (
        variant("mlm", workers=0, accumulation=1),
        [(4, 5, "mid-epoch"), (11, 12, "epoch-last-step"), (16, 17, "second-epoch")],
    ),
    (
        variant("mlm", workers=2, accumulation=2),
        [(4, 3, "mid-epoch"), (10, 6, "epoch-last-step"), (14, 8, "second-epoch")],
    ),
    (
        # -1: during the evaluation at the first epoch's end, whose loader has 2 workers.
        variant("getitem", workers=2, accumulation=1),
        [
            (4, 5, "mid-epoch"),
            (11, 12, "epoch-last-step"),
            (16, 17, "second-epoch"),
            (-1, 12, "epoch-end-evaluation"),
        ],
    ),
    (
        variant("getitem", workers=0, accumulation=2),
        [(5, 3, "mid-epoch"), (10, 6, "epoch-last-step"), (15, 8, "second-epoch")],
    ),
    (
        # 11 batches: windows (0,1) ... (8,9), then batch 10 alone; epoch 2 from batch 11.
        variant("mlm", workers=2, accumulation=2, batches=11),
        [(4, 3, "mid-epoch"), (10, 6, "epoch-last-step"), (13, 8, "second-epoch")],
    ),
]
PLAN = [
    {"variant": settings, "reference": True, "signals": [micro for micro, _, _ in signals]}
    for settings, signals in CASES
]
SCENARIOS = [
    pytest.param(settings, micro, step, id=f"{variant_name(settings)}-{where}")
    for settings, signals in CASES
    for micro, step, where in signals
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_trainer")
    for mode in ("pause", "resume"):
        command = [sys.executable, "-m", "support.hf_child", mode, str(out), json.dumps(PLAN)]
        log = out / f"{mode}.log"
        done = procs.run(command, log)
        # Exit status 0: a paused train() returns normally, and the SIGTERM killed no worker.
        assert done.returncode == 0 and "DONE" in done.stdout, procs.describe_failure(done, log)
    return out


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def _records(out: Path, settings: dict[str, Any], micro: int) -> tuple[dict, dict, dict]:
    folder = out / variant_name(settings)
    where = folder / f"signal-{micro}"
    return _load(folder / "reference.pt"), _load(where / "paused.pt"), _load(where / "resumed.pt")


def _assert_same(actual: Any, expected: Any, what: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{what}: {difference.describe()}"


@pytest.mark.parametrize(("settings", "micro", "step"), SCENARIOS)
def test_sigterm_to_the_group_pauses_at_the_end_of_the_optimizer_step_it_arrived_in(
    runs: Path, settings: dict[str, Any], micro: int, step: int
) -> None:
    _, paused, resumed = _records(runs, settings, micro)
    assert paused["paused"] and paused["global_step"] == step
    assert len(paused["steps"]) == step and paused["steps"][-1][0] == step
    assert not resumed["paused"]


@pytest.mark.parametrize(("settings", "micro", "step"), SCENARIOS)
def test_the_resumed_run_trains_every_remaining_micro_batch_and_loss_of_the_uninterrupted_run(
    runs: Path, settings: dict[str, Any], micro: int, step: int
) -> None:
    reference, paused, resumed = _records(runs, settings, micro)
    assert len(paused["batches"]) + len(resumed["batches"]) == len(reference["batches"])
    _assert_same(paused["batches"] + resumed["batches"], reference["batches"], "batches")
    _assert_same(paused["losses"] + resumed["losses"], reference["losses"], "losses")
    # Every optimizer step's (global_step, state.epoch), as the callbacks saw it.
    _assert_same(paused["steps"] + resumed["steps"], reference["steps"], "steps")


@pytest.mark.parametrize(("settings", "micro", "step"), SCENARIOS)
def test_the_resumed_run_ends_with_the_uninterrupted_weights_optimizer_scheduler_and_logs(
    runs: Path, settings: dict[str, Any], micro: int, step: int
) -> None:
    reference, _, resumed = _records(runs, settings, micro)
    for name in ("model", "optimizer", "scheduler", "epoch", "global_step"):
        _assert_same(resumed[name], reference[name], name)
    # Every logged loss, grad norm, learning rate, evaluation loss, epoch and the final
    # train_loss (the timing figures left out).
    _assert_same(resumed["log_history"], reference["log_history"], "log_history")


@pytest.mark.parametrize(("settings", "micro", "step"), SCENARIOS)
def test_running_the_command_once_more_after_the_run_finished_says_it_is_finished(
    runs: Path, settings: dict[str, Any], micro: int, step: int
) -> None:
    _, _, resumed = _records(runs, settings, micro)
    assert resumed["finished"].startswith(
        "[340] the run is finished: there is nothing to resume (trainer_resume.run_finished "
        "tells; a requeued job can exit 0): "
    )
    assert (
        f"pause.ckpt.finished records the end of the run after step {resumed['global_step']}; "
        "to train the finished model further"
    ) in resumed["finished"]
