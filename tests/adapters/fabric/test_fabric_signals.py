"""A SIGTERM to the process group pauses a Lightning Fabric loop exactly; a new process resumes it.

The loop of ``support.fabric_loop`` on one process, its objects and loader returned as
Fabric hands them back: ``bf16-mixed`` with gradient accumulation 2, and fp16 with the
``MixedPrecision("16-mixed")`` plugin's GradScaler. One child process runs each
uninterrupted and again with a SIGTERM to its whole process group (loader workers
included) during step 9 (inside an accumulation window: the gradients of step 9 are
saved); a second, new process resumes both pauses. Every loss, batch and final state is
compared with the uninterrupted run, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.fabric_loop import load_results

from trainer_resume import load_checkpoint
from trainer_resume.testing import first_difference

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(TESTS)
STEP = 9
RUNS = {"bf16": {"accumulation": 2}, "fp16": {"precision": "16-mixed"}}


def run_phases(workdir, name: str, phases: list[dict]) -> None:
    spec = workdir / f"{name}.json"
    spec.write_text(json.dumps({"devices": 1, "phases": phases}))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]))
    child = subprocess.run(
        [sys.executable, "-m", "support.fabric_loop", str(spec)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # its own process group: the SIGTERM does not reach pytest
    )
    assert child.returncode == 0, child.stderr[-4000:]


@pytest.mark.slow
def test_sigterm_to_the_process_group_after_step_9_resumes_bit_identically_in_a_new_process(
    tmp_path,
):
    def path(name: str) -> str:
        return str(tmp_path / name)

    run_phases(
        tmp_path,
        "pause",
        [
            phase
            for run, settings in RUNS.items()
            for phase in (
                {"results": path(f"reference-{run}"), **settings},
                {
                    "results": path(f"paused-{run}"),
                    "signal_at": STEP,
                    "pause": path(f"pause-{run}.ckpt"),
                    **settings,
                },
            )
        ],
    )
    run_phases(
        tmp_path,
        "resume",
        [
            {"results": path(f"resumed-{run}"), "resume": path(f"pause-{run}.ckpt"), **settings}
            for run, settings in RUNS.items()
        ],
    )
    for run in RUNS:
        reference = load_results(path(f"reference-{run}"))
        assert len(reference["losses"]) == 30
        paused = load_results(path(f"paused-{run}"))
        assert (paused["completed_steps"], paused["paused"]) == (STEP, True)
        assert first_difference(reference["losses"][:STEP], paused["losses"]) is None, run
        resumed = load_results(path(f"resumed-{run}"))
        assert resumed["first_step"] == STEP
        for part in ("losses", "batches"):
            difference = first_difference(reference[part][STEP:], resumed[part])
            assert difference is None, (run, part, difference.describe())
        difference = first_difference(reference["states"], resumed["states"])
        assert difference is None, (run, difference.describe())

    # Inside the window the model's gradients are saved, under the model's own names.
    saved = load_checkpoint(path("pause-bf16.ckpt"))
    assert list(saved["gradients"]["model"]) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert list(saved["objects"]) == ["model", "optimizer", "scheduler"]
    # The fp16 plugin's GradScaler is saved, its scale already backed off from the initial
    # 65536: a fresh one would have scaled the resumed steps otherwise.
    scaler = load_checkpoint(path("pause-fp16.ckpt"))["objects"]["scaler"]
    assert scaler["scale"] < 65536.0
