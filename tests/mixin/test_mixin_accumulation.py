"""A pause, or a resume point, inside a gradient-accumulation window resumes bit-identically.

The loop (support.accumulation): ``@training_step`` on one micro-batch of a window of 4,
bf16 autocast with a ``GradScaler("cpu")``, AdamW, a cosine LR per optimizer step,
dropout, a shuffled loader; both ``zero_grad`` styles. Paused at positions 1, 2 and 3
of a window, and resumed from resume points taken every 3 micro-steps, a fresh trainer
continues as the uninterrupted run: model, gradients, optimizer, scheduler, scaler,
every later loss and the RNG after, tensor by tensor. Under DDP (2 gloo ranks,
``DistributedSampler(shuffle=True)``, ``no_sync`` inside a window) each rank carries
its own gradients.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import accumulation
from support.ddp_workers import describe_exits, launch
from support.lightning_procs import TESTS

from trainer_resume.distributed import combined_pause
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import ResumeStateMismatchError
from trainer_resume.testing import first_difference

CASES = [
    f"{style} {kind}"
    for style in ("after", "start")
    for kind in [f"pause at {step}" for step in accumulation.PAUSES]
    + [f"point point-{step:012d}.ckpt" for step in (3, 6, 9)]
]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return accumulation.run_matrix(tmp_path_factory.mktemp("accumulation"))


@pytest.mark.parametrize("case", CASES)
def test_one_process_resumes_a_window_as_the_uninterrupted_run(
    one_process: dict[str, Any], case: str
) -> None:
    assert set(one_process) == set(CASES)
    assert one_process[case] is None, one_process[case]


def test_a_pause_mid_window_holds_the_gradients_and_one_at_a_window_end_in_the_after_style_none(
    tmp_path: Path,
) -> None:
    mid = accumulation.paused("after", 6, tmp_path / "mid.ckpt")
    end = accumulation.paused("after", 8, tmp_path / "end.ckpt")
    assert (mid, end) == (6, 8)
    gradients = load_checkpoint(tmp_path / "mid.ckpt")["gradients"]
    assert sorted(gradients) == ["model", "optimizer"]
    assert all(grad is not None for grad in gradients["model"].values())
    # One copy: the optimizer's entries are the module's tensors.
    assert gradients["optimizer"][0][0] is gradients["model"]["0.weight"]
    assert "gradients" not in load_checkpoint(tmp_path / "end.ckpt")


def test_a_window_paused_in_one_process_resumes_in_a_new_process(tmp_path: Path) -> None:
    expected = accumulation.uninterrupted("start")
    pause = tmp_path / "pause.ckpt"
    assert accumulation.paused("start", 6, pause) == 6
    out = tmp_path / "resumed.pt"
    command = [
        sys.executable,
        "-m",
        "support.accumulation",
        "resume",
        str(pause),
        str(out),
        "start",
    ]
    done = subprocess.run(
        command, cwd=TESTS, capture_output=True, text=True, timeout=300, env=_environment()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = torch.load(out, weights_only=True)
    assert result["start"] == 6
    expected["losses"] = {k: v for k, v in expected["losses"].items() if k > 6}
    difference = first_difference(expected, result["outcome"])
    assert difference is None, difference


def _environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def test_gradients_that_do_not_fit_the_parameters_are_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    pause = tmp_path / "pause.ckpt"
    accumulation.paused("after", 6, pause)
    checkpoint = load_checkpoint(pause)
    checkpoint["gradients"]["model"]["0.weight"] = torch.zeros(3, 3)
    save_checkpoint(checkpoint, tmp_path / "wrong.ckpt")
    trainer = accumulation.WindowTrainer("after")
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    with pytest.raises(ResumeStateMismatchError) as refused:
        trainer.resume(tmp_path / "wrong.ckpt")
    assert str(refused.value) == (
        "[330] checkpoint entries do not match the trainer's objects/loaders/extras: gradients of "
        "object 'model': parameter '0.weight' has a gradient of shape [3, 3] and dtype "
        "torch.float32 in the checkpoint, the parameter [16, 6] and torch.float32"
    )
    assert first_difference(before, trainer.module.state_dict()) is None
    assert not trainer.locked and all(p.grad is None for p in trainer.module.parameters())


@pytest.mark.slow
def test_two_ranks_resume_every_window_position_and_point_as_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    codes = launch(2, {"tag": "accumulation"}, tmp_path, main=accumulation.rank_main)
    assert codes == [0, 0], describe_exits(codes, "accumulation", tmp_path)
    for rank in (0, 1):
        report = torch.load(tmp_path / f"result_accumulation_rank{rank}.pt", weights_only=True)
        assert set(report) == set(CASES)
        failed = {case: text for case, text in report.items() if text is not None}
        assert not failed, (rank, failed)
    pause = tmp_path / "rank-files-accumulation" / "pause-after-6.ckpt"
    trainer = accumulation.WindowTrainer("after")  # one process: another world size
    with pytest.raises(ResumeStateMismatchError) as refused:
        trainer.resume(pause)
    assert str(refused.value) == (
        f"[330] checkpoint entries do not match the trainer's objects/loaders/extras: {pause} was "
        "paused with 2 rank(s) and cannot be resumed with 1: loader 'train' reads a "
        "DistributedSampler, which orders each epoch by the number of ranks, so its position "
        "means nothing with another number; resume with 2 rank(s), or read one global stream "
        "that re-shards sample-exactly (InfiniteRandomSampler, build_batch_sampler or "
        "ShardedBatchSampler, which trainer_resume.adapters.fabric.setup_dataloaders and "
        "trainer_resume.adapters.accelerate.prepare_loader build; see docs/distributed.md)"
    )


def test_a_window_paused_by_several_ranks_is_not_redistributed_over_another_number(
    tmp_path: Path,
) -> None:
    accumulation.paused("after", 6, tmp_path / "pause.ckpt")
    checkpoint = load_checkpoint(tmp_path / "pause.ckpt")
    ranks = []
    for scale in (1.0, 2.0):  # each rank's partial sum of its own micro-batches
        state = {key: checkpoint[key] for key in ("loaders", "extra", "rng")}
        state["gradients"] = {
            name: {k: v * scale for k, v in grads.items()} if name == "model" else grads
            for name, grads in checkpoint["gradients"].items()
        }
        ranks.append(state)
    save_checkpoint(combined_pause(checkpoint, ranks), tmp_path / "two-ranks.ckpt")
    trainer = accumulation.WindowTrainer("after")
    with pytest.raises(ResumeStateMismatchError) as refused:
        trainer.resume(tmp_path / "two-ranks.ckpt")
    assert str(refused.value) == (
        f"[330] checkpoint entries do not match the trainer's objects/loaders/extras: "
        f"{tmp_path / 'two-ranks.ckpt'} was paused with 2 rank(s) and cannot be redistributed over "
        "1: it was paused inside a gradient-accumulation window, where each rank holds the partial "
        "sum of its own micro-batches; resume with 2 rank(s)"
    )
    assert not trainer.locked
