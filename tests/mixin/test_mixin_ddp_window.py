"""A DDP accumulation window with unused-parameter detection resumes as the uninterrupted run.

The loop (support.ddp_window): windows of 4 micro-steps, the first three under
``no_sync()``; a branch ``b`` that each rank takes at one early position of a window and
that the window's synced backward never reaches. DDP(``find_unused_parameters=True``)
averages ``b``'s gradients only because its reducer recorded ``b`` as used under
``no_sync``; a pause carries that record per rank, and ``resume()`` gives it to the
fresh reducer. ``static_graph=True`` keeps no such record; a pause inside its window
resumes where the next micro-step syncs, and is refused (359) where it would start a
fresh static-graph DDP under ``no_sync``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import ddp_window
from support.ddp_workers import describe_exits, launch
from torch.nn.parallel import DistributedDataParallel

from trainer_resume.durable import load_checkpoint
from trainer_resume.errors import DDPWindowError
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import first_difference

ALL = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]


@pytest.mark.slow
def test_two_ranks_paused_mid_window_resume_in_a_new_process_group_as_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    codes = launch(2, {"tag": "window"}, tmp_path, main=ddp_window.rank_main)
    assert codes == [0, 0], describe_exits(codes, "window", tmp_path)
    ranks = load_checkpoint(tmp_path / "pause.ckpt")["distributed"]["ranks"]
    assert [rank["ddp_window"] for rank in ranks] == [
        {"model": {"static_graph": False, "used": ALL}}
    ] * 2
    without_record = []
    for rank in (0, 1):
        result = torch.load(tmp_path / f"result_window_rank{rank}.pt", weights_only=True)
        assert result["paused_at"] == ddp_window.PAUSE
        difference = first_difference(result["uninterrupted"], result["resumed"])
        assert difference is None, (rank, difference.describe())
        without_record.append(first_difference(result["uninterrupted"], result["without_record"]))
    # Without the record the branch's gradients stay each rank's own: the run differs.
    assert any(difference is not None for difference in without_record)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    caller_rng = random_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DDP's notes on find_unused_parameters
            yield
    finally:
        dist.destroy_process_group()
        restore_random_state(caller_rng)


def _paused(path: Path, steps: int, **options: Any) -> ddp_window.WindowDDPTrainer:
    trainer = ddp_window.WindowDDPTrainer(**options)
    ddp_window.train(trainer, steps, path)
    assert trainer.completed_steps == steps
    return trainer


@pytest.mark.usefixtures("one_rank")
def test_a_pause_records_the_parameters_the_reducer_found_used_in_the_open_window_only(
    tmp_path: Path,
) -> None:
    # Rank 0 takes branch b at a window's first position, a at the others; c always.
    records = {}
    for steps in (5, 6, 8):
        _paused(tmp_path / f"{steps}.ckpt", steps)
        records[steps] = load_checkpoint(tmp_path / f"{steps}.ckpt").get("ddp_window")
    assert records == {
        5: {"model": {"static_graph": False, "used": ["b.weight", "b.bias", "c.weight", "c.bias"]}},
        6: {"model": {"static_graph": False, "used": ALL}},
        8: None,  # at a window's end the synced backward emptied the reducer's record
    }


class _Undetecting(ddp_window.WindowDDPTrainer):
    """The same loop with a DDP wrapper that does not detect unused parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.model = DistributedDataParallel(self.module)


@pytest.mark.usefixtures("one_rank")
def test_a_recorded_window_without_a_wrapper_that_detects_unused_parameters_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    _paused(tmp_path / "pause.ckpt", 6)
    trainer = _Undetecting()
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    with pytest.raises(DDPWindowError) as refused:
        trainer.resume(tmp_path / "pause.ckpt")
    assert str(refused.value) == (
        f"[359] a DistributedDataParallel accumulation window cannot be resumed exactly here: "
        f"{tmp_path / 'pause.ckpt'} was paused inside a gradient-accumulation window of 'model' "
        "wrapped by DistributedDataParallel(find_unused_parameters=True), whose reducer's record "
        "of the parameters used in the window moves with the pause, but _Undetecting holds no "
        "such wrapper of 'model'; wrap it the same way before resume() and hold the wrapper in an "
        "attribute (self.model = DistributedDataParallel(...)) or return it from _resume_objects()"
    )
    assert first_difference(before, trainer.module.state_dict()) is None
    assert not trainer.locked and trainer.completed_steps == 0


@pytest.mark.usefixtures("one_rank")
def test_resume_into_a_wrapper_whose_reducer_is_inside_a_window_of_its_own_is_refused(
    tmp_path: Path,
) -> None:
    _paused(tmp_path / "end.ckpt", 8)  # at a window's end: nothing recorded
    trainer = _paused(tmp_path / "mid.ckpt", 5)  # its reducer marked b and c since
    with pytest.raises(DDPWindowError) as refused:
        trainer.resume(tmp_path / "end.ckpt")
    assert "(its reducer marked ['b.bias', 'b.weight', 'c.bias'] used" in str(refused.value)
    assert not trainer.locked and trainer.completed_steps == 5
    trainer.resume(tmp_path / "mid.ckpt")  # its own window: the same record
    assert trainer.completed_steps == 5


@pytest.mark.usefixtures("one_rank")
def test_a_static_graph_window_resumes_where_the_next_step_syncs_and_is_refused_where_it_does_not(
    tmp_path: Path,
) -> None:
    options = {"static_graph": True, "warm_up": True}
    total = ddp_window.TOTAL + 1
    uninterrupted = ddp_window.WindowDDPTrainer(**options)
    ddp_window.train(uninterrupted, total)
    # The warm-up step, then windows at steps 2-5, 6-9, 10-13: step 9 is the second's synced one.
    _paused(tmp_path / "before-sync.ckpt", 8, **options)
    _paused(tmp_path / "mid.ckpt", 7, **options)
    assert load_checkpoint(tmp_path / "before-sync.ckpt")["ddp_window"] == {
        "model": {"static_graph": True, "used": []}
    }
    resumed = ddp_window.WindowDDPTrainer(**options)
    resumed.resume(tmp_path / "before-sync.ckpt")
    ddp_window.train(resumed, total)
    difference = first_difference(
        ddp_window.outcome(uninterrupted, 8), ddp_window.outcome(resumed, 8)
    )
    assert difference is None, difference.describe()
    refused = ddp_window.WindowDDPTrainer(**options)
    refused.resume(tmp_path / "mid.ckpt")
    with pytest.raises(DDPWindowError, match=r"^\[359\] .*static_graph=True\), and the first"):
        refused.step()


@pytest.mark.usefixtures("one_rank")
def test_a_wrapper_first_met_at_a_pause_inside_a_window_is_refused_and_seen_from_its_next_sync(
    tmp_path: Path,
) -> None:
    trainer = ddp_window.WindowDDPTrainer()
    ddp_window.train(trainer, 4)  # the first window, ended
    trainer.model = DistributedDataParallel(trainer.module, find_unused_parameters=True)
    ddp_window.train(trainer, 5)
    with pytest.raises(DDPWindowError) as refused:
        trainer.pause(tmp_path / "mid.ckpt")
    assert str(refused.value) == (
        "[359] a DistributedDataParallel accumulation window cannot be resumed exactly here: the "
        "DistributedDataParallel wrapper of 'model' was not held by the trainer when training "
        "started, so the parameters its reducer found used in the window its gradients are in "
        "were not seen; build the wrapper and hold it in an attribute before the first "
        "@training_step (it is seen from its next synced backward on, so a pause after the "
        "window's end is exact)"
    )
    assert not (tmp_path / "mid.ckpt").exists() and not trainer.paused
    ddp_window.train(trainer, 9, tmp_path / "next.ckpt")  # past the window's synced step
    assert trainer.paused and load_checkpoint(tmp_path / "next.ckpt")["ddp_window"] == {
        "model": {"static_graph": False, "used": ["b.weight", "b.bias", "c.weight", "c.bias"]}
    }
