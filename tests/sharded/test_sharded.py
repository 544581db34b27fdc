"""Sharded pause directories of a model sharded by FSDP2 ``fully_shard``, in one process.

These run under a gloo process group of one rank: ``fully_shard`` needs a process
group, and one rank already makes every parameter a DTensor and every pause a
directory. The 2-rank runs are in ``test_sharded_ranks.py``.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support.fsdp_workers import FSDPTrainer, WindowFSDPTrainer
from torch import nn

from trainer_resume import run_finished
from trainer_resume.durable import load_checkpoint, save_checkpoint
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    CheckpointWriteError,
    ResumeStateMismatchError,
    RunFinishedError,
    UnsafeCheckpointError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.mixin import training_step
from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.sharded import WeightsOnlyLoadPlanner
from trainer_resume.testing import first_difference

STEPS = 5


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


def _trainer(trainers: list[FSDPTrainer], steps: int = 0) -> FSDPTrainer:
    trainer = FSDPTrainer()
    trainers.append(trainer)
    for _ in range(steps):
        trainer.step()
    return trainer


def _local(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to_local().clone() if hasattr(state, "to_local") else state.clone()
    if isinstance(state, dict):
        return {key: _local(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return [_local(value) for value in state]
    return state


def _assert_refused_unchanged(trainer: FSDPTrainer, path: Any, error: type, match: str) -> None:
    before = _local(trainer.state())
    with pytest.raises(error, match=match):
        trainer.resume(path)
    difference = first_difference(before, _local(trainer.state()))
    assert difference is None, difference.describe()
    assert not trainer.locked


@pytest.fixture
def paused(one_rank, tmp_path):
    """A pause directory after 2 steps, paused again after 3 (the committed one)."""
    trainer = _trainer(one_rank, 2)
    trainer.pause(tmp_path / "pause")
    trainer.resume(tmp_path / "pause")
    trainer.step()
    trainer.pause(tmp_path / "pause")
    return tmp_path / "pause"


@pytest.mark.parametrize("k", [0, 3])
def test_a_trainer_resumed_from_a_pause_directory_continues_bitwise_equal_to_the_uninterrupted_run(
    one_rank, tmp_path, k
):
    reference = _trainer(one_rank, STEPS)
    paused = _trainer(one_rank, k)
    paused.pause(tmp_path / "pause")
    resumed = _trainer(one_rank)
    resumed.step()  # a state any missing restore would leave behind
    resumed.resume(tmp_path / "pause")
    while resumed.completed_steps < STEPS:
        resumed.step()
    difference = first_difference(_local(reference.state()), _local(resumed.state()))
    assert difference is None, difference.describe()
    assert first_difference(reference.batches[k:], resumed.batches[1:]) is None


def test_pausing_again_commits_a_new_generation_and_only_then_removes_the_old_one(paused):
    manifest = load_checkpoint(paused / "manifest.ckpt")
    assert manifest["completed_steps"] == 3
    assert [entry for entry in os.listdir(paused) if entry.startswith("gen-")] == [
        manifest["generation"]
    ]
    assert sorted(manifest["files"]) == [
        "dcp/.metadata",
        "dcp/__0_0.distcp",
        "rank-0.ckpt",
    ]


def test_finish_retires_the_sharded_pause_after_its_marker_and_a_resume_is_refused(
    one_rank, paused
):
    trainer = _trainer(one_rank, 4)
    marker = trainer.finish(paused)
    assert os.listdir(paused) == ["run.finished"] and marker == str(paused / "run.finished")
    assert run_finished(paused).completed_steps == 4
    with pytest.raises(RunFinishedError):
        _trainer(one_rank).resume(paused)


def test_a_directory_without_a_committed_manifest_is_never_resumed(one_rank, paused):
    os.remove(paused / "manifest.ckpt")
    trainer = _trainer(one_rank, 1)
    _assert_refused_unchanged(
        trainer, paused, CheckpointFormatError, "did not complete is never resumed"
    )


def test_an_altered_dcp_metadata_pickle_is_refused_before_it_is_unpickled(
    one_rank, paused, monkeypatch
):
    from torch.distributed.checkpoint import filesystem

    generation = load_checkpoint(paused / "manifest.ckpt")["generation"]
    metadata = paused / generation / "dcp" / ".metadata"
    data = bytearray(metadata.read_bytes())
    data[-3] ^= 0x01
    metadata.write_bytes(bytes(data))
    unpickled = []
    monkeypatch.setattr(filesystem.pickle, "load", lambda *args: unpickled.append(args))
    trainer = _trainer(one_rank, 1)
    _assert_refused_unchanged(
        trainer, paused, CheckpointCorruptedError, r"\.metadata: BLAKE3 digest differs"
    )
    assert unpickled == []


def test_a_dcp_byte_entry_outside_the_weights_only_set_is_refused(tmp_path):
    import io

    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    planner = WeightsOnlyLoadPlanner(flatten_state_dict=False)
    planner.set_up_planner({"entry": None})
    item = ReadItem(
        type=LoadItemType.BYTE_IO,
        dest_index=MetadataIndex("entry"),
        dest_offsets=torch.Size([0]),
        storage_index=MetadataIndex("entry"),
        storage_offsets=torch.Size([0]),
        lengths=torch.Size([0]),
    )
    unsafe = io.BytesIO()
    torch.save({"value": os.sep.join}, unsafe)  # a function: refused by a weights-only load
    unsafe.seek(0)
    with pytest.raises(UnsafeCheckpointError, match="entry"):
        planner.load_bytes(item, unsafe)
    safe = io.BytesIO()
    torch.save({"lr": 0.5, "betas": (0.9, 0.99)}, safe)
    safe.seek(0)
    planner.load_bytes(item, safe)
    assert planner.state_dict["entry"] == {"lr": 0.5, "betas": (0.9, 0.99)}


def test_a_pause_file_of_unsharded_states_is_refused_by_a_trainer_with_a_sharded_model(
    one_rank, paused, tmp_path
):
    generation = load_checkpoint(paused / "manifest.ckpt")["generation"]
    plain = tmp_path / "plain.ckpt"
    save_checkpoint(load_checkpoint(paused / generation / "rank-0.ckpt"), plain)
    trainer = _trainer(one_rank, 1)
    _assert_refused_unchanged(
        trainer, plain, UnsupportedResumeConfigurationError, "sharded pause directory"
    )


def test_a_sharded_pause_to_a_path_that_is_a_file_is_refused_and_the_file_kept(one_rank, tmp_path):
    path = tmp_path / "pause.ckpt"
    path.write_bytes(b"previous")
    trainer = _trainer(one_rank, 1)
    with pytest.raises(CheckpointWriteError, match="is a file; a sharded pause is a directory"):
        trainer.pause(path)
    assert path.read_bytes() == b"previous"
    assert not trainer.paused


def test_a_dtensor_outside_the_sharded_objects_is_refused_before_anything_is_written(
    one_rank, tmp_path
):
    trainer = _trainer(one_rank, 1)
    trainer.extra = {"weight": trainer.model[0].weight}
    with pytest.raises(
        UnsupportedResumeConfigurationError, match=r"\['extra'\]\['weight'\] is a DTensor"
    ):
        trainer.pause(tmp_path / "pause")
    assert not (tmp_path / "pause").exists()
    assert not trainer.paused


def test_a_sharded_model_of_another_shape_is_refused_before_any_state_changes(
    one_rank, paused, monkeypatch
):
    from support import ddp_workers

    monkeypatch.setitem(ddp_workers.CONFIG, "model", {"hidden": 6, "dropout": 0.25})
    trainer = _trainer(one_rank, 1)
    monkeypatch.undo()  # the config signature is that of the paused run again
    trainer._initialize_training_resume(ddp_workers.CONFIG, version="1")
    shape = r"'0.weight' is torch.float32 \(8, 4\) in the pause"
    _assert_refused_unchanged(trainer, paused, ResumeStateMismatchError, shape)


def test_a_sharded_cpu_model_under_an_nccl_process_group_is_refused_before_anything_is_written(
    one_rank, tmp_path, monkeypatch
):
    trainer = _trainer(one_rank, 1)
    monkeypatch.setattr(dist, "get_backend", lambda *args: "nccl")  # no NCCL on a CPU build
    with pytest.raises(UnsupportedResumeConfigurationError, match="NCCL moves CUDA tensors only"):
        trainer.pause(tmp_path / "pause")
    assert not (tmp_path / "pause").exists()


def test_a_sharded_pause_is_signed_with_the_trainers_key_and_refused_under_another_key(
    one_rank, tmp_path
):
    from support import ddp_workers

    source = _trainer(one_rank, 2)
    source._initialize_training_resume(ddp_workers.CONFIG, version="1", key=b"k" * 32)
    source.pause(tmp_path / "pause")
    trainer = _trainer(one_rank, 1)
    trainer._initialize_training_resume(ddp_workers.CONFIG, version="1", key=b"x" * 32)
    _assert_refused_unchanged(trainer, tmp_path / "pause", CheckpointSignatureError, "manifest")


def test_dcp_metadata_globals_outside_the_allowlist_are_refused_before_their_module_is_imported(
    paused,
):
    import pickle
    import sys

    from trainer_resume.sharded._metadata import load_metadata

    generation = load_checkpoint(paused / "manifest.ckpt")["generation"]
    data = (paused / generation / "dcp" / ".metadata").read_bytes()
    assert load_metadata(data, "m").state_dict_metadata  # what DCP wrote reads back
    # A protocol-0 GLOBAL of a module nobody has imported: refused by name, not imported.
    assert "antigravity_xyz" not in sys.modules
    with pytest.raises(
        UnsafeCheckpointError, match=r"^\[328\] .*: m: global antigravity_xyz\.fly is not part"
    ):
        load_metadata(b"cantigravity_xyz\nfly\n(tR.", "m")
    assert "antigravity_xyz" not in sys.modules
    with pytest.raises(UnsafeCheckpointError, match=r"global \w+\.system is not part"):
        load_metadata(pickle.dumps(os.system), "m")
    with pytest.raises(CheckpointFormatError, match=r"m: holds a dict, not DCP's Metadata"):
        load_metadata(pickle.dumps({"a": 1}), "m")


def _gradients(trainer: FSDPTrainer) -> dict[str, Any]:
    return {name: _local(p.grad) for name, p in trainer.model.named_parameters()}


def test_a_sharded_model_paused_inside_an_accumulation_window_resumes_its_gradients(
    one_rank, tmp_path
):
    reference = WindowFSDPTrainer()
    one_rank.append(reference)
    for _ in range(5):
        reference.step()
    trainer = WindowFSDPTrainer()
    one_rank.append(trainer)
    for _ in range(3):
        trainer.step()  # the pause holds the first micro-batch's sharded gradients
    trainer.pause(tmp_path / "pause")
    paused = _gradients(trainer)
    assert all(grad is not None for grad in paused.values())
    resumed = WindowFSDPTrainer()
    one_rank.append(resumed)
    resumed.resume(tmp_path / "pause")
    assert first_difference(paused, _gradients(resumed)) is None
    for _ in range(2):
        resumed.step()
    difference = first_difference(_local(reference.state()), _local(resumed.state()))
    assert difference is None, difference.describe()


def test_a_sharded_resume_point_inside_an_accumulation_window_resumes_its_gradients(
    one_rank, tmp_path
):
    from support import ddp_workers

    from trainer_resume import ResumePoints

    reference = WindowFSDPTrainer()
    one_rank.append(reference)
    for _ in range(5):
        reference.step()
    trainer = WindowFSDPTrainer()
    one_rank.append(trainer)
    points = ResumePoints(tmp_path / "points", every_steps=3)
    trainer._initialize_training_resume(ddp_workers.CONFIG, version="1", resume_points=points)
    for _ in range(3):
        trainer.step()  # the point holds the first micro-batch's sharded gradients
    paused = _gradients(trainer)
    points.wait()
    trainer.step()  # the live gradients move on; the point keeps those of step 3
    resumed = WindowFSDPTrainer()
    one_rank.append(resumed)
    assert resumed.resume_latest(tmp_path / "points").endswith("point-000000000003.sharded")
    assert first_difference(paused, _gradients(resumed)) is None
    for _ in range(2):
        resumed.step()
    difference = first_difference(_local(reference.state()), _local(resumed.state()))
    assert difference is None, difference.describe()


def test_gradients_fsdp2_has_not_reduced_are_refused_when_training_starts(one_rank):
    trainer = WindowFSDPTrainer()
    one_rank.append(trainer)
    trainer.sync = False
    with pytest.raises(UnsupportedResumeConfigurationError) as refused:
        trainer.step()
    assert str(refused.value) == (
        "[332] configuration cannot be resumed exactly: the sharded model 'model.0' holds gradients "
        "FSDP2 has not reduce-scattered yet (set_requires_gradient_sync(False) inside a "
        "gradient-accumulation window): a pause cannot save them; keep gradient sync on for "
        "every micro-batch (the sharded gradients then add up in each parameter's .grad, which "
        "a pause saves)"
    )


def _pause_file(directory: Any) -> dict[str, Any]:
    [rank_file] = directory.glob("gen-*/rank-0.ckpt")
    return load_checkpoint(rank_file)


def test_a_pause_marks_a_sharded_window_open_between_optimizer_steps_and_a_resume_carries_it(
    one_rank, tmp_path
):
    window = WindowFSDPTrainer()
    one_rank.append(window)
    marked = {}
    for step in range(1, 5):
        window.step()
        window.pause(tmp_path / f"window{step}")
        marked[step] = _pause_file(tmp_path / f"window{step}").get("sharded_window", False)
        window.resume(tmp_path / f"window{step}")
    assert marked == {1: True, 2: False, 3: True, 4: False}
    # Paused again before any step of the resumed run: the window is as it was.
    for step in (3, 4):
        again = WindowFSDPTrainer()
        one_rank.append(again)
        again.resume(tmp_path / f"window{step}")
        again.pause(tmp_path / f"again{step}")
        assert _pause_file(tmp_path / f"again{step}").get("sharded_window", False) == marked[step]
    # zero_grad() first, as torchtitan's step: the gradients held at the boundary are spent.
    spent = _trainer(one_rank, 2)
    assert all(param.grad is not None for param in spent.model.parameters())
    spent.pause(tmp_path / "spent")
    assert "sharded_window" not in _pause_file(tmp_path / "spent")


class _StepFirstTrainer(FSDPTrainer):
    """Windows of two micro-batches whose optimizer step opens the next window's first
    micro-step (zeroing with ``set_to_none``), or closes each window zeroing in place."""

    step_first = True

    @training_step
    def step(self) -> None:
        x, y, _ = next(self.iterator)
        steps = self.completed_steps
        if self.step_first and steps % 2 == 0 and steps:
            self.optimizer.step()
            self.optimizer.zero_grad()
        (nn.functional.mse_loss(self.model(x), y) / 2).backward()
        if not self.step_first and steps % 2 == 1:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)  # zeros, no window


@pytest.mark.parametrize(
    ("step_first", "marked"), [(True, [True, True, True]), (False, [True, False, True])]
)
def test_a_window_is_marked_by_its_gradients_not_by_whether_the_step_ran_an_optimizer_step(
    one_rank, tmp_path, step_first, marked
):
    trainer = _StepFirstTrainer()
    trainer.step_first = step_first
    one_rank.append(trainer)
    seen = []
    for step in range(1, 4):
        trainer.step()
        trainer.pause(tmp_path / f"pause{step}")
        seen.append(_pause_file(tmp_path / f"pause{step}").get("sharded_window", False))
        trainer.resume(tmp_path / f"pause{step}")
    assert seen == marked
