"""Two processes under Fabric's DDP strategy (gloo on CPU): paused by a SIGTERM, resumed exactly.

The loop of ``support.fabric_loop`` on 2 processes (5 steps per process and epoch, 3
epochs), its loader set up two ways: by ``fabric.setup_dataloaders`` itself (rebuilt
around a ``DistributedSampler``, whose epochs Fabric numbers by its iterations) and by the
adapter's ``setup_dataloaders`` (shared in global batches). The first launch, by
``fabric.launch()``, runs each uninterrupted and again with a SIGTERM to the process group
(both ranks and their loader workers) during step 7, in the second epoch. A second
launch, by ``torchrun``, resumes both pauses on 2 processes: bit-identical. A single
process then resumes them: the ``DistributedSampler`` loader is refused before anything
changes, naming the fix; the shared one continues the global stream sample-exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import torchrun
from support.fabric_loop import load_results

from trainer_resume.testing import first_difference

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(TESTS)
STEP = 7  # per process: the second step of the second epoch
STEPS = 15  # per process
SHARINGS = ("fabric", "adapter")


def launch(
    workdir, name: str, phases: list[dict], *, devices: int, under_torchrun: bool = False
) -> subprocess.CompletedProcess[str]:
    spec = workdir / f"{name}.json"
    spec.write_text(json.dumps({"devices": devices, "phases": phases}))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "support.fabric_loop", str(spec)]
    if under_torchrun:
        command[1:1] = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={devices}",
        ]
    # The launch's own session (the SIGTERM goes to its process group); a hang fails
    # with the output.
    return torchrun.run(command, environment, timeout=400)


def interleaved(first: list, second: list) -> list:
    return [item for pair in zip(first, second) for item in pair]


@pytest.mark.slow
def test_two_processes_paused_by_sigterm_resume_exactly_on_two_and_by_the_rule_on_one(tmp_path):
    def path(name: str) -> str:
        return str(tmp_path / name)

    first = launch(
        tmp_path,
        "pause",
        [
            phase
            for sharing in SHARINGS
            for phase in (
                {"results": path(f"reference-{sharing}"), "sharing": sharing},
                {
                    "results": path(f"paused-{sharing}"),
                    "sharing": sharing,
                    "signal_at": STEP,
                    "pause": path(f"pause-{sharing}.ckpt"),
                },
            )
        ],
        devices=2,
    )
    assert first.returncode == 0, first.stdout[-4000:]
    resumed = launch(
        tmp_path,
        "resume",
        [
            {
                "results": path(f"resumed-{sharing}"),
                "sharing": sharing,
                "resume": path(f"pause-{sharing}.ckpt"),
            }
            for sharing in SHARINGS
        ],
        devices=2,
        under_torchrun=True,
    )
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    single = launch(
        tmp_path,
        "single",
        [
            {
                "results": path(f"single-{sharing}"),
                "sharing": sharing,
                "resume": path(f"pause-{sharing}.ckpt"),
                "workers": 0,
            }
            for sharing in SHARINGS
        ],
        devices=1,
    )
    assert single.returncode == 0, single.stdout[-4000:]

    for sharing in SHARINGS:
        references = [load_results(path(f"reference-{sharing}"), rank) for rank in range(2)]
        assert [len(reference["losses"]) for reference in references] == [STEPS, STEPS]
        # The ranks read disjoint halves of every epoch, in another order each epoch.
        epochs = [
            sorted(
                index
                for reference in references
                for batch in reference["batches"][5 * epoch : 5 * epoch + 5]
                for index in batch[2].tolist()
            )
            for epoch in range(3)
        ]
        assert epochs == [list(range(40))] * 3, sharing
        first_batches = [reference["batches"][0][2] for reference in references]
        second_epoch = [reference["batches"][5][2] for reference in references]
        assert first_difference(first_batches, second_epoch) is not None, sharing
        for rank, reference in enumerate(references):
            where = f"{sharing}, rank {rank}"
            paused = load_results(path(f"paused-{sharing}"), rank)
            assert (paused["completed_steps"], paused["paused"]) == (STEP, True), where
            assert first_difference(reference["losses"][:STEP], paused["losses"]) is None, where
            again = load_results(path(f"resumed-{sharing}"), rank)
            assert again["first_step"] == STEP, where
            for part in ("losses", "batches"):
                difference = first_difference(reference[part][STEP:], again[part])
                assert difference is None, (where, part, difference.describe())
            difference = first_difference(reference["states"], again["states"])
            assert difference is None, (where, difference.describe())

    # Fabric's DistributedSampler orders each epoch by the number of processes: refused on
    # one before anything changed, naming the loader that resumes on any number.
    pause = path("pause-fabric.ckpt")
    assert load_results(path("single-fabric"))["refused"] == [
        330,
        f"{pause} was paused with 2 rank(s) and cannot be resumed with 1: loader 'train' reads "
        "a DistributedSampler, which orders each epoch by the number of ranks, so its position "
        "means nothing with another number; resume with 2 rank(s), or read one global stream "
        "that re-shards sample-exactly (InfiniteRandomSampler, build_batch_sampler or "
        "ShardedBatchSampler, which trainer_resume.adapters.fabric.setup_dataloaders and "
        "trainer_resume.adapters.accelerate.prepare_loader build; see docs/distributed.md)",
    ]
    # The adapter's loader: one process continues the global stream where the two stopped,
    # every remaining global batch once, in order, with the same samples and augmentation.
    shared = [load_results(path("reference-adapter"), rank) for rank in range(2)]
    alone = load_results(path("single-adapter"))
    assert alone["first_step"] == 2 * STEP
    assert len(alone["warnings"]) == 1 and "sample-exact" in alone["warnings"][0]
    expected = interleaved(shared[0]["batches"][STEP:], shared[1]["batches"][STEP:])
    difference = first_difference(expected, alone["batches"])
    assert difference is None, difference.describe()
