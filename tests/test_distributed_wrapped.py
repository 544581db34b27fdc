"""A DDP-wrapped model returned as it is pauses on 2 ranks and resumes unwrapped on 1 process.

The 2 ranks (gloo, processes of their own) return the ``DistributedDataParallel`` wrapper from
``_resume_objects()``, whose names carry ``module.``; the pause file holds the unwrapped
module's names. One process then resumes it (the sampler allows another world size:
``WorldSizeChangeWarning``, sample-exact) with the plain module, and again with the module
wrapped in ``DataParallel``: both load the paused state exactly and continue alike.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
from support.ddp_workers import RankTrainer, describe_exits, launch, load_results
from torch import nn

from trainer_resume.distributed import WorldSizeChangeWarning
from trainer_resume.durable import load_checkpoint
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

PAUSE = 3
WORLD = 2
MORE = 4  # steps of the one process after the resume


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ddp_wrapped")
    pause_file = out / "pause.pt"
    job = {"tag": "wrapped", "steps": 9, "wrapped": True, "requests": {PAUSE: [str(pause_file), 1]}}
    codes = launch(WORLD, job, out)
    assert codes == [0, 0], describe_exits(codes, "wrapped", out)
    return {"pause_file": pause_file, "ranks": load_results(WORLD, "wrapped", out)}


class ParallelTrainer(RankTrainer):
    """The one-process trainer with its model wrapped in DataParallel (names under ``module.``)."""

    def _resume_objects(self) -> dict[str, Any]:
        return {**super()._resume_objects(), "model": nn.DataParallel(self.module)}


def _assert_equal(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _resume_on_one_process(trainer_class: type[RankTrainer], pause_file: Any) -> dict[str, Any]:
    caller_rng = random_state()
    trainer = trainer_class()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", WorldSizeChangeWarning)
            trainer.resume(pause_file)
        at_resume = copy.deepcopy(  # AdamW's step counters change in place
            {"model": trainer.module.state_dict(), "optimizer": trainer.optimizer.state_dict()}
        )
        for _ in range(MORE):
            trainer.step()
        return {
            "warnings": [str(w.message) for w in caught if w.category is WorldSizeChangeWarning],
            "at_resume": at_resume,
            "model": trainer.module.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "ids": [ids.tolist() for _, _, ids in trainer.batches],
            "completed_steps": trainer.completed_steps,
        }
    finally:
        trainer.loader.close()
        restore_random_state(caller_rng)


def test_the_pause_of_a_ddp_wrapped_model_holds_the_unwrapped_modules_names(paused):
    assert [rank["paused_at"] for rank in paused["ranks"]] == [[PAUSE], [PAUSE]]
    checkpoint = load_checkpoint(paused["pause_file"])
    saved = checkpoint["objects"]["model"]
    # The ranks recorded the state_dict() of the module inside the wrapper: its names.
    assert (
        list(saved)
        == list(paused["ranks"][0]["model"])
        == ["0.weight", "0.bias", "3.weight", "3.bias"]
    )
    _assert_equal(paused["ranks"][0]["model"], saved, "rank 0's weights at the pause")


def test_a_ddp_wrapped_pause_resumes_on_one_process_unwrapped_or_wrapped_alike(paused):
    plain = _resume_on_one_process(RankTrainer, paused["pause_file"])
    wrapped = _resume_on_one_process(ParallelTrainer, paused["pause_file"])
    for resumed in (plain, wrapped):
        assert len(resumed["warnings"]) == 1 and "sample-exact" in resumed["warnings"][0]
        # The ranks' weights and AdamW state (keyed by parameter order) as they were paused.
        _assert_equal(paused["ranks"][0]["model"], resumed["at_resume"]["model"], "weights")
        _assert_equal(paused["ranks"][0]["optimizer"], resumed["at_resume"]["optimizer"], "AdamW")
    assert plain["completed_steps"] == PAUSE * WORLD + MORE  # the step count converted to 1 rank
    _assert_equal(plain, wrapped, "the two continuations")
