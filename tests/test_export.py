"""``export_checkpoint``: the weights of each kind of trainer-resume file, read by other tools."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from support.checkpoint_makers import (
    distributed_pause,
    lightning_checkpoints,
    lightning_module_class,
    lightning_pause,
    mixin_pause,
)
from support.cli import run_cli

from trainer_resume.checkpoint_files import read_checkpoint_file
from trainer_resume.cli import main
from trainer_resume.durable import save_checkpoint
from trainer_resume.errors import CheckpointFormatError, CheckpointWriteError
from trainer_resume.export import export_checkpoint


def assert_same_state(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    # Exactly the model's state_dict keys, buffers included (safetensors does not keep their order).
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
        assert actual[name].dtype == tensor.dtype, name


def test_mixin_pause_model_exports_as_torch_file_loadable_weights_only(tmp_path_factory, tmp_path):
    path, weights = mixin_pause(tmp_path_factory)
    result = export_checkpoint(path, tmp_path / "model.pt")
    assert (result.kind, result.source, result.what, result.format) == (
        "pause",
        "model",
        "model",
        "torch",
    )
    assert any("running_mean" in name for name in weights)
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(exported) == list(weights)  # a torch file keeps the state_dict's order
    assert_same_state(weights, exported)


def test_mixin_pause_model_exports_as_safetensors(tmp_path_factory, tmp_path):
    path, weights = mixin_pause(tmp_path_factory)
    export_checkpoint(path, tmp_path / "model.safetensors", format="safetensors")
    assert_same_state(weights, load_file(tmp_path / "model.safetensors"))


def test_exported_state_dict_loads_into_a_fresh_model(tmp_path_factory, tmp_path):
    from support.checkpoint_makers import _net

    path, weights = mixin_pause(tmp_path_factory)
    export_checkpoint(path, tmp_path / "model.pt")
    model = _net()
    model.load_state_dict(
        torch.load(tmp_path / "model.pt", weights_only=True)
    )  # strict: every key matches
    assert_same_state(weights, model.state_dict())


def test_export_all_writes_the_whole_pause_as_a_plain_torch_file(tmp_path_factory, tmp_path):
    path, weights = mixin_pause(tmp_path_factory)
    export_checkpoint(path, tmp_path / "all.pt", what="all")
    whole = torch.load(tmp_path / "all.pt", weights_only=True)
    assert whole["completed_steps"] == 5
    assert set(whole["objects"]) == {"model", "optimizer"}
    assert_same_state(weights, whole["objects"]["model"])


def test_lightning_pause_model_exports_the_modules_state_dict(tmp_path_factory, tmp_path):
    path, weights = lightning_pause(tmp_path_factory)
    result = export_checkpoint(path, tmp_path / "model.pt")
    assert (result.kind, result.source) == ("lightning pause", "state_dict")
    assert_same_state(weights, torch.load(tmp_path / "model.pt", weights_only=True))
    export_checkpoint(path, tmp_path / "model.safetensors", format="safetensors")
    assert_same_state(weights, load_file(tmp_path / "model.safetensors"))


def test_lightning_pause_exported_whole_loads_with_lightnings_own_load_from_checkpoint(
    tmp_path_factory, tmp_path
):
    path, weights = lightning_pause(tmp_path_factory)
    export_checkpoint(path, tmp_path / "plain.ckpt", what="all")
    module = lightning_module_class().load_from_checkpoint(
        tmp_path / "plain.ckpt", map_location="cpu"
    )
    assert_same_state(weights, module.state_dict())
    plain = torch.load(tmp_path / "plain.ckpt", weights_only=True)
    assert plain["global_step"] == 3


@pytest.mark.slow
def test_distributed_pause_model_exports_rank_zeros_weights(tmp_path_factory, tmp_path):
    path, weights = distributed_pause(tmp_path_factory)
    result = export_checkpoint(path, tmp_path / "model.pt")
    assert (result.kind, result.source) == ("pause", "model")
    assert_same_state(weights, torch.load(tmp_path / "model.pt", weights_only=True))
    export_checkpoint(path, tmp_path / "model.safetensors", format="safetensors")
    assert_same_state(weights, load_file(tmp_path / "model.safetensors"))


def test_tied_weights_are_kept_under_every_key_in_safetensors(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    save_checkpoint(
        {"net": {"encoder.weight": shared, "decoder.weight": shared}, "step": 3},
        tmp_path / "tied.ckpt",
    )
    result = export_checkpoint(
        tmp_path / "tied.ckpt", tmp_path / "tied.safetensors", format="safetensors"
    )
    assert result.source == "net"  # the one module-like entry
    loaded = load_file(tmp_path / "tied.safetensors")
    assert torch.equal(loaded["encoder.weight"], shared) and torch.equal(
        loaded["decoder.weight"], shared
    )


def test_compile_and_checkpoint_wrapper_names_are_left_out_of_any_files_export(tmp_path):
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    plain = nn.Sequential(nn.Linear(3, 2), nn.Sequential(nn.Linear(2, 1)))
    blocks = nn.Sequential(plain[0], checkpoint_wrapper(plain[1]))
    compiled = torch.compile(blocks)  # built, not run: its names, nothing compiled
    # A file of an earlier release (or of the user's own) that kept the wrappers' names.
    save_checkpoint({"model": compiled.state_dict(), "step": 3}, tmp_path / "old.ckpt")
    assert list(compiled.state_dict())[0] == "_orig_mod.0.weight"
    export_checkpoint(tmp_path / "old.ckpt", tmp_path / "model.pt")
    fresh = nn.Sequential(nn.Linear(3, 2), nn.Sequential(nn.Linear(2, 1)))
    fresh.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True), strict=True)
    assert_same_state(plain.state_dict(), fresh.state_dict())


def test_ambiguous_model_is_refused_listing_the_names(tmp_path):
    states = {"generator": {"w": torch.ones(2)}, "discriminator": {"w": torch.zeros(2)}}
    save_checkpoint(states, tmp_path / "gan.ckpt")
    with pytest.raises(
        ValueError, match="several module state_dicts.*'generator', 'discriminator'"
    ):
        export_checkpoint(tmp_path / "gan.ckpt", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()
    export_checkpoint(tmp_path / "gan.ckpt", tmp_path / "out.pt", object="discriminator")
    assert torch.equal(torch.load(tmp_path / "out.pt", weights_only=True)["w"], torch.zeros(2))


def test_unknown_object_is_refused_listing_the_names(tmp_path_factory, tmp_path):
    path, _ = mixin_pause(tmp_path_factory)
    with pytest.raises(ValueError, match="no object 'net'.*'model', 'optimizer'"):
        export_checkpoint(path, tmp_path / "out.pt", object="net")


def test_an_object_that_is_not_a_model_is_refused_naming_the_models(tmp_path_factory, tmp_path):
    path, _ = mixin_pause(tmp_path_factory)
    with pytest.raises(ValueError) as refused:
        export_checkpoint(path, tmp_path / "out.pt", object="optimizer")
    assert "object 'optimizer' is not a model" in str(refused.value)
    assert "'state', 'param_groups'" in str(refused.value)
    assert str(refused.value).endswith("the resume objects that are models: 'model'")
    assert not (tmp_path / "out.pt").exists()


def test_a_plain_torch_file_is_not_exported(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointFormatError, match="no trainer-resume header"):
        export_checkpoint(tmp_path / "plain.pt", tmp_path / "out.pt")


def test_safetensors_with_the_whole_state_is_refused_before_reading(tmp_path):
    with pytest.raises(ValueError, match="torch format \\(format='torch', --format torch\\)"):
        export_checkpoint(
            tmp_path / "absent.ckpt", tmp_path / "out.safetensors", what="all", format="safetensors"
        )


def test_a_failed_write_leaves_the_previous_export_intact(tmp_path_factory, tmp_path, monkeypatch):
    path, _ = mixin_pause(tmp_path_factory)
    export_checkpoint(path, tmp_path / "model.pt")
    before = (tmp_path / "model.pt").read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CheckpointWriteError):
        export_checkpoint(path, tmp_path / "model.pt", what="all")
    monkeypatch.undo()
    assert (tmp_path / "model.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_an_export_onto_the_file_it_exports_is_refused_and_the_file_stays_resumable(
    tmp_path_factory, tmp_path, capsys
):
    shared, _ = mixin_pause(tmp_path_factory)
    path = tmp_path / "pause.ckpt"
    path.write_bytes(shared.read_bytes())
    (tmp_path / "link.ckpt").symlink_to(path)
    before = path.read_bytes()
    for out in (path, tmp_path / "sub" / ".." / "pause.ckpt", tmp_path / "link.ckpt"):
        with pytest.raises(ValueError, match="is the file being exported"):
            export_checkpoint(path, out)
    assert main(["export", str(path), str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    assert path.read_bytes() == before
    assert read_checkpoint_file(path).kind == "pause"


def test_an_export_onto_another_trainer_resume_file_is_refused_and_that_file_is_kept(
    tmp_path_factory, tmp_path
):
    source, _ = mixin_pause(tmp_path_factory)
    other = tmp_path / "other-run.ckpt"
    save_checkpoint({"w": torch.ones(2)}, other)
    before = other.read_bytes()
    with pytest.raises(ValueError, match="is a trainer-resume file"):
        export_checkpoint(source, other)
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-run.ckpt"]


# ---------------------------------------------------------------------- the export command


def test_export_command_writes_safetensors_when_the_output_ends_in_safetensors(
    tmp_path_factory, tmp_path
):
    path, weights = mixin_pause(tmp_path_factory)
    result = run_cli("export", str(path), "model.safetensors", cwd=tmp_path)  # the console script
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote model.safetensors: model weights from 'model'")
    assert_same_state(weights, load_file(tmp_path / "model.safetensors"))


def test_export_command_writes_a_durable_lightning_checkpoint_as_a_plain_one(
    tmp_path_factory, tmp_path, capsys
):
    _, durable = lightning_checkpoints(tmp_path_factory)
    _, weights = lightning_pause(tmp_path_factory)
    out = tmp_path / "plain.ckpt"
    assert main(["export", str(durable), str(out), "--what", "all"]) == 0
    assert "a plain Lightning checkpoint" in capsys.readouterr().out
    module = lightning_module_class().load_from_checkpoint(out, map_location="cpu")
    assert_same_state(weights, module.state_dict())


def test_export_command_names_the_objects_when_the_model_is_ambiguous(tmp_path, capsys):
    states = {"generator": {"w": torch.ones(2)}, "discriminator": {"w": torch.zeros(2)}}
    save_checkpoint(states, tmp_path / "gan.ckpt")
    assert main(["export", str(tmp_path / "gan.ckpt"), str(tmp_path / "out.pt")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    assert "--object NAME" in error and "'generator', 'discriminator'" in error


def test_export_command_calls_a_resume_point_a_resume_point(tmp_path, capsys):
    from support.point_trainers import points_trainer

    trainer = points_trainer(tmp_path / "points", every_steps=1)
    trainer.train_step()
    trainer.points.wait()
    (point,) = sorted((tmp_path / "points").glob("point-*.ckpt"))
    assert main(["export", str(point), str(tmp_path / "out.pt")]) == 0
    assert "model weights from 'model' of the resume point, " in capsys.readouterr().out


def test_export_command_refuses_a_plain_file_with_code_321(tmp_path, capsys):
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    assert main(["export", str(tmp_path / "plain.pt"), str(tmp_path / "out.pt")]) == 3
    assert capsys.readouterr().err.startswith("error [321]: ")
