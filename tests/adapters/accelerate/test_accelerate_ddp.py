"""Two processes (gloo on CPU, started by torchrun): pauses exact, a resume on one process sample-exact.

The loop of ``support.accelerate_loop`` on 2 processes: 5 micro-steps per process and
epoch (10 global batches), gradient accumulation 4. The first launch runs it
uninterrupted (and one evaluation pass gathered for metrics), then pauses it at
micro-step 4 (a window's end) with a SIGTERM to each rank's process group (what
torchrun forwards), then at micro-step 7 (inside a window) with a SIGTERM to
torchrun's own process group as well (it forwards it to the ranks). A second launch
resumes both pauses on 2 processes; a single process then resumes them on another
world size: sample-exact from the window's end, refused from inside the window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from support import torchrun
from support.accelerate_loop import EVALUATION_SIZE, assert_identical, load_results

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(TESTS)
WINDOW_END, MID_WINDOW = 4, 7
STEPS = 15  # per process


def launch(workdir, name: str, phases: list[dict], processes: int) -> subprocess.CompletedProcess:
    spec = workdir / f"{name}.json"
    spec.write_text(json.dumps(phases))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "support.accelerate_loop", str(spec)]
    if processes > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
            "-m",
            "support.accelerate_loop",
            str(spec),
        ]
    # The launcher's own session, away from pytest's; a hang fails with the output.
    return torchrun.run(command, environment, timeout=300)


def interleaved(first: list, second: list) -> list:
    return [item for pair in zip(first, second) for item in pair]


@pytest.mark.slow
def test_two_processes_pause_exactly_and_resume_on_one_process_sample_exactly(tmp_path):
    def path(name: str) -> str:
        return str(tmp_path / name)

    first = launch(
        tmp_path,
        "pause",
        [
            {"results": path("reference"), "evaluation": True},
            {"results": path("paused4"), "signal_at": WINDOW_END, "pause": path("pause4.ckpt")},
            {
                "results": path("paused7"),
                "signal_at": MID_WINDOW,
                "pause": path("pause7.ckpt"),
                "signal_launcher": True,
            },
        ],
        processes=2,
    )
    # torchrun ends with an error status after forwarding a SIGTERM, whatever the ranks
    # did: every rank's own report is checked below.
    assert os.path.exists(path("paused7.rank1.pt")), first.stdout[-4000:]
    resumed = launch(
        tmp_path,
        "resume",
        [
            {"results": path(f"resumed{k}"), "resume": path(f"pause{k}.ckpt")}
            for k in (WINDOW_END, MID_WINDOW)
        ],
        processes=2,
    )
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    single = launch(
        tmp_path,
        "single",
        [
            {"results": path(f"single{k}"), "resume": path(f"pause{k}.ckpt"), "workers": 0}
            for k in (WINDOW_END, MID_WINDOW)
        ],
        processes=1,
    )
    assert single.returncode == 0, single.stdout[-4000:]

    references = [load_results(path("reference"), rank) for rank in range(2)]
    assert [len(reference["losses"]) for reference in references] == [STEPS, STEPS]
    # The ranks read disjoint halves of every epoch, and gathering for metrics drops the
    # padding of the last evaluation batch.
    assert sorted(references[0]["evaluated"]) == list(range(EVALUATION_SIZE))
    first_epoch = [batch[2] for reference in references for batch in reference["batches"][:5]]
    assert sorted(torch.cat(first_epoch).tolist()) == list(range(40))
    for step in (WINDOW_END, MID_WINDOW):
        for rank, reference in enumerate(references):
            paused = load_results(path(f"paused{step}"), rank)
            assert (paused["completed_steps"], paused["paused"]) == (step, True)
            assert_identical(reference["losses"][:step], paused["losses"], f"rank {rank} before")
            again = load_results(path(f"resumed{step}"), rank)
            assert again["first_step"] == step
            assert_identical(reference["losses"][step:], again["losses"], f"rank {rank} losses")
            assert_identical(reference["batches"][step:], again["batches"], f"rank {rank} batches")
            for name in ("model", "optimizer", "scheduler", "accelerator"):
                assert_identical(reference["states"][name], again["states"][name], name)

    # One process continues the global stream where the two stopped: every remaining
    # global batch once, in order, with the same samples and augmentation.
    at_end = load_results(path(f"single{WINDOW_END}"))
    assert at_end["first_step"] == 2 * WINDOW_END
    expected = interleaved(
        references[0]["batches"][WINDOW_END:], references[1]["batches"][WINDOW_END:]
    )
    assert_identical(expected, at_end["batches"], "batches on one process")
    # Inside a window each process holds its own gradients: refused, before anything changed.
    assert load_results(path(f"single{MID_WINDOW}"))["refused"] == [
        330,
        f"{path('pause7.ckpt')} was paused with 2 rank(s) and cannot be redistributed over 1: it "
        "was paused inside a gradient-accumulation window, where each rank holds the partial sum "
        "of its own micro-batches; resume with 2 rank(s)",
    ]
