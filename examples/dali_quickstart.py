"""DALI quickstart: a trainer fed by a DALI pipeline, preempted by SIGTERM mid-epoch, resumes
bit-identically. Runs on the CPU (device_id=None); install the extra: pip install 'trainer-resume[dali]'.

Run: python examples/dali_quickstart.py
"""

from __future__ import annotations

import os
import signal
import tempfile

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def
from nvidia.dali.plugin.pytorch import LastBatchPolicy
from torch import nn

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.adapters.dali import ResumableDALIIterator


@pipeline_def(batch_size=8, num_threads=2, device_id=None, seed=42, enable_checkpointing=True)
def images(root):
    raw, labels = fn.readers.file(
        file_root=root, file_filters=["*.bin"], random_shuffle=True, name="Reader"
    )
    image = fn.reinterpret(raw, dtype=types.UINT8, shape=[8, 8, 3], layout="HWC")
    image = fn.crop_mirror_normalize(
        image, mirror=fn.random.coin_flip(), dtype=types.FLOAT, mean=[127.5], std=[127.5]
    )
    return image, labels


class Trainer(TrainingResumeMixin):
    def __init__(self, root: str) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 2)
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        # was: DALIGenericIterator([images(root=root)], ["image", "label"], reader_name="Reader", ...)
        self.loader = ResumableDALIIterator(
            images,
            ["image", "label"],
            pipeline_kwargs={"root": root},
            reader_name="Reader",
            last_batch_policy=LastBatchPolicy.PARTIAL,
        )
        self._initialize_training_resume({"root": root}, version="dali-quickstart/1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {"train": self.loader}  # resume() rebuilds the pipeline from its checkpoint

    @training_step
    def step(self, batch) -> float:
        image, label = batch[0]["image"], batch[0]["label"].reshape(-1).long()
        loss = nn.functional.cross_entropy(self.model(image), label)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def train(trainer: Trainer, epochs: int, pause_file: str, preempt_after: int | None = None):
    """The usual epoch loop, from the epoch the loader says comes next."""
    losses = []
    with trainer.pause_on_signal(pause_file):  # SIGTERM / SIGUSR1 -> pause at the step's end
        for _epoch in range(trainer.loader.epoch, epochs):
            for batch in trainer.loader:
                losses.append(trainer.step(batch))
                if trainer.completed_steps == preempt_after:
                    os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler does to a preempted job
                if trainer.paused:
                    return losses
    return losses


def write_images(root: str) -> None:
    generator = np.random.default_rng(0)
    for label in (0, 1):
        os.makedirs(os.path.join(root, f"class{label}"))
        for index in range(30):
            image = generator.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            image.tofile(os.path.join(root, f"class{label}", f"{index}.bin"))


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        root = os.path.join(workdir, "images")
        write_images(root)
        pause_file = os.path.join(workdir, "pause.ckpt")

        reference = Trainer(root)
        expected = train(reference, 3, pause_file)

        first = Trainer(root)
        # SIGTERM between steps 10 and 11: the pause is written when step 11 ends (epoch 1, mid-way).
        losses = train(first, 3, pause_file, preempt_after=10)
        print(f"paused after step {first.completed_steps}: {first.paused}")

        second = Trainer(root)  # in real life: a new process, after the restart
        second.resume(pause_file)
        losses += train(second, 3, pause_file)

        same_losses = losses == expected
        same_weights = all(
            torch.equal(a, b)
            for a, b in zip(
                reference.model.state_dict().values(), second.model.state_dict().values()
            )
        )
    print(f"losses identical: {same_losses}, weights identical: {same_weights}")
    print("bit-identical:", "yes" if same_losses and same_weights else "no")
    return 0 if same_losses and same_weights else 1


if __name__ == "__main__":
    raise SystemExit(main())
