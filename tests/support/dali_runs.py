"""DALI pipelines over files a test writes, and a trainer whose batches come from them.

The pipelines run on the CPU (``device_id=None``): a file reader with
``random_shuffle=True`` over raw 4x4 RGB images in two class folders, decoded with
``fn.reinterpret``, flipped at random by ``fn.crop_mirror_normalize`` and given
``fn.random.uniform`` noise; or an ``fn.external_source`` whose callable takes one
``SampleInfo``, plus ``fn.random.normal`` noise.

:class:`DALITrainer` trains a small classifier on them with a per-epoch LR schedule, and
:func:`train` is the usual epoch loop with epoch-end work after the inner loop: the
scheduler's step and a "validation" that draws from torch's global generator.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def
from nvidia.dali.plugin.pytorch import LastBatchPolicy
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.adapters.dali import ResumableDALIIterator
from trainer_resume.difference import first_difference

SAMPLES_PER_CLASS = 11  # 22 samples: batches of 4 leave a partial last batch
BATCH_SIZE = 4
EPOCHS = 3
SIDE = 4
OUTPUTS = ["images", "labels", "noise"]
POLICIES = {policy.name: policy for policy in LastBatchPolicy}


def write_images(root: str | os.PathLike[str]) -> str:
    """Two class folders of raw uint8 images (``*.bin``), the same bytes on every call."""
    generator = np.random.default_rng(0)
    for label in range(2):
        folder = Path(root, f"class{label}")
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(SAMPLES_PER_CLASS):
            image = generator.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
            image.tofile(folder / f"{index:02d}.bin")
    return os.fspath(root)


@pipeline_def(batch_size=BATCH_SIZE, num_threads=1, device_id=None, seed=5)
def file_pipeline(root, shuffle_after_epoch=False, std=255.0, shard_id=0, num_shards=1):
    raw, labels = fn.readers.file(
        file_root=root,
        file_filters=["*.bin"],
        random_shuffle=not shuffle_after_epoch,
        shuffle_after_epoch=shuffle_after_epoch,
        initial_fill=8,
        shard_id=shard_id,
        num_shards=num_shards,
        name="Reader",
    )
    images = fn.reinterpret(raw, dtype=types.UINT8, shape=[SIDE, SIDE, 3], layout="HWC")
    images = fn.crop_mirror_normalize(
        images, mirror=fn.random.coin_flip(), dtype=types.FLOAT, mean=[0.0], std=[std]
    )
    return images, labels, fn.random.uniform(range=[-0.1, 0.1])


EXTERNAL_SAMPLES = 14  # an external source's epoch: 3 full batches and a partial one


def external_sample(info):
    """One sample per ``SampleInfo``: DALI restores this source at the saved iteration."""
    if info.idx_in_epoch >= EXTERNAL_SAMPLES:
        raise StopIteration
    value = np.float32(info.idx_in_epoch + 100 * info.epoch_idx)
    return np.full((SIDE, SIDE, 3), value, dtype=np.float32), np.array([info.idx_in_epoch % 2])


@pipeline_def(batch_size=BATCH_SIZE, num_threads=1, device_id=None, seed=9)
def external_pipeline():
    images, labels = fn.external_source(source=external_sample, num_outputs=2, batch=False)
    images = fn.transpose(images, perm=[2, 0, 1]) * 1.0 / 255.0
    return images, labels, fn.random.normal(stddev=0.05)


def make_iterator(
    kind: str, root: str, policy: str = "PARTIAL", *, shard: tuple[int, int] = (0, 1)
) -> ResumableDALIIterator:
    """``file`` (any policy; ``shard``: its shard_id and num_shards), ``shuffle_after_epoch``
    or ``external``; checkpointing on."""
    if kind == "external":
        return ResumableDALIIterator(
            external_pipeline,
            OUTPUTS,
            pipeline_kwargs={"enable_checkpointing": True},
            last_batch_policy=POLICIES[policy],
        )
    return ResumableDALIIterator(
        file_pipeline,
        OUTPUTS,
        pipeline_kwargs={
            "root": root,
            "shuffle_after_epoch": kind == "shuffle_after_epoch",
            "shard_id": shard[0],
            "num_shards": shard[1],
            "enable_checkpointing": True,
        },
        reader_name="Reader",
        last_batch_policy=POLICIES[policy],
    )


class DALITrainer(TrainingResumeMixin):
    """A small classifier trained on the DALI batches, with a per-epoch LR schedule.

    At ``pause_at`` (a step number, counted from 1) the step asks for a pause: by a
    SIGTERM to this process, or by ``request_pause(pause_request)`` when that path is
    given. ``distributed``: the model is wrapped in ``DistributedDataParallel``.
    """

    def __init__(
        self,
        loader: ResumableDALIIterator,
        *,
        pause_at: int | None = None,
        pause_request: str | None = None,
        distributed: bool = False,
    ) -> None:
        torch.manual_seed(3)
        self.loader = loader
        self.module = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * SIDE * SIDE, 8), nn.Dropout(0.25), nn.Linear(8, 2)
        )
        self.model = DistributedDataParallel(self.module) if distributed else self.module
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.5)
        self.pause_at = pause_at
        self.pause_request = pause_request
        self._initialize_training_resume({"trainer": "dali"}, version="1")

    def _resume_objects(self):
        return {"model": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self):
        return {"train": self.loader}

    @training_step
    def step(self, batch) -> torch.Tensor:
        (outputs,) = batch
        inputs = outputs["images"] + outputs["noise"].reshape(-1, 1, 1, 1)
        labels = outputs["labels"].reshape(-1).long()
        loss = nn.functional.cross_entropy(self.model(inputs), labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.completed_steps + 1 == self.pause_at:
            if self.pause_request is None:
                os.kill(os.getpid(), signal.SIGTERM)  # the pause lands when this step ends
            else:
                self.request_pause(self.pause_request)
        return loss.detach()

    def end_epoch(self, epoch: int) -> dict:
        """The loop's epoch-end work: the scheduler's step, then a validation whose inputs
        come from torch's global generator (a skipped one would change every later draw)."""
        self.scheduler.step()
        self.module.eval()
        with torch.no_grad():
            probe = torch.rand(BATCH_SIZE, 3, SIDE, SIDE)
            value = self.module(probe).sum()
        self.module.train()
        return {"epoch": epoch, "validation": value, "lr": self.optimizer.param_groups[0]["lr"]}


def train(
    trainer: DALITrainer, epochs: int = EPOCHS, *, pause_after_epoch_work: bool = False
) -> tuple[list[dict], list[dict]]:
    """The usual epoch loop from the loader's own epoch, with the epoch-end work after the
    inner loop: every batch (its epoch and loss) and every epoch-end result.

    ``pause_after_epoch_work``: the loop calls ``pause_if_requested()`` after that work,
    where a pause requested at an epoch's last batch then lands.
    """
    seen, ends = [], []
    loader = trainer.loader
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            loss = trainer.step(batch)
            seen.append({"epoch": epoch, "batch": dict(batch[0]), "loss": loss})
            if trainer.paused:
                return seen, ends
        ends.append(trainer.end_epoch(epoch))
        if pause_after_epoch_work and trainer.pause_if_requested(epoch_end_done=True):
            return seen, ends
    return seen, ends


def finished(trainer: DALITrainer, seen: list[dict], ends: list[dict]) -> dict:
    """What a run leaves for the comparison (plain data: a weights-only load reads it)."""
    return {
        "seen": seen,
        "ends": ends,
        "completed_steps": trainer.completed_steps,
        "model": trainer.module.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
    }


def assert_same(expected: Any, got: Any, what: str) -> None:
    """Assert two nested results bit-identical (the package's rule: first_difference)."""
    difference = first_difference(expected, got)
    assert difference is None, f"{what}: {difference.describe()}"
