"""Resume views of pause files for another world size, and the collective-free single-process path."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed as dist
from support.ddp_workers import DDPTrainer

from trainer_resume.distributed import (
    DISTRIBUTED_FORMAT,
    DISTRIBUTED_KEY,
    WorldSizeChangeWarning,
    combined_pause,
    config_of,
    converted_steps,
    rank_view,
)
from trainer_resume.durable import load_checkpoint
from trainer_resume.errors import CheckpointFormatError
from trainer_resume.rng import random_state, restore_random_state

pytestmark = pytest.mark.slow


@pytest.fixture()
def caller_rng():
    saved = random_state()
    yield
    restore_random_state(saved)


def _forbid_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a collective ran in a single process")

    for name in (
        "all_reduce",
        "all_gather_object",
        "broadcast",
        "barrier",
        "gather_object",
    ):
        monkeypatch.setattr(dist, name, refuse)


@pytest.fixture()
def paused_file(tmp_path, caller_rng, monkeypatch):
    """A single-process pause file after 4 steps, written without any collective."""
    _forbid_collectives(monkeypatch)
    trainer = DDPTrainer()
    for _ in range(4):
        trainer.step()
    trainer.request_pause(tmp_path / "pause.pt")
    trainer.step()
    assert trainer.paused
    trainer.loader.close()
    return tmp_path / "pause.pt"


def test_single_process_pause_and_resume_run_no_collective(paused_file, monkeypatch):
    _forbid_collectives(monkeypatch)
    trainer = DDPTrainer()
    trainer.resume(paused_file)
    trainer.step()
    assert trainer.completed_steps == 6
    trainer.loader.close()


def _view(checkpoint, world_size, rank, objects=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = rank_view(
            checkpoint,
            world_size=world_size,
            rank=rank,
            location="pause.pt",
            device=None,
            objects=objects or {},
        )
    return view, [w for w in caught if issubclass(w.category, WorldSizeChangeWarning)]


def test_a_single_process_file_resumed_by_two_ranks_keeps_the_global_position_and_derives_distinct_rngs(
    paused_file,
):
    checkpoint = load_checkpoint(paused_file)
    original = copy.deepcopy(checkpoint)
    (first, warned), (second, _) = _view(checkpoint, 2, 0), _view(checkpoint, 2, 1)
    again, _ = _view(checkpoint, 2, 1)
    assert len(warned) == 1 and "sample-exact, not bit-comparable" in str(warned[0].message)
    assert (
        first["loaders"] == second["loaders"] == checkpoint["loaders"]
    )  # the global cursor for every rank
    assert not torch.equal(first["rng"]["torch"], second["rng"]["torch"])
    assert torch.equal(
        second["rng"]["torch"], again["rng"]["torch"]
    )  # re-derived deterministically
    # 5 steps of one rank = 5 batches seen; two ranks see 2 per step.
    assert first["completed_steps"] == 2
    assert (
        checkpoint["completed_steps"] == original["completed_steps"] == 5
    )  # the loaded file is untouched


def test_each_rank_checks_its_own_config_where_the_ranks_signed_different_ones(paused_file):
    checkpoint = load_checkpoint(paused_file)
    own = {"loaders": checkpoint["loaders"], "extra": checkpoint["extra"], "rng": checkpoint["rng"]}
    same = config_of(checkpoint)
    other = {**same, "config_signature": "f" * 64, "config": {"device": "cpu:1"}}
    alike = combined_pause(checkpoint, [own, own], [same, same])
    assert "signed_config" not in alike[DISTRIBUTED_KEY]["ranks"][1]  # one config: the top level's
    assert _view(alike, 2, 1)[0]["config_signature"] == same["config_signature"]
    per_rank = combined_pause(checkpoint, [own, own], [same, other])
    assert per_rank["config_signature"] == same["config_signature"]  # rank 0's, as always
    for rank, expected in enumerate((same, other)):
        view, _ = _view(per_rank, 2, rank)
        assert {key: view[key] for key in expected} == expected
    malformed = copy.deepcopy(per_rank)
    malformed[DISTRIBUTED_KEY]["ranks"][1]["signed_config"] = {"config_signature": 7}
    with pytest.raises(CheckpointFormatError, match="rank 1's config is malformed"):
        _view(malformed, 2, 1)
    # A single-process file's own "config" (its canonical config) is not a rank's.
    alone = _view(checkpoint, 1, 0)[0]
    assert alone.keys() == checkpoint.keys() and alone["config"] == checkpoint["config"]


@pytest.mark.parametrize(
    ("saved_world", "new_world", "steps"), [(2, 1, 3), (2, 4, 6), (3, 2, 4), (4, 4, 7)]
)
def test_converted_steps_keep_the_samples_seen_when_the_world_size_divides_them(
    saved_world, new_world, steps
):
    new = converted_steps(steps, saved_world, new_world)
    assert new * new_world <= steps * saved_world < (new + 1) * new_world


def test_per_step_schedulers_move_to_the_converted_step_count(paused_file):
    checkpoint = load_checkpoint(paused_file)
    trainer_objects = {
        "scheduler": torch.optim.lr_scheduler.LambdaLR(
            torch.optim.SGD([torch.zeros(1)], lr=1.0), lambda s: 1.0
        )
    }
    view, _ = _view(checkpoint, 5, 0, trainer_objects)
    assert checkpoint["objects"]["scheduler"]["last_epoch"] == 5
    assert view["objects"]["scheduler"]["last_epoch"] == view["completed_steps"] == 1


def test_the_world_size_warning_says_how_far_the_per_step_schedulers_moved(paused_file):
    checkpoint = load_checkpoint(paused_file)
    trainer_objects = {
        "scheduler": torch.optim.lr_scheduler.LambdaLR(
            torch.optim.SGD([torch.zeros(1)], lr=1.0), lambda s: 1.0
        )
    }
    _, warned = _view(checkpoint, 5, 0, trainer_objects)  # 5 steps of one rank: 1 of five
    message = str(warned[0].message)
    assert (
        "the LR scheduler(s) ['scheduler'], stepped once per step, continue from step 1, not 5"
        in message
    )
    assert "has 4 more of its steps left than at the pause, so it ends later in samples" in message


def test_scheduler_steps_keep_leaves_per_step_schedulers_at_the_paused_step_and_says_so(
    paused_file,
):
    checkpoint = load_checkpoint(paused_file)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.zeros(1)], lr=1.0), lambda s: 1.0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = rank_view(
            checkpoint,
            world_size=5,
            rank=0,
            location="pause.pt",
            device=None,
            objects={"scheduler": scheduler},
            scheduler_steps="keep",
        )
    assert view["completed_steps"] == 1
    assert view["objects"]["scheduler"]["last_epoch"] == 5
    message = str(caught[0].message)
    assert "the LR scheduler(s) ['scheduler'] stay at step 5 (scheduler_steps='keep')" in message
    assert "continue from step" not in message


def test_scheduler_steps_takes_only_convert_or_keep():
    from support.trainers import TinyTrainer

    trainer = TinyTrainer()
    with pytest.raises(ValueError, match="scheduler_steps must be 'convert' or 'keep'"):
        trainer._initialize_training_resume(trainer.config, version="1", scheduler_steps="samples")
    trainer.close()


def test_a_malformed_distributed_entry_is_a_format_error(paused_file):
    checkpoint = load_checkpoint(paused_file)
    checkpoint[DISTRIBUTED_KEY] = {
        "format": DISTRIBUTED_FORMAT,
        "world_size": 2,
        "ranks": [],
        "rng_base_seed": 1,
    }
    with pytest.raises(CheckpointFormatError, match="one state per rank"):
        _view(checkpoint, 2, 0)
    checkpoint[DISTRIBUTED_KEY] = {"format": "other/1"}
    with pytest.raises(CheckpointFormatError, match="format"):
        _view(checkpoint, 2, 0)
