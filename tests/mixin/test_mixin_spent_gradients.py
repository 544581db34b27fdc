"""By default a pause carries every gradient that is set; a trainer that declares
``spent_gradients="drop"`` carries the gradients the next step still needs, and only those.

The loops (support.zero_grad_loops): one micro-batch per ``@training_step``, AdamW and
SGD over different parameters, bf16 autocast with a ``GradScaler("cpu")``, a branch
reached on even micro-steps only. A loop that reads the last step's gradients before its
``zero_grad()`` resumes exactly by default (no hook sees a read). With
``spent_gradients="drop"`` and ``zero_grad()`` first, the gradients at a step boundary
are spent: once the loop has shown that it sets them to ``None`` before its
next backward, pauses and resume points hold none, and a fresh trainer still continues
as the uninterrupted run (model, gradients, both optimizers, scaler, every later loss
and the RNG after, tensor by tensor). Gradients the next step reads are kept: inside a
window, after a step the scaler skipped, of a parameter no optimizer owns, and in
loops that add to applied gradients or zero them in place (also by putting new zero
tensors in their place); so are spent gradients the loop holds past its ``zero_grad()``.
A loop whose optimizer step is compiled by ``torch.compile`` is seen at every step too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import zero_grad_loops
from support.ddp_workers import describe_exits, launch
from support.lightning_procs import TESTS

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.testing import first_difference


@pytest.fixture(scope="module")
def first_loop() -> dict[str, Any]:
    return zero_grad_loops.uninterrupted("first")


def _pause_and_resume(tmp_path: Path, style: str, step: int, **options: Any) -> Any:
    """The gradients the pause at ``step`` held, and the resumed run's first difference."""
    expected = zero_grad_loops.uninterrupted(style, **options)
    path = tmp_path / f"pause-{style}-{step}.ckpt"
    assert zero_grad_loops.paused(style, step, path, **options) == step
    (saved,) = zero_grad_loops.saved_gradients(path)
    actual, start = zero_grad_loops.resumed(style, path, **options)
    assert start == step
    return saved, zero_grad_loops.difference_after(expected, actual, step)


@pytest.mark.parametrize("step", [2, 5])
def test_a_zero_grad_first_loop_pauses_without_gradients_and_resumes_as_the_uninterrupted_run(
    tmp_path: Path, first_loop: dict[str, Any], step: int
) -> None:
    path = tmp_path / "pause.ckpt"
    assert zero_grad_loops.paused("first", step, path) == step
    assert zero_grad_loops.saved_gradients(path) == [None]
    actual, start = zero_grad_loops.resumed("first", path)
    assert start == step
    assert zero_grad_loops.difference_after(first_loop, actual, step) is None


def test_a_zero_grad_first_pause_without_gradients_resumes_in_a_new_process(
    tmp_path: Path, first_loop: dict[str, Any]
) -> None:
    pause = tmp_path / "pause.ckpt"
    assert zero_grad_loops.paused("first", 4, pause) == 4
    assert zero_grad_loops.saved_gradients(pause) == [None]
    result = _resumed_in_a_new_process(pause, tmp_path / "resumed.pt", {"style": "first"})
    assert result["start"] == 4
    assert zero_grad_loops.difference_after(first_loop, result["outcome"], 4) is None


def _resumed_in_a_new_process(pause: Path, out: Path, options: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "support.zero_grad_loops", "resume", str(pause), str(out)]
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [*command, json.dumps(options)],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


def test_by_default_a_zero_grad_first_pause_holds_its_spent_gradients_and_resumes_exactly(
    tmp_path: Path, first_loop: dict[str, Any]
) -> None:
    path = tmp_path / "pause.ckpt"
    assert zero_grad_loops.paused("first", 4, path, spent_gradients=None) == 4
    (saved,) = zero_grad_loops.saved_gradients(path)
    # Those of the two layers every step reaches (the branch's: None, not reached at step 4).
    assert saved is not None and saved["model"]["first.weight"] is not None
    assert saved["model"]["second.weight"] is not None
    actual, start = zero_grad_loops.resumed("first", path, spent_gradients=None)
    assert start == 4
    assert zero_grad_loops.difference_after(first_loop, actual, 4) is None


def test_a_loop_that_reads_the_last_gradients_before_zero_grad_resumes_exactly_by_default(
    tmp_path: Path,
) -> None:
    # No hook sees the read: only the default, which saves spent gradients, is exact here.
    expected = zero_grad_loops.uninterrupted("reads", spent_gradients=None)
    pause = tmp_path / "pause.ckpt"
    assert zero_grad_loops.paused("reads", 4, pause, spent_gradients=None) == 4
    (saved,) = zero_grad_loops.saved_gradients(pause)
    assert saved is not None and saved["model"]["second.weight"] is not None
    result = _resumed_in_a_new_process(
        pause, tmp_path / "resumed.pt", {"style": "reads", "spent_gradients": None}
    )
    assert result["start"] == 4
    assert zero_grad_loops.difference_after(expected, result["outcome"], 4) is None
    # The declaration is what the default guards against: with "drop" the read sees None.
    dropped = tmp_path / "dropped.ckpt"
    assert zero_grad_loops.paused("reads", 4, dropped) == 4
    assert zero_grad_loops.saved_gradients(dropped) == [None]
    actual, _ = zero_grad_loops.resumed("reads", dropped)
    assert zero_grad_loops.difference_after(expected, actual, 4) is not None


def test_spent_gradients_takes_save_or_drop() -> None:
    with pytest.raises(ValueError, match="spent_gradients must be 'save' or 'drop', got 'keep'"):
        zero_grad_loops.LoopTrainer("first", spent_gradients="keep")


def test_resume_points_of_a_zero_grad_first_loop_hold_no_gradients_and_resume_exactly(
    tmp_path: Path, first_loop: dict[str, Any]
) -> None:
    points = zero_grad_loops.with_points("first", tmp_path / "points", every=3)
    assert [point.name for point in points] == [f"point-{s:012d}.ckpt" for s in (3, 6)]
    for point in points:
        assert zero_grad_loops.saved_gradients(point) == [None], point.name
        actual, start = zero_grad_loops.resumed("first", point)
        assert zero_grad_loops.difference_after(first_loop, actual, start) is None, point.name


def test_a_pause_before_the_loop_has_cleared_a_spent_gradient_keeps_the_gradients(
    tmp_path: Path,
) -> None:
    # After the first step nothing shows yet whether the loop clears its gradients.
    saved, difference = _pause_and_resume(tmp_path, "first", 1)
    assert saved is not None and saved["model"]["first.weight"] is not None
    assert difference is None


def test_a_pause_inside_an_accumulation_window_keeps_the_gradients_and_one_at_its_end_not(
    tmp_path: Path,
) -> None:
    inside, difference = _pause_and_resume(tmp_path, "first", 5, accumulate=2)
    assert difference is None
    assert all(grad is not None for grad in inside["model"].values())
    end, difference = _pause_and_resume(tmp_path, "first", 4, accumulate=2)
    assert (end, difference) == (None, None)


def test_a_pause_after_a_step_the_grad_scaler_skipped_keeps_the_gradients(
    tmp_path: Path,
) -> None:
    saved, difference = _pause_and_resume(tmp_path, "first", 3, skip_at=3)
    assert difference is None
    assert saved is not None and all(grad is not None for grad in saved["model"].values())


def test_a_pause_keeps_the_gradient_of_a_parameter_no_optimizer_owns_and_drops_the_spent_ones(
    tmp_path: Path,
) -> None:
    saved, difference = _pause_and_resume(tmp_path, "first", 4, unowned=True)
    assert difference is None
    assert [name for name, grad in saved["model"].items() if grad is not None] == ["scale"]
    assert saved["adamw"] == [[None] * 4] and saved["sgd"] == [[None] * 2]


def test_a_pause_keeps_the_gradients_of_parameters_an_owning_optimizer_has_not_stepped_on(
    tmp_path: Path,
) -> None:
    saved, difference = _pause_and_resume(tmp_path, "first", 4, idle=True)
    assert difference is None
    held = [name for name, grad in saved["model"].items() if grad is not None]
    assert held == ["first.weight", "first.bias"]


@pytest.mark.parametrize("step", [2, 5])
def test_a_loop_that_never_zeroes_keeps_its_gradients_and_resumes_exactly(
    tmp_path: Path, step: int
) -> None:
    saved, difference = _pause_and_resume(tmp_path, "never", step)
    assert difference is None
    assert saved is not None and all(grad is not None for grad in saved["model"].values())


def test_a_loop_that_zeroes_in_place_keeps_its_gradients_so_an_unreached_parameter_still_moves(
    tmp_path: Path,
) -> None:
    # The next micro-step skips the branch: stepped with a zero gradient it moves (AdamW's
    # momentum), with None it would not.
    saved, difference = _pause_and_resume(tmp_path, "in_place", 5)
    assert difference is None
    assert saved is not None and saved["model"]["branch.weight"] is not None


def test_a_loop_that_zeroes_by_putting_new_zero_tensors_keeps_its_gradients_so_an_unreached_parameter_still_moves(
    tmp_path: Path,
) -> None:
    # The spent gradients are let go of before the backward, but not for None: the
    # branch, skipped by the next micro-step, is stepped with a zero gradient (and moves).
    saved, difference = _pause_and_resume(tmp_path, "replace", 5)
    assert difference is None
    assert saved is not None and saved["model"]["branch.weight"] is not None


def test_a_loop_that_holds_its_spent_gradients_past_zero_grad_keeps_them_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    # Seen still held at the next backward into its parameter, a spent gradient is saved:
    # the documented rule for a gradient held elsewhere (DDP's bucket views), whatever
    # holds it. The branch's next backward comes a step later, when the list has let go.
    saved, difference = _pause_and_resume(tmp_path, "held", 5)
    assert difference is None
    held = [name for name, grad in saved["model"].items() if grad is not None]
    assert held == ["first.weight", "first.bias", "second.weight", "second.bias"]


def test_a_trainer_resumed_from_saved_gradients_saves_them_until_its_loop_clears_them_again(
    tmp_path: Path, first_loop: dict[str, Any]
) -> None:
    first = tmp_path / "first.ckpt"
    assert zero_grad_loops.paused("first", 1, first) == 1
    assert zero_grad_loops.saved_gradients(first) != [None]
    for pause, held in ((2, True), (3, False)):
        trainer = zero_grad_loops.LoopTrainer("first")
        trainer.resume(first)
        zero_grad_loops.train(trainer, total=pause)
        path = tmp_path / f"again-{pause}.ckpt"
        trainer.pause(path)
        (saved,) = zero_grad_loops.saved_gradients(path)
        # A parameter every step reaches (the branch, reached every other step, shows later).
        assert (saved is not None and saved["model"]["first.weight"] is not None) is held, pause
        actual, start = zero_grad_loops.resumed("first", path)
        assert zero_grad_loops.difference_after(first_loop, actual, start) is None, pause


def _hooks(parameter: torch.Tensor) -> int:
    return len(parameter._backward_hooks or {})


def test_a_kept_parameter_loses_its_hook_and_gets_it_back_once_a_resume_restores_its_gradient(
    tmp_path: Path,
) -> None:
    trainer = zero_grad_loops.LoopTrainer("never")
    zero_grad_loops.train(trainer, total=4)
    # Kept for good (its gradients always saved), a parameter has nothing left to show.
    assert [_hooks(p) for p in trainer.module.parameters()] == [0] * 6
    kept = tmp_path / "kept.ckpt"
    trainer.pause(kept)
    # Its gradients restored, the same trainer's loop zeroes first from now on: the
    # parameters are watched again, and their spent gradients dropped once seen cleared.
    trainer.style = "first"
    trainer.resume(kept)
    zero_grad_loops.train(trainer, total=6)
    assert [_hooks(p) for p in trainer.module.parameters()] == [1] * 6
    cleared = tmp_path / "cleared.ckpt"
    trainer.pause(cleared)
    assert zero_grad_loops.saved_gradients(cleared) == [None]


@pytest.mark.slow
def test_two_ranks_pause_a_zero_grad_first_loop_without_spent_gradients_and_resume_exactly(
    tmp_path: Path,
) -> None:
    # [accumulate, step]: after the first step; after a later one; inside a window (no_sync)
    # and at its end.
    job = {"tag": "spent", "pauses": [[1, 1], [1, 4], [2, 5], [2, 6]]}
    codes = launch(2, job, tmp_path, main=zero_grad_loops.rank_main)
    assert codes == [0, 0], describe_exits(codes, "spent", tmp_path)
    for rank in (0, 1):
        report = torch.load(tmp_path / f"result_spent_rank{rank}.pt", weights_only=True)
        failed = {case: difference for case, (_, difference) in report.items() if difference}
        assert list(report) == ["1-1", "1-4", "2-5", "2-6"] and not failed, (rank, failed)
    report = torch.load(tmp_path / "result_spent_rank0.pt", weights_only=True)
    held = {case: saved for case, (saved, _) in report.items()}
    assert held == {
        "1-1": [True, True],
        "1-4": [False, False],
        "2-5": [True, True],
        "2-6": [False, False],
    }


class _CompiledStepTrainer(TrainingResumeMixin):
    """zero_grad() first, then a backward and the optimizer's step compiled by torch.compile
    (the compiled-optimizer recipe; dynamo alone, as the hooks meet it with any backend)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.optimizer_step = torch.compile(self.optimizer.step, backend="eager")
        self.inputs = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
        self._initialize_training_resume(
            {"loop": "compiled optimizer step"}, version="1", spent_gradients="drop"
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {}

    @training_step
    def step(self) -> None:
        self.optimizer.zero_grad()
        shift = float(self.completed_steps)
        self.model(self.inputs + shift).square().mean().backward()
        self.optimizer_step()


def test_a_loop_whose_optimizer_step_is_compiled_pauses_without_spent_gradients_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    # The gradient tracking's hooks run at every step, not once while dynamo traces.
    uninterrupted = _CompiledStepTrainer()
    for _ in range(6):
        uninterrupted.step()
    paused = _CompiledStepTrainer()
    for _ in range(3):
        paused.step()
    path = tmp_path / "pause.ckpt"
    paused.pause(path)
    assert zero_grad_loops.saved_gradients(path) == [None]
    resumed = _CompiledStepTrainer()
    resumed.resume(path)
    for _ in range(3):
        resumed.step()
    for name in ("model", "optimizer"):
        expected = getattr(uninterrupted, name).state_dict()
        assert first_difference(expected, getattr(resumed, name).state_dict()) is None, name
