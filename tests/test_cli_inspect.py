"""``trainer-resume inspect``: what a pause file holds, and clean refusals of bad files."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _cli import run_cli
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume.cli import main
from trainer_resume.durable import save_checkpoint
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step

DATASET_SIZE = 12
BATCH_SIZE = 4
STEPS = 5  # 20 samples delivered: cycle 1, offset 8


class SmallTrainer(TrainingResumeMixin):
    def __init__(self, *, num_replicas: int = 1) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 3)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(DATASET_SIZE, 4), torch.randn(DATASET_SIZE, 3))
        self.loader = ResumableDataLoader(
            data,
            batch_size=BATCH_SIZE,
            sampler=InfiniteRandomSampler(data, resumable=True, num_replicas=num_replicas, rank=0),
            resumable=True,
        )
        self.batches = iter(self.loader)
        self.seen = 0
        self._initialize_training_resume({"lr": 0.01, "batch_size": BATCH_SIZE}, version="inspect-test/1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {"train": self.loader}

    def _resume_extra_state(self):
        return {"seen": self.seen, "warmed_up": True}

    @training_step
    def step(self) -> None:
        inputs, targets = next(self.batches)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.seen += len(inputs)


@pytest.fixture(scope="module")
def pause_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("inspect") / "pause.ckpt"
    trainer = SmallTrainer()
    for _ in range(STEPS):
        trainer.step()
    trainer.pause(path)
    trainer.loader.close()
    return path


def assert_clean_error(result, code: int) -> None:
    assert result.returncode == 3, result
    assert result.stderr.startswith(f"error [{code}]: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_inspect_shows_steps_objects_loader_position_rng_and_extra_keys(pause_file, tmp_path):
    result = run_cli("inspect", str(pause_file), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split() == ["completed", "steps", str(STEPS)] for line in lines)
    assert any(line.split()[:2] == ["module", "version"] and line.endswith("inspect-test/1") for line in lines)
    # Linear(4, 3): weight 12 + bias 3 float32 values = 60 bytes in 2 tensors.
    assert any(line.split()[:4] == ["model", "2", "60", "B"] for line in lines), result.stdout
    # Adam after one step: step, exp_avg, exp_avg_sq per parameter = 6 tensors.
    assert any(line.split()[:2] == ["optimizer", "6"] for line in lines), result.stdout
    consumed = STEPS * BATCH_SIZE
    assert any(
        line.split()[:4] == ["train", str(consumed), str(consumed // DATASET_SIZE), str(consumed % DATASET_SIZE)]
        for line in lines
    ), result.stdout
    assert "Mersenne Twister" in result.stdout
    assert "extra state keys: seen, warmed_up" in result.stdout


def test_inspect_of_truncated_file_fails_with_code_322(pause_file, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    data = pause_file.read_bytes()
    truncated.write_bytes(data[: len(data) - 100])
    assert_clean_error(run_cli("inspect", str(truncated), cwd=tmp_path), 322)


def test_inspect_of_bit_flipped_file_fails_with_code_322(pause_file, tmp_path):
    flipped = tmp_path / "flipped.ckpt"
    data = bytearray(pause_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    assert_clean_error(run_cli("inspect", str(flipped), cwd=tmp_path), 322)


def test_inspect_of_random_file_fails_with_code_321(tmp_path):
    foreign = tmp_path / "random.bin"
    foreign.write_bytes(os.urandom(4096))
    assert_clean_error(run_cli("inspect", str(foreign), cwd=tmp_path), 321)


# The cases below run main() in-process: the console script's own start-up is covered above.


def test_inspect_json_reports_the_same_facts(pause_file, capsys):
    assert main(["inspect", str(pause_file), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed_steps"] == STEPS
    assert summary["file_bytes"] == os.path.getsize(pause_file)
    assert summary["objects"]["model"] == {"tensors": 2, "bytes": 60, "shared": False}
    assert summary["loaders"]["train"]["consumed"] == STEPS * BATCH_SIZE
    assert summary["extra"] == ["seen", "warmed_up"]
    assert len(summary["config_signature"]) == 64


def test_inspect_shows_the_process_count_and_a_sharded_loaders_global_position(tmp_path, capsys):
    path = tmp_path / "sharded.ckpt"
    trainer = SmallTrainer(num_replicas=2)  # this process reads rank 0's half of a 2-rank stream
    for _ in range(STEPS):
        trainer.step()
    trainer.pause(path)
    trainer.loader.close()
    assert main(["inspect", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["world_size"] == 1
    # The cursor is global: each delivered batch of rank 0 stands for one batch of every rank.
    assert summary["loaders"]["train"]["consumed"] == STEPS * BATCH_SIZE * 2
    assert summary["loaders"]["train"]["num_replicas"] == 2


def test_inspect_of_plain_torch_save_file_fails_with_code_321(tmp_path, capsys):
    plain = tmp_path / "plain.pt"
    torch.save({"weight": torch.ones(3)}, plain)
    assert main(["inspect", str(plain)]) == 3
    assert capsys.readouterr().err.startswith("error [321]: ")


def test_inspect_of_missing_file_fails_without_traceback(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "absent.ckpt")]) == 3
    assert capsys.readouterr().err == f"error: no such file: {tmp_path / 'absent.ckpt'}\n"


def test_inspect_verifies_signature_with_key_file_and_refuses_wrong_key(tmp_path, capsys):
    signed = tmp_path / "signed.ckpt"
    save_checkpoint({"weights": torch.zeros(4)}, signed, key=b"the right key, 16+ bytes")
    (tmp_path / "right").write_bytes(b"the right key, 16+ bytes")
    (tmp_path / "wrong").write_bytes(b"the wrong key, 16+ bytes")

    assert main(["inspect", str(signed), "--key-file", str(tmp_path / "right")]) == 0
    output = capsys.readouterr().out
    assert "verified with the key file" in output
    assert any(line.split()[:4] == ["weights", "1", "16", "B"] for line in output.splitlines())
    assert main(["inspect", str(signed), "--key-file", str(tmp_path / "wrong")]) == 3
    assert capsys.readouterr().err.startswith("error [339]: ")
