"""Pauses of models sharded by FSDP2 ``fully_shard`` (DTensor parameters).

In-process tests run under a gloo process group of one rank: ``fully_shard`` needs
a process group, and one rank already makes every parameter a DTensor.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from _fsdp_workers import FSDPTrainer

from trainer_resume.errors import UnsupportedResumeConfigurationError


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_pause_of_a_model_with_dtensor_parameters_is_refused_before_anything_is_written(
    one_rank, tmp_path
):
    trainer = FSDPTrainer()
    trainer.step()
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"\['model'\]\['0.weight'\] is a DTensor"):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not (tmp_path / "pause.ckpt").exists()
    assert not trainer.paused
    trainer.loader.close()
