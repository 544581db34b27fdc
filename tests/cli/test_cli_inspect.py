"""``trainer-resume inspect``: what each kind of file holds, and clean refusals of bad files."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from support.checkpoint_makers import (
    BATCH_SIZE,
    DATASET_SIZE,
    DISTRIBUTED_PAUSE_STEP,
    LIGHTNING_PAUSE_STEP,
    STEPS,
    MixinTrainer,
    distributed_pause,
    lightning_checkpoints,
    lightning_pause,
    mixin_pause,
    resume_point_directory,
)
from support.cli import run_cli

from trainer_resume.cli import main
from trainer_resume.durable import save_checkpoint
from trainer_resume.errors import SkippedCheckpointWarning
from trainer_resume.finished import mark_finished
from trainer_resume.resume_points.files import latest_checkpoint


def assert_clean_error(result, code: int) -> None:
    assert result.returncode == 3, result
    assert result.stderr.startswith(f"error [{code}]: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def inspect_text(path, capsys) -> list[str]:
    assert main(["inspect", str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def inspect_json(path, capsys) -> dict:
    assert main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def field(lines: list[str], label: str) -> str:
    """The value printed after ``label`` in the report's header block."""
    found = [line[len(label) :].strip() for line in lines if line.startswith(label + "  ")]
    assert len(found) == 1, (label, lines)
    return found[0]


def row(lines: list[str], first: str) -> list[str]:
    found = [line.split() for line in lines if line.split()[:1] == [first]]
    assert len(found) == 1, (first, lines)
    return found[0]


def state_size(state: dict[str, torch.Tensor]) -> tuple[int, int]:
    return len(state), sum(t.numel() * t.element_size() for t in state.values())


def keys_line(state: dict[str, torch.Tensor], name: str) -> str:
    """The text report's line of a module's key count and first 3 keys."""
    first = ", ".join(repr(key) for key in list(state)[:3])
    return f"  {name}: {len(state)} keys: {first} and {len(state) - 3} more"


def module_entry(state: dict[str, torch.Tensor]) -> dict:
    """What the JSON says of a module's state: tensors, bytes, its key count and first 3 keys,
    and its modes (every submodule training, nothing frozen)."""
    tensors, size = state_size(state)
    return {
        "tensors": tensors,
        "bytes": size,
        "shared": False,
        "keys": len(state),
        "first_keys": list(state)[:3],
        "eval": [],
        "frozen": [],
        "untracked": [],
    }


# ---------------------------------------------------------------------- mixin pause files


def test_inspect_shows_steps_objects_loader_position_with_units_rng_and_extra_keys(
    tmp_path_factory, tmp_path
):
    path, weights = mixin_pause(tmp_path_factory)
    result = run_cli("inspect", str(path), cwd=tmp_path)  # the console script itself
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert field(lines, "kind") == "pause file (TrainingResumeMixin)"
    assert field(lines, "integrity").startswith("ok: marker, length and BLAKE3 digest ")
    assert field(lines, "integrity").endswith(" verified")
    assert field(lines, "file format") == "version 2"
    assert field(lines, "steps") == f"completed_steps {STEPS}"
    assert field(lines, "module version") == "inspect-test/1"
    assert field(lines, "processes") == "1"
    tensors, size = state_size(weights)  # parameters and BatchNorm buffers
    assert row(lines, "model")[:3] == ["model", str(tensors), f"{size:,}"]
    assert keys_line(weights, "model") in lines
    # Adam after a step: step, exp_avg, exp_avg_sq per parameter.
    assert row(lines, "optimizer")[1] == str(3 * 6)
    consumed = STEPS * BATCH_SIZE
    cycle, offset = divmod(consumed, DATASET_SIZE)
    assert row(lines, "train") == [
        "train",
        str(consumed),
        str(cycle),
        str(offset),
        "samples",
        str(STEPS),
        "1",
    ]
    assert "  python       Mersenne Twister, position 624" in lines
    assert "extra state keys: seen, warmed_up" in lines


def test_inspect_json_reports_the_same_facts(tmp_path_factory, capsys):
    path, weights = mixin_pause(tmp_path_factory)
    summary = inspect_json(path, capsys)
    assert (summary["kind"], summary["verified"]) == ("pause", True)
    assert summary["completed_steps"] == STEPS
    assert summary["steps"] == {"completed_steps": STEPS}
    assert summary["file_bytes"] == os.path.getsize(path)
    assert summary["objects"]["model"] == module_entry(weights)
    consumed = STEPS * BATCH_SIZE
    assert summary["loaders"]["train"] == {
        "consumed": consumed,
        "cycle": consumed // DATASET_SIZE,
        "offset": consumed % DATASET_SIZE,
        "num_replicas": 1,
        "offset_unit": "samples",
        "delivered_batches": STEPS,
        "sampler_format": "trainer_resume.sampler/1",
    }
    assert summary["rng"]["saved"] is True and summary["rng"]["processes"] == 1
    assert summary["extra"] == ["seen", "warmed_up"]
    assert len(summary["config_signature"]) == 64


def test_inspect_shows_module_modes_and_optimizer_classes_that_state_dicts_leave_out(
    tmp_path, capsys
):
    trainer = MixinTrainer()
    trainer.model[1].eval()  # a frozen BatchNorm
    trainer.model[0].weight.requires_grad_(False)
    trainer.model[1].track_running_stats = False
    trainer.step()
    path = tmp_path / "pause.ckpt"
    trainer.pause(path)
    trainer.loader.close()
    lines = inspect_text(path, capsys)
    assert row(lines, "optimizer")[-1] == "torch.optim.adam.Adam"
    assert (
        "  model: in eval mode: 1; frozen (requires_grad=False): 0.weight; "
        "no running statistics (track_running_stats=False): 1"
    ) in lines
    summary = inspect_json(path, capsys)
    assert summary["objects"]["model"]["eval"] == ["1"]
    assert summary["objects"]["model"]["frozen"] == ["0.weight"]
    assert summary["objects"]["model"]["untracked"] == ["1"]
    assert summary["objects"]["optimizer"]["class"] == "torch.optim.adam.Adam"
    assert "class" not in summary["objects"]["model"]


def test_inspect_shows_a_sharded_loaders_global_position(tmp_path_factory, capsys):
    path, _ = mixin_pause(tmp_path_factory, num_replicas=2)  # rank 0's half of a 2-rank stream
    summary = inspect_json(path, capsys)
    assert summary["world_size"] == 1
    # The cursor is global: each delivered batch of rank 0 stands for one batch of every rank.
    assert summary["loaders"]["train"]["consumed"] == STEPS * BATCH_SIZE * 2
    assert summary["loaders"]["train"]["num_replicas"] == 2


def test_a_sharded_batch_samplers_stream_is_shown_sharded_over_the_pauses_processes():
    # Its state keeps no rank count (it loads with any): the processes that paused are it.
    from torch.utils.data import BatchSampler, RandomSampler

    from trainer_resume.cli.describe import loader_positions
    from trainer_resume.loaders import ResumableDataLoader, ShardedBatchSampler

    data = list(range(16))
    batches = BatchSampler(RandomSampler(data), batch_size=2, drop_last=True)
    loader = ResumableDataLoader(
        data,
        batch_sampler=ShardedBatchSampler(batches, num_replicas=2, rank=0),
        resumable=True,
    )
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    (position,) = loader_positions({"train": state}, world_size=2).values()
    assert position["num_replicas"] == 2  # its settings' num_replicas (DistributedSampler's) is 1
    loader.close()


@pytest.mark.slow
def test_inspect_of_a_distributed_pause_shows_every_process(tmp_path_factory, capsys):
    path, weights = distributed_pause(tmp_path_factory)
    lines = inspect_text(path, capsys)
    assert field(lines, "processes") == "2"
    assert field(lines, "steps") == f"completed_steps {DISTRIBUTED_PAUSE_STEP}"
    assert "rng (main process of each of 2 ranks; rank 0)" in lines
    summary = inspect_json(path, capsys)
    assert summary["world_size"] == 2
    assert summary["rng"]["processes"] == 2
    assert summary["objects"]["model"] == module_entry(weights)
    # 2 ranks x 2 samples per step: the global cursor.
    assert summary["loaders"]["train"]["consumed"] == DISTRIBUTED_PAUSE_STEP * 2 * 2


@pytest.mark.slow
def test_inspect_of_a_distributed_pause_whose_ranks_signed_different_configs_shows_each(
    tmp_path_factory, capsys
):
    from trainer_resume.distributed import DISTRIBUTED_KEY, combined_pause, config_of
    from trainer_resume.durable import load_checkpoint

    path, _ = distributed_pause(tmp_path_factory)
    checkpoint = load_checkpoint(path)
    ranks = checkpoint.pop(DISTRIBUTED_KEY)["ranks"]
    own = config_of(checkpoint)
    other = {**own, "config_signature": "f" * 64, "config": {"device": "cpu:1"}}
    per_rank = tmp_path_factory.mktemp("per_rank") / "pause.ckpt"
    save_checkpoint(combined_pause(checkpoint, ranks, [own, other]), per_rank)
    lines = inspect_text(per_rank, capsys)
    assert field(lines, "config signatures") == (
        f"one per rank (the ranks' configs differ): rank 0 {own['config_signature']}, "
        f"rank 1 {'f' * 64}"
    )
    assert inspect_json(per_rank, capsys)["rank_config_signatures"] == [
        own["config_signature"],
        "f" * 64,
    ]
    assert field(inspect_text(path, capsys), "config signature") == own["config_signature"]


def test_inspect_of_a_resume_point_directory_lists_points_and_describes_the_newest(
    tmp_path_factory, capsys
):
    directory = resume_point_directory(tmp_path_factory)
    output = inspect_text(directory, capsys)
    blank = output.index("")
    lines, newest = output[:blank], output[blank + 1 :]  # the directory, then its newest file
    assert field(lines, "kind") == "resume-point directory"
    assert field(lines, "resume points") == (
        "point-000000000004.ckpt (step 4), point-000000000002.ckpt (step 2)"
    )
    assert field(lines, "pause files") == f"pause.ckpt (step {STEPS})"
    assert field(lines, "finished") == "no"
    assert field(lines, "newest valid") == "pause.ckpt, below"
    assert field(newest, "kind") == "pause file (TrainingResumeMixin)"
    assert field(newest, "steps") == f"completed_steps {STEPS}"
    summary = inspect_json(directory, capsys)
    assert [p["completed_steps"] for p in summary["points"]] == [4, 2]
    assert summary["newest"]["steps"] == {"completed_steps": STEPS}
    point = inspect_json(directory / "point-000000000004.ckpt", capsys)
    assert (point["description"], point["steps"]) == (
        "resume point (TrainingResumeMixin)",
        {"completed_steps": 4},
    )


def test_inspect_of_a_directory_names_as_newest_the_point_resume_latest_takes(
    tmp_path_factory, tmp_path, capsys
):
    # A point copied under a newer point's name holds an older step: resume_latest skips
    # it, and so does the description of the directory.
    source = resume_point_directory(tmp_path_factory)
    for name in ("point-000000000002.ckpt", "point-000000000004.ckpt"):
        shutil.copyfile(source / name, tmp_path / name)
    shutil.copyfile(source / "point-000000000002.ckpt", tmp_path / "point-000000000009.ckpt")
    with pytest.warns(SkippedCheckpointWarning, match="its name says 9"):
        taken = latest_checkpoint(tmp_path)
    assert taken == str(tmp_path / "point-000000000004.ckpt")
    output = inspect_text(tmp_path, capsys)
    blank = output.index("")
    lines, newest = output[:blank], output[blank + 1 :]
    assert field(lines, "newest valid") == "point-000000000004.ckpt, below"
    assert (
        f"  skipped {tmp_path / 'point-000000000009.ckpt'}: it holds step 2, its name says 9 "
        "(copied or renamed)"
    ) in lines
    assert field(newest, "steps") == "completed_steps 4"


def test_inspect_of_an_empty_directory_fails_with_code_321(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 3
    assert capsys.readouterr().err.startswith("error [321]: ")


# ---------------------------------------------------------------------- Lightning files


def test_inspect_of_a_lightning_pause_file_shows_global_step_loader_rng_and_config(
    tmp_path_factory, capsys
):
    path, weights = lightning_pause(tmp_path_factory)
    lines = inspect_text(path, capsys)
    assert field(lines, "kind") == "Lightning pause file (ResumeCallback)"
    assert field(lines, "integrity").startswith("ok: ")
    assert field(lines, "steps") == f"global_step {LIGHTNING_PAUSE_STEP}"
    assert field(lines, "epoch") == "0"
    assert len(field(lines, "config signature")) == 64
    tensors, size = state_size(weights)
    assert row(lines, "state_dict")[:3] == ["state_dict", str(tensors), f"{size:,}"]
    assert keys_line(weights, "state_dict") in lines
    consumed = LIGHTNING_PAUSE_STEP * BATCH_SIZE
    assert row(lines, "train")[1:7] == [
        "0",
        str(consumed),
        str(consumed // (2 * DATASET_SIZE)),
        str(consumed % (2 * DATASET_SIZE)),
        "samples",
        str(LIGHTNING_PAUSE_STEP),
    ]
    assert any(line.startswith("  torch        CPU generator") for line in lines)
    assert "  state_dict: every submodule in training mode, no parameter frozen" in lines
    summary = inspect_json(path, capsys)
    assert (
        summary["objects"]["state_dict"]["eval"],
        summary["objects"]["state_dict"]["frozen"],
    ) == ([], [])
    assert (summary["kind"], summary["steps"], summary["epoch"]) == (
        "lightning pause",
        {"global_step": LIGHTNING_PAUSE_STEP},
        0,
    )
    assert summary["loaders"]["train 0"]["consumed"] == consumed
    assert summary["rng"]["saved"] is True
    assert summary["config"] == {"lr": 0.01}


def test_inspect_of_a_directory_holding_a_lightning_pause_file_describes_it(
    tmp_path_factory, tmp_path, capsys
):
    path, _ = lightning_pause(tmp_path_factory)
    (tmp_path / "pause.ckpt").write_bytes(path.read_bytes())
    output = inspect_text(tmp_path, capsys)
    blank = output.index("")
    lines, newest = output[:blank], output[blank + 1 :]
    assert field(lines, "pause files") == f"pause.ckpt (step {LIGHTNING_PAUSE_STEP})"
    assert field(lines, "resume points") == "none"
    assert field(newest, "kind") == "Lightning pause file (ResumeCallback)"


def test_inspect_of_plain_and_durable_lightning_checkpoints(tmp_path_factory, capsys):
    plain, durable = lightning_checkpoints(tmp_path_factory)
    lines = inspect_text(plain, capsys)
    assert field(lines, "kind") == "Lightning checkpoint"
    assert field(lines, "integrity") == "not verified: no trainer-resume header"
    assert field(lines, "steps") == f"global_step {LIGHTNING_PAUSE_STEP}"
    assert "rng: not saved" in lines
    summary = inspect_json(plain, capsys)
    assert (summary["verified"], summary["not_verified"]) == (
        False,
        "not verified: no trainer-resume header",
    )
    assert summary["rng"] == {"saved": False}
    durable_lines = inspect_text(durable, capsys)
    assert field(durable_lines, "kind") == "Lightning checkpoint"
    assert field(durable_lines, "integrity").startswith("ok: marker, length and ")
    assert field(durable_lines, "steps") == f"global_step {LIGHTNING_PAUSE_STEP}"
    verified = inspect_json(durable, capsys)
    assert (verified["kind"], verified["verified"]) == ("lightning", True)
    assert verified["steps"] == {"global_step": LIGHTNING_PAUSE_STEP}
    assert verified["objects"] == summary["objects"]


# ---------------------------------------------------------------------- other files


def test_inspect_of_plain_torch_save_file_describes_it_unverified(tmp_path, capsys):
    plain = tmp_path / "plain.pt"
    state = {"model": {"weight": torch.ones(3)}, "global_step": torch.tensor(40), "epoch": 2}
    torch.save(state, plain)
    lines = inspect_text(plain, capsys)
    assert field(lines, "kind") == "torch.save file"
    assert field(lines, "integrity") == "not verified: no trainer-resume header"
    assert field(lines, "steps") == "global_step 40, epoch 2"
    assert row(lines, "model") == ["model", "dict", "1", "12", "B"]
    assert ["epoch", "int", "0", "0", "B", "2"] in [line.split() for line in lines]  # entry table
    summary = inspect_json(plain, capsys)
    assert summary["steps"] == {"global_step": 40, "epoch": 2}
    assert summary["entries"]["model"] == {"type": "dict", "tensors": 1, "bytes": 12}


def test_inspect_of_a_safetensors_file_lists_its_tensors_from_the_header(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"weight": torch.zeros(2, 3), "steps": torch.tensor(7)}, path)
    lines = inspect_text(path, capsys)
    assert field(lines, "kind") == "safetensors file"
    assert field(lines, "integrity") == "not verified: no trainer-resume header"
    assert row(lines, "weight") == ["weight", "F32[2,3]", "1", "24", "B"]
    summary = inspect_json(path, capsys)
    assert summary["entries"]["steps"] == {
        "type": "Tensor",
        "dtype": "I64",
        "shape": [],
        "tensors": 1,
        "bytes": 8,
    }


def test_inspect_of_finished_marker_says_the_run_is_finished(tmp_path_factory, tmp_path, capsys):
    path, _ = mixin_pause(tmp_path_factory)
    copy = tmp_path / "run.ckpt"
    copy.write_bytes(path.read_bytes())
    marker = mark_finished(copy, completed_steps=12)
    lines = inspect_text(marker, capsys)
    assert field(lines, "kind").startswith("finished marker")
    assert field(lines, "steps") == "completed_steps 12"
    summary = inspect_json(marker, capsys)
    assert (summary["kind"], summary["verified"], summary["steps"]) == (
        "finished",
        True,
        {"completed_steps": 12},
    )


def test_inspect_of_a_directory_holding_a_pause_files_finished_marker_says_finished(
    tmp_path_factory, tmp_path, capsys
):
    path, _ = mixin_pause(tmp_path_factory)
    copy = tmp_path / "pause.ckpt"
    copy.write_bytes(path.read_bytes())
    mark_finished(copy, completed_steps=12)  # retires the pause file
    lines = inspect_text(tmp_path, capsys)
    assert field(lines, "finished") == "yes (pause.ckpt.finished): nothing to resume"
    assert field(lines, "pause files") == "none"
    copy.write_bytes(path.read_bytes())  # a finish stopped before it retired the pause file
    summary = inspect_json(tmp_path, capsys)
    assert summary["finished"] == "pause.ckpt.finished"
    assert [entry["file"] for entry in summary["pause_files"]] == ["pause.ckpt"]
    assert summary["skipped"] == []


def test_inspect_of_a_file_holding_unsafe_objects_fails_with_code_328(tmp_path, capsys):
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"when": os.times()}, unsafe)  # a posix.times_result: not in the weights-only set
    assert main(["inspect", str(unsafe)]) == 3
    error = capsys.readouterr().err
    assert error.startswith("error [328]: ") and error.count("\n") == 1
    assert (
        "posix.times_result" in error
    )  # what was refused, not torch's advice to disable the check
    assert "weights_only" not in error


def test_inspect_of_truncated_file_fails_with_code_322(tmp_path_factory, tmp_path):
    path, _ = mixin_pause(tmp_path_factory)
    truncated = tmp_path / "truncated.ckpt"
    data = path.read_bytes()
    truncated.write_bytes(data[: len(data) - 100])
    assert_clean_error(run_cli("inspect", str(truncated), cwd=tmp_path), 322)


def test_inspect_of_bit_flipped_file_fails_with_code_322(tmp_path_factory, tmp_path, capsys):
    path, _ = mixin_pause(tmp_path_factory)
    flipped = tmp_path / "flipped.ckpt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    assert main(["inspect", str(flipped)]) == 3
    assert capsys.readouterr().err.startswith("error [322]: ")


def test_inspect_of_random_file_fails_with_code_321(tmp_path):
    foreign = tmp_path / "random.bin"
    foreign.write_bytes(os.urandom(4096))
    assert_clean_error(run_cli("inspect", str(foreign), cwd=tmp_path), 321)


def test_inspect_of_missing_file_fails_without_traceback(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "absent.ckpt")]) == 3
    assert capsys.readouterr().err == f"error: no such file: {tmp_path / 'absent.ckpt'}\n"


def test_inspect_verifies_signature_with_key_file_and_refuses_wrong_key(tmp_path, capsys):
    signed = tmp_path / "signed.ckpt"
    save_checkpoint({"weights": torch.zeros(4)}, signed, key=b"the right key, 16+ bytes")
    (tmp_path / "right").write_bytes(b"the right key, 16+ bytes")
    (tmp_path / "wrong").write_bytes(b"the wrong key, 16+ bytes")

    assert main(["inspect", str(signed), "--key-file", str(tmp_path / "right")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert field(lines, "signature") == "verified with the key file"
    assert row(lines, "weights")[:5] == ["weights", "Tensor", "1", "16", "B"]
    assert main(["inspect", str(signed), "--key-file", str(tmp_path / "wrong")]) == 3
    assert capsys.readouterr().err.startswith("error [339]: ")


# ---------------------------------------------------------------------- sharded pauses


SHARDED_STEPS = 3


@pytest.fixture
def sharded_pause(tmp_path):
    """A sharded pause directory of an FSDP2 model, paused by a one-rank gloo group."""
    import torch.distributed as dist
    from support.ddp_workers import BATCH
    from support.fsdp_workers import FSDPTrainer

    from trainer_resume.rng import random_state, restore_random_state

    caller_rng = random_state()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        trainer = FSDPTrainer()
        for _ in range(SHARDED_STEPS):
            trainer.step()
        trainer.pause(tmp_path / "pause")
        trainer.loader.close()
        full = {name: value.full_tensor() for name, value in trainer.model.state_dict().items()}
        torch.save(full, tmp_path / "model_state.pt")  # what an export gathers
    finally:
        dist.destroy_process_group()
        restore_random_state(caller_rng)
    return tmp_path / "pause", BATCH


def test_inspect_of_a_sharded_pause_directory_verifies_every_file_and_shows_its_state(
    sharded_pause, capsys
):
    path, batch = sharded_pause
    lines = inspect_text(path, capsys)
    assert field(lines, "kind") == "sharded pause directory (FSDP2/DCP)"
    assert field(lines, "integrity").startswith("ok: marker, length and BLAKE3 digest ")
    assert field(lines, "steps") == f"completed_steps {SHARDED_STEPS}"
    assert field(lines, "processes") == "1"
    assert field(lines, "files").startswith("3 files, ")
    assert field(lines, "files").endswith("every file matches its BLAKE3 digest in the manifest")
    assert field(lines, "sharded") == "model (optimizer)"
    assert len(field(lines, "config signature")) == 64
    assert row(lines, "model")[1:4] == ["in", "DCP", "shards"]
    assert "  model: every submodule in training mode, no parameter frozen" in lines
    assert "sharded models' own buffers per process: model 0" in lines  # Linear layers only
    assert row(lines, "train")[1] == str(SHARDED_STEPS * batch)
    assert row(lines, "train")[4] == "samples"
    assert "  python       Mersenne Twister, position 624" in lines
    summary = inspect_json(path, capsys)
    assert (summary["kind"], summary["verified"]) == ("sharded pause", True)
    assert summary["steps"] == {"completed_steps": SHARDED_STEPS}
    assert summary["world_size"] == 1
    assert sorted(summary["files"]) == ["dcp/.metadata", "dcp/__0_0.distcp", "rank-0.ckpt"]
    on_disk = sum(
        os.path.getsize(os.path.join(path, summary["generation"], name))
        for name in summary["files"]
    )
    assert summary["files_bytes"] == on_disk
    assert summary["file_bytes"] == on_disk + os.path.getsize(path / "manifest.ckpt")
    assert summary["loaders"]["train"]["consumed"] == SHARDED_STEPS * batch
    assert summary["loaders"]["train"]["delivered_batches"] == SHARDED_STEPS
    assert summary["rng"]["saved"] is True and summary["rng"]["processes"] == 1
    assert summary["objects"]["model"]["tensors"] is None
    # Its names, from DCP's index: the two Linears of the rank trainer's Sequential.
    assert summary["objects"]["model"]["keys"] == 4
    assert summary["objects"]["model"]["first_keys"] == ["0.weight", "0.bias", "3.weight"]


def test_inspect_of_a_sharded_models_points_directory_describes_what_resume_latest_takes(
    sharded_pause, tmp_path, capsys
):
    from trainer_resume.resume_points.sharded_points import committed_sharded

    path, _ = sharded_pause
    points = tmp_path / "points"
    points.mkdir()
    shutil.copytree(path, points / "point-000000000003.sharded")
    shutil.copytree(path, points / "pause")  # a signal's pause: it wins the tie
    (points / "point-000000000006.sharded").mkdir()  # a write that never committed
    assert committed_sharded(points, key=None)[0] == (SHARDED_STEPS, str(points / "pause"))
    output = inspect_text(points, capsys)
    blank = output.index("")
    lines, newest = output[:blank], output[blank + 1 :]
    assert field(lines, "kind") == "resume-point directory (sharded model)"
    assert field(lines, "resume points") == "point-000000000003.sharded (step 3)"
    assert field(lines, "pause files") == "pause (step 3)"
    assert field(lines, "newest valid") == "pause, below"
    assert field(newest, "kind") == "sharded pause directory (FSDP2/DCP)"
    assert field(newest, "steps") == f"completed_steps {SHARDED_STEPS}"
    # A pause whose shard was damaged is skipped for the point, as a resume skips it.
    generation = next(p for p in (points / "pause").iterdir() if p.name.startswith("gen-"))
    shard = generation / "rank-0.ckpt"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    lines = inspect_text(points, capsys)
    assert field(lines, "newest valid") == "point-000000000003.sharded, below"
    assert any(line.startswith(f"  skipped {points / 'pause'}: [322]") for line in lines)


def test_inspect_of_a_lone_sharded_manifest_says_what_it_is(sharded_pause, capsys):
    path, _ = sharded_pause
    lines = inspect_text(path / "manifest.ckpt", capsys)
    assert field(lines, "kind").startswith("sharded-pause manifest")
    assert field(lines, "steps") == f"completed_steps {SHARDED_STEPS}"
    assert field(lines, "processes") == "1"
    assert field(lines, "files").endswith("not checked: the manifest alone was given")
    summary = inspect_json(path / "manifest.ckpt", capsys)
    assert (summary["kind"], summary["world_size"]) == ("sharded manifest", 1)


def test_inspect_of_a_sharded_pause_with_a_tampered_shard_fails_with_code_322(
    sharded_pause, capsys
):
    path, _ = sharded_pause
    (generation,) = [entry for entry in os.listdir(path) if entry.startswith("gen-")]
    shard = path / generation / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 3
    error = capsys.readouterr().err
    assert error.startswith("error [322]: ") and "__0_0.distcp" in error


def test_inspect_of_a_sharded_pause_without_its_manifest_fails_with_code_321(sharded_pause, capsys):
    path, _ = sharded_pause
    os.remove(path / "manifest.ckpt")
    assert main(["inspect", str(path), "--json"]) == 3
    error = capsys.readouterr().err
    assert error.startswith("error [321]: ") and "did not complete" in error


@pytest.mark.parametrize("given", ["directory", "manifest"])
def test_export_of_a_sharded_pause_gathers_the_models_full_state_from_the_verified_shards(
    sharded_pause, given, tmp_path, capsys
):
    from safetensors.torch import load_file

    path, _ = sharded_pause
    expected = torch.load(path.parent / "model_state.pt", weights_only=True)
    source = path if given == "directory" else path / "manifest.ckpt"
    out = tmp_path / "model.safetensors"
    assert main(["export", str(source), str(out)]) == 0
    assert "model weights from 'model' of the sharded pause" in capsys.readouterr().out
    exported = load_file(out)
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[name], expected[name]) for name in expected)
    # The whole state is every rank's shards: not a file of its own.
    assert main(["export", str(source), str(tmp_path / "all.pt"), "--what", "all"]) == 2
    assert "is a sharded pause" in capsys.readouterr().err
    assert not (tmp_path / "all.pt").exists()


def test_export_of_a_sharded_pause_with_a_tampered_shard_fails_with_code_322(
    sharded_pause, tmp_path, capsys
):
    path, _ = sharded_pause
    shard = next(path.glob("gen-*/dcp/*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    assert main(["export", str(path), str(tmp_path / "model.pt")]) == 3
    assert capsys.readouterr().err.startswith("error [322]: ")
    assert not (tmp_path / "model.pt").exists()


def test_inspect_and_export_of_a_fifo_fail_with_code_321_without_waiting_for_a_writer(
    tmp_path, capsys
):
    fifo = tmp_path / "pause.ckpt"
    os.mkfifo(fifo)
    for command in (["inspect", str(fifo)], ["export", str(fifo), str(tmp_path / "out.pt")]):
        assert main(command) == 3
        assert capsys.readouterr().err == (
            f"error [321]: not a pause checkpoint of this format: {fifo} is not a regular file "
            "(a FIFO)\n"
        )


def test_inspect_of_a_truncated_safetensors_file_fails_with_code_322(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"weight": torch.zeros(4, 8)}, path)
    path.write_bytes(path.read_bytes()[:-16])
    assert main(["inspect", str(path)]) == 3
    assert capsys.readouterr().err.startswith("error [322]: ")
