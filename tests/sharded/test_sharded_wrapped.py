"""Sharded pauses of a model whose blocks are wrapped as torchtitan wraps them: activation
checkpointing (``checkpoint_wrapper``), then ``torch.compile`` replacing the block, then
``fully_shard``.

DCP names the saved tensors as the unwrapped model does; the live model's names carry
``_orig_mod.`` and ``_checkpoint_wrapped_module.``. Both are compared, and the gradients
the pause carries are saved, under the unwrapped names, so a pause resumes into the blocks
wrapped the same way (bit-identically) or otherwise (the paused state, exactly). One
gloo rank, as in ``test_sharded.py``: in this process for checkpoint-wrapped blocks, in
``support/compiled_runs.py`` for compiled ones (skipped with the reason where no compiler
works).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support.compiled_runs import run_in_new_process
from support.fsdp_workers import CheckpointedTrainer, FSDPTrainer, by_parameter_order

from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.sharded.read import open_pause
from trainer_resume.testing import first_difference

STEPS = 5  # as compiled_runs.py's sharded job
PAUSE = 2
PLAIN_PARAMETERS = ["0.weight", "0.bias", "3.weight", "3.bias"]  # the rank trainer's two Linears


@pytest.fixture
def one_rank(tmp_path):
    caller_rng = random_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    trainers: list[FSDPTrainer] = []
    try:
        yield trainers
    finally:
        for trainer in trainers:
            trainer.loader.close()
        trainers.clear()
        dist.destroy_process_group()
        # The trainers' meshes and groups go now: garbage collected in a loader worker
        # that a later test forks would hang or abort it.
        gc.collect()
        restore_random_state(caller_rng)


def _trainer(trainers: list[FSDPTrainer], kind: type[FSDPTrainer], steps: int = 0) -> FSDPTrainer:
    trainer = kind()
    trainers.append(trainer)
    for _ in range(steps):
        trainer.step()
    return trainer


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _saved_gradient_names(path: Any) -> list[str]:
    prefix = "gradients.model."
    index = open_pause(path, key=None).metadata.state_dict_metadata
    return [key[len(prefix) :] for key in index if key.startswith(prefix)]


def _pause_and_resume(
    trainers: list[FSDPTrainer], paused_kind: type, resumed_kind: type, path: Any
) -> tuple[dict[str, Any], FSDPTrainer]:
    paused = _trainer(trainers, paused_kind, PAUSE)
    paused.pause(path)
    at_pause = by_parameter_order(paused)
    resumed = _trainer(trainers, resumed_kind, 1)  # a state any missing restore would leave
    resumed.resume(path)
    _assert_same(
        at_pause, by_parameter_order(resumed), f"{resumed_kind.__name__} right after the resume"
    )
    return at_pause, resumed


def test_checkpoint_wrapped_blocks_pause_their_gradients_under_the_plain_names_and_resume_bitwise_equal(
    one_rank, tmp_path
):
    reference = _trainer(one_rank, CheckpointedTrainer, STEPS)
    _, resumed = _pause_and_resume(
        one_rank, CheckpointedTrainer, CheckpointedTrainer, tmp_path / "p"
    )
    assert sorted(_saved_gradient_names(tmp_path / "p")) == sorted(PLAIN_PARAMETERS)
    while resumed.completed_steps < STEPS:
        resumed.step()
    _assert_same(by_parameter_order(reference), by_parameter_order(resumed), "at the end")


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``compiled_runs.py sharded``: compiled blocks paused and resumed across wrappings, in a
    process of its own (so no compiler thread lives on in this one)."""
    workdir = tmp_path_factory.mktemp("sharded_compiled")
    reason = run_in_new_process("sharded", workdir)
    if reason is not None:
        pytest.skip(reason)
    return {"workdir": workdir, **torch.load(workdir / "sharded.pt", weights_only=True)}


@pytest.mark.slow
def test_compiled_blocks_resume_compiled_bitwise_equal_to_the_uninterrupted_run(compiled_runs):
    case = compiled_runs["compiled->compiled"]
    _assert_same(case["at_pause"], case["at_resume"], "right after the resume")
    _assert_same(compiled_runs["uninterrupted"], case["end"], "at the end")
    saved = _saved_gradient_names(compiled_runs["workdir"] / "sharded-compiled-compiled")
    assert sorted(saved) == sorted(PLAIN_PARAMETERS)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["compiled->checkpointed", "compiled->plain", "plain->compiled"])
def test_compiled_and_eager_blocks_resume_each_others_pause_with_the_paused_state(
    compiled_runs, case
):
    resumed = compiled_runs[case]
    _assert_same(resumed["at_pause"], resumed["at_resume"], "right after the resume")
    assert resumed["end"]["steps"] == STEPS
    assert all(torch.isfinite(weight).all() for weight in resumed["end"]["weights"])


def test_a_sharded_pause_saved_under_the_wrappers_names_is_refused_by_the_pause_itself(
    one_rank, tmp_path, monkeypatch
):
    from trainer_resume.errors import PauseNotResumableError
    from trainer_resume.sharded import write

    real = write.dcp_state

    def wrapper_names(objects, sharded):  # the mapping broken on purpose: live names kept
        state = real(objects, sharded)
        state["models"] = {
            name: {f"_checkpoint_wrapped_module.{key}": value for key, value in model.items()}
            for name, model in state["models"].items()
        }
        return state

    monkeypatch.setattr(write, "dcp_state", wrapper_names)
    trainer = _trainer(one_rank, CheckpointedTrainer, PAUSE)
    with pytest.raises(PauseNotResumableError) as refused:
        trainer.pause(tmp_path / "p")
    assert "missing from the checkpoint" in str(refused.value)
    assert "_checkpoint_wrapped_module.0.weight" in str(refused.value)
