"""A loop that stops its epochs early: a pause after its epoch-end work, or after the next
epoch's first batch was fetched, resumes in a new process as the uninterrupted run goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support import early_epochs
from support.early_epochs import PAUSE_AT, EarlyEpochs, outcome, train

from trainer_resume import UnsavedStateWarning


def _resume_in_new_process(workdir: Path, *names: str) -> dict[str, dict[str, Any]]:
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, early_epochs.__file__, str(workdir), *names],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return {name: torch.load(workdir / f"{name}.pt", weights_only=True) for name in names}


def _assert_same_as(expected: dict[str, Any], actual: dict[str, Any], what: str) -> None:
    assert len(actual["losses"]) == len(expected["losses"]), what
    for step in range(PAUSE_AT, len(expected["losses"])):
        assert torch.equal(expected["losses"][step], actual["losses"][step]), (what, step)
    for name, value in expected["model"].items():
        assert torch.equal(value, actual["model"][name]), (what, name)
    moments = expected["optimizer"]["state"]
    for index, state in moments.items():
        for key, value in state.items():
            assert torch.equal(value, actual["optimizer"]["state"][index][key]), (what, key)
    assert expected["optimizer"]["param_groups"] == actual["optimizer"]["param_groups"], what
    assert expected["scheduler"] == actual["scheduler"], what
    assert expected["epoch"] == actual["epoch"], what
    assert torch.equal(expected["rng_after"], actual["rng_after"]), what


def _paused(
    path: Path,
    how: str,
    *,
    end_epoch: bool = True,
    points: Path | None = None,
    sampled: bool = False,
) -> None:
    trainer = EarlyEpochs(points, sampled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsavedStateWarning)  # the loop without end_epoch()
        train(trainer, end_epoch=end_epoch, pause=(how, path))
    assert trainer.paused and trainer.completed_steps == PAUSE_AT


def _uninterrupted(sampled: bool) -> dict[str, Any]:
    trainer = EarlyEpochs(sampled=sampled)
    train(trainer)
    return outcome(trainer)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The uninterrupted runs (``plain``, ``sampled``) and each pause below, resumed in
    one new process (under the pause's name)."""
    workdir = tmp_path_factory.mktemp("early")
    expected = {"plain": _uninterrupted(False), "sampled": _uninterrupted(True)}
    _paused(workdir / "called.ckpt", "pause")
    _paused(workdir / "requested.ckpt", "requested")
    _paused(workdir / "fetched.ckpt", "fetched", end_epoch=False)
    _paused(workdir / "pointed.ckpt", "pause", points=workdir / "points")
    assert any((workdir / "points").iterdir())
    _paused(workdir / "sampled-signalled.ckpt", "signalled", sampled=True)
    names = ("called", "requested", "fetched", "pointed", "sampled-signalled")
    return {**_resume_in_new_process(workdir, *names), **expected}


def test_a_pause_after_end_epoch_and_the_epoch_end_work_resumes_at_the_next_epoch(runs):
    # The pause holds the last step's boundary, inside the epoch; end_epoch() after it
    # left that epoch, and the pause says so (it resumed inside the epoch: two steps
    # too many). Called directly, or landed by pause_if_requested(epoch_end_done=True).
    _assert_same_as(runs["plain"], runs["called"], "pause()")
    _assert_same_as(runs["plain"], runs["requested"], "pause_if_requested")


def test_a_pause_after_the_next_epochs_first_batch_was_fetched_resumes_at_that_batch(runs):
    # No end_epoch(): the next iter() left the epoch after the boundary the pause holds.
    _assert_same_as(runs["plain"], runs["fetched"], "fetched")


def test_a_resume_point_at_that_boundary_does_not_leave_the_pause_inside_the_epoch(runs):
    # A point every STEPS steps is taken at the boundary the pause holds, before
    # end_epoch(): the states built for it are built again for the pause.
    _assert_same_as(runs["plain"], runs["pointed"], "points")


def test_epochs_a_sampler_ends_early_hold_a_pause_asked_for_in_their_last_step_after_their_work(
    runs,
):
    # RandomSampler(num_samples=...): a request during the epoch's last step lands after
    # the epoch-end work (the scheduler's step), where the loop's
    # pause_if_requested(epoch_end_done=True) is, as at any epoch's end.
    _assert_same_as(runs["sampled"], runs["sampled-signalled"], "sampled")


def test_a_loop_that_leaves_its_epochs_without_end_epoch_is_warned_once_naming_it():
    trainer = EarlyEpochs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(trainer, end_epoch=False)
    left = [w for w in caught if issubclass(w.category, UnsavedStateWarning)]
    assert len(left) == 1, [str(w.message) for w in caught]
    message = str(left[0].message)
    assert "left epoch 0 part-way, after 2 batch(es)" in message
    assert "loader.end_epoch()" in message and "docs/data-loading.md" in message


def test_a_loop_that_calls_end_epoch_or_peeks_a_batch_first_is_not_warned():
    trainer = EarlyEpochs()
    next(iter(trainer.loader))  # a look at one batch before training
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsavedStateWarning)
        train(trainer)
    assert trainer.completed_steps == early_epochs.EPOCHS * early_epochs.STEPS
