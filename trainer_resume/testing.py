"""Check that a trainer resumes exactly: ``assert_training_resume``.

The comparison helpers it uses (``first_difference``, ``max_abs_difference``) live in
:mod:`trainer_resume.difference` and are importable from here too.

The check runs the training three times: uninterrupted; up to ``pause_after``
steps then ``pause()``; and in a fresh trainer (optionally in a fresh process)
``resume()`` then the remaining steps. Snapshots and per-step results must be
bit-identical; a failure names the step, the key and the max abs difference.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import tempfile
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch

from .checks.hook_results import loader_view
from .difference import Difference, first_difference, max_abs_difference
from .errors import ResumeError, TrainingPausedError
from .rng import random_state, restore_random_state
from .state import cpu_state

__all__ = ["Difference", "assert_training_resume", "first_difference", "max_abs_difference"]

Trainer = TypeVar("Trainer")


def assert_training_resume(
    factory: Callable[[], Trainer],
    run_step: Callable[[Trainer], Any],
    checkpoint_path: str | os.PathLike[str],
    pause_after: int,
    total_steps: int,
    snapshot: Callable[[Trainer], Any],
    *,
    new_process: bool = False,
    timeout: float = 600.0,
) -> None:
    """Assert that pausing after ``pause_after`` steps and resuming reproduces an uninterrupted run.

    Three trainers come from ``factory``: one runs ``total_steps`` steps; one runs
    ``pause_after`` steps, pauses to ``checkpoint_path``, must pass its own
    ``check_resumable(checkpoint_path)`` (the checks of ``resume()``, on the file read
    back) and must refuse a further step; a fresh one, whose global RNGs are deliberately advanced first (so seeding
    in the constructor cannot hide a missing RNG restore), resumes and runs the
    remaining steps. Compared tensor by tensor: the snapshots before the pause and
    right after the resume against the uninterrupted run at ``pause_after``, every
    ``run_step`` result, and the final snapshots. Snapshots are taken with the
    global RNG states preserved, so a snapshot may draw random numbers. Trainers
    and their loaders are closed and the caller's RNG states are restored.

    Args:
        factory: Builds a fresh trainer (a ``TrainingResumeMixin``).
        run_step: Runs one training step and returns what to compare (e.g. the loss).
        checkpoint_path: The pause file to write.
        pause_after: Steps before the pause (``0 <= pause_after <= total_steps``).
        total_steps: Steps of the whole run.
        snapshot: Returns the state to compare (tensors, numbers, str, containers).
        new_process: Run the resume half in a spawned process; ``factory``,
            ``run_step`` and ``snapshot`` must then be picklable (module-level
            functions, or ``functools.partial`` of them).
        timeout: Seconds the spawned process may take.

    Raises:
        AssertionError: a difference, naming the step, the key and the max abs difference.
        TypeError: ``new_process=True`` with callbacks that cannot be pickled.
        ValueError: ``pause_after`` or ``total_steps`` out of range.
    """
    if not 0 <= pause_after <= total_steps:
        raise ValueError(
            f"need 0 <= pause_after <= total_steps, got pause_after={pause_after}, total_steps={total_steps}"
        )
    if new_process:
        try:
            pickle.dumps((factory, run_step, snapshot))
        except Exception as error:
            raise TypeError(
                "new_process=True needs importable callbacks (module-level functions or functools.partial "
                f"of them) for factory, run_step and snapshot: {error}"
            ) from error
    caller_rng = random_state(_cuda_device())
    try:
        reference = _run_uninterrupted(factory, run_step, snapshot, pause_after, total_steps)
        before_pause = _run_to_pause(factory, run_step, snapshot, checkpoint_path, pause_after)
        for step, (expected, actual) in enumerate(
            zip(reference["results"], before_pause["results"]), 1
        ):
            _require_equal(expected, actual, f"run_step result of step {step} before the pause")
        _require_equal(
            reference["at_pause"],
            before_pause["at_pause"],
            f"snapshot before the pause (step {pause_after})",
        )
        arguments = (
            factory,
            run_step,
            snapshot,
            os.fspath(checkpoint_path),
            pause_after,
            total_steps,
        )
        resumed = (
            _resume_in_new_process(arguments, timeout) if new_process else _resume_half(*arguments)
        )
        _require_equal(
            reference["at_pause"],
            resumed["at_pause"],
            f"snapshot right after resume (step {pause_after})",
        )
        later = reference["results"][pause_after:]
        for step, (expected, actual) in enumerate(zip(later, resumed["results"]), pause_after + 1):
            _require_equal(expected, actual, f"run_step result of step {step} after resume")
        _require_equal(reference["final"], resumed["final"], f"final snapshot (step {total_steps})")
    finally:
        restore_random_state(caller_rng, _cuda_device())


# ------------------------------------------------------------------ the runs
def _run_uninterrupted(
    factory, run_step, snapshot, pause_after: int, total_steps: int
) -> dict[str, Any]:
    trainer = factory()
    try:
        results = []
        at_pause = _observe(snapshot, trainer) if pause_after == 0 else None
        for step in range(1, total_steps + 1):
            results.append(cpu_state(run_step(trainer)))
            if step == pause_after:
                at_pause = _observe(snapshot, trainer)
        return {"results": results, "at_pause": at_pause, "final": _observe(snapshot, trainer)}
    finally:
        _close(trainer)


def _run_to_pause(factory, run_step, snapshot, checkpoint_path, pause_after: int) -> dict[str, Any]:
    trainer = factory()
    try:
        results = [cpu_state(run_step(trainer)) for _ in range(pause_after)]
        at_pause = _observe(snapshot, trainer)
        trainer.pause(checkpoint_path)
        if not getattr(trainer, "paused", True):
            raise AssertionError("assert_training_resume: trainer.paused is false after pause()")
        check = getattr(trainer, "check_resumable", None)
        if check is not None:  # the file as written, read back, against its own trainer
            try:
                check(checkpoint_path)
            except ResumeError as error:
                raise AssertionError(
                    f"assert_training_resume: the pause at step {pause_after} is refused by the "
                    f"checks of resume() in the trainer that wrote it: {error}"
                ) from error
        try:
            run_step(trainer)
        except TrainingPausedError:
            pass
        else:
            raise AssertionError(
                f"assert_training_resume: a step after pause() at step {pause_after} was not refused "
                "with TrainingPausedError (is the step decorated with @training_step?)"
            )
        return {"results": results, "at_pause": at_pause}
    finally:
        _close(trainer)


def _resume_half(
    factory, run_step, snapshot, checkpoint_path: str, pause_after: int, total_steps: int
) -> dict[str, Any]:
    trainer = factory()
    try:
        _advance_global_rngs()
        trainer.resume(checkpoint_path)
        completed = getattr(trainer, "completed_steps", pause_after)
        if completed != pause_after:
            raise AssertionError(
                f"assert_training_resume: completed_steps is {completed} after resume, expected {pause_after}"
            )
        at_pause = _observe(snapshot, trainer)
        results = [cpu_state(run_step(trainer)) for _ in range(pause_after, total_steps)]
        return {"at_pause": at_pause, "results": results, "final": _observe(snapshot, trainer)}
    finally:
        _close(trainer)


def _resume_in_new_process(arguments: tuple, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="assert-training-resume-") as directory:
        out = os.path.join(directory, "resumed.pt")
        # Not a daemon: the resumed trainer's loader starts worker processes of its own,
        # with this process's start method (a spawned child would otherwise spawn them too).
        start_method = multiprocessing.get_start_method()
        process = multiprocessing.get_context("spawn").Process(
            target=_child_main, args=(*arguments, out, start_method)
        )
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(10)
            raise RuntimeError(
                f"assert_training_resume: the resume process did not finish within {timeout} s"
            )
        if not os.path.exists(out):
            raise RuntimeError(
                f"assert_training_resume: the resume process exited with code {process.exitcode}"
            )
        outcome = torch.load(out, weights_only=True)
    if outcome["error"] is not None:
        kind = AssertionError if outcome["assertion"] else RuntimeError
        raise kind(f"assert_training_resume: in the resume process:\n{outcome['error']}")
    return outcome["result"]


def _child_main(
    factory,
    run_step,
    snapshot,
    checkpoint_path: str,
    pause_after: int,
    total_steps: int,
    out: str,
    start_method: str,
) -> None:
    multiprocessing.set_start_method(start_method, force=True)
    try:
        outcome = {
            "result": _resume_half(
                factory, run_step, snapshot, checkpoint_path, pause_after, total_steps
            )
        }
        outcome.update(error=None, assertion=False)
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which raises it there)
        outcome = {
            "result": None,
            "error": traceback.format_exc(),
            "assertion": isinstance(error, AssertionError),
        }
    torch.save(outcome, out)


# --------------------------------------------------------------- utilities
def _cuda_device() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _observe(snapshot: Callable[[Any], Any], trainer: Any) -> Any:
    # A snapshot is an observation: whatever it draws must not shift the run it observes.
    saved = random_state(_cuda_device())
    try:
        return cpu_state(snapshot(trainer))
    finally:
        restore_random_state(saved, _cuda_device())


def _advance_global_rngs() -> None:
    for _ in range(17):
        random.random()
    np.random.random(17)
    torch.rand(17)
    if torch.cuda.is_available():
        torch.rand(17, device="cuda")


def _close(trainer: Any) -> None:
    loaders: Mapping[str, Any] = {}
    hook = getattr(trainer, "_resume_loaders", None)
    if hook is not None:
        try:
            loaders = hook()
        except Exception:  # noqa: BLE001  (a half-built trainer: close what close() can reach)
            loaders = {}
    close = getattr(trainer, "close", None)
    if callable(close):
        close()
    for loader in map(loader_view, loaders.values()):  # a framework's wrapper: the loader inside
        if callable(getattr(loader, "close", None)):
            loader.close()


def _require_equal(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    if difference is not None:
        raise AssertionError(f"assert_training_resume: {where}: {difference.describe()}")
