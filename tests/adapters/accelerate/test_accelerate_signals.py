"""A SIGTERM to the process group pauses an Accelerate loop exactly, inside a window or at its end.

The loop of ``support.accelerate_loop``: bf16, gradient accumulation 4, dropout, a
shuffled loader with two workers whose samples draw from ``random``, NumPy and torch,
``@training_step`` on one micro-batch. One child process runs it uninterrupted and
twice more with a SIGTERM to its whole process group (workers included) at micro-step
13 (the third of a window: ``Accelerator.step`` is 3, gradients accumulated) and 8 (a
window's end); a second, new process resumes both pauses. Everything the resumed runs
see and end with is compared with the uninterrupted run, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.accelerate_loop import assert_identical, load_results

from trainer_resume import load_checkpoint

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(TESTS)
MID_WINDOW, WINDOW_END = 13, 8


def run_phases(workdir, name: str, phases: list[dict]) -> None:
    spec = workdir / f"{name}.json"
    spec.write_text(json.dumps(phases))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]))
    child = subprocess.run(
        [sys.executable, "-m", "support.accelerate_loop", str(spec)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # its own process group: the SIGTERM does not reach pytest
    )
    assert child.returncode == 0, child.stderr[-4000:]


@pytest.mark.slow
def test_sigterm_to_the_process_group_inside_a_window_and_at_its_end_resumes_bit_identically(
    tmp_path,
):
    def path(name: str) -> str:
        return str(tmp_path / name)

    run_phases(
        tmp_path,
        "pause",
        [
            {"results": path("reference")},
            *(
                {"results": path(f"paused{k}"), "signal_at": k, "pause": path(f"pause{k}.ckpt")}
                for k in (MID_WINDOW, WINDOW_END)
            ),
        ],
    )
    run_phases(
        tmp_path,
        "resume",
        [
            {"results": path(f"resumed{k}"), "resume": path(f"pause{k}.ckpt")}
            for k in (MID_WINDOW, WINDOW_END)
        ],
    )
    reference = load_results(path("reference"))
    assert len(reference["losses"]) == 30
    for step, window in ((MID_WINDOW, (3, False)), (WINDOW_END, (8, True))):
        paused = load_results(path(f"paused{step}"))
        assert (paused["completed_steps"], paused["paused"]) == (step, True)
        saved = load_checkpoint(path(f"pause{step}.ckpt"))["objects"]["accelerator"]
        assert (saved["step"], saved["sync_gradients"]) == window
        assert_identical(reference["losses"][:step], paused["losses"], f"losses before {step}")
        resumed = load_results(path(f"resumed{step}"))
        assert resumed["first_step"] == step
        assert_identical(reference["losses"][step:], resumed["losses"], f"losses after {step}")
        assert_identical(reference["batches"][step:], resumed["batches"], f"batches after {step}")
        for name in ("model", "optimizer", "scheduler", "accelerator"):
            assert_identical(reference["states"][name], resumed["states"][name], name)
