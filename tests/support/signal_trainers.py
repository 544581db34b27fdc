"""A trainer with a two-worker loader, signalled through its whole process group (child side)."""

from __future__ import annotations

import json
import os
import random
import signal
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

STEPS = 10
STEPS_PER_EPOCH = 4  # 8 samples, batches of 2


class NoisyDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        noise = 0.1 * (torch.rand(3) + random.random() + float(np.random.rand()))
        return torch.full((3,), index / 8) + noise, torch.tensor([index % 2], dtype=torch.float32)


class GroupSignalTrainer(TrainingResumeMixin):
    def __init__(self, workers=0, context=None, signal_at=None):
        torch.manual_seed(1)
        random.seed(1)
        np.random.seed(1)
        self.model = nn.Sequential(nn.Linear(3, 6), nn.Dropout(0.2), nn.Linear(6, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.02, momentum=0.5)
        data = NoisyDataset()
        self.loader = ResumableDataLoader(
            data,
            batch_size=2,
            sampler=InfiniteRandomSampler(data, resumable=True),
            num_workers=workers,
            multiprocessing_context=context,
            resumable=True,
        )
        self.signal_at = signal_at
        self.batches = iter(self.loader)  # the workers start here
        self._initialize_training_resume({"model": "group-signal"}, version="1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {"train": self.loader}

    def _rebuild_resume_iterators(self):
        self.batches = iter(self.loader)

    @training_step
    def step(self):
        inputs, targets = next(self.batches)
        if self.completed_steps + 1 == self.signal_at:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # what Slurm or `timeout` does
        loss = nn.functional.mse_loss(self.model(inputs + 0.1 * random.random()), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def _forkserver_alive() -> bool:
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def child_main(workdir: str, plan: list[tuple[str, int, int]]) -> None:
    """Run each (start method, workers, step) of ``plan``: a SIGTERM to the process group, then a pause.

    Step 0 sends the signal right after the workers were started (while they start up);
    the pause then lands at the end of step 1.
    """
    import multiprocessing

    # The forkserver imports these once; its workers then start in milliseconds.
    multiprocessing.set_forkserver_preload(["torch", "support.signal_trainers"])
    results = []
    for index, (context, workers, signal_at) in enumerate(plan):
        path = os.path.join(workdir, f"pause-{index}.ckpt")
        trainer = GroupSignalTrainer(workers=workers, context=context, signal_at=signal_at)
        handlers = trainer.pause_on_signal(path)
        if signal_at == 0:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        while not trainer.paused:
            trainer.step()
        handlers.restore()
        trainer.loader.close()
        result = {"path": path, "context": context, "paused_at": trainer.completed_steps}
        if context == "forkserver":
            result["forkserver_alive"] = _forkserver_alive()
            again = GroupSignalTrainer(
                workers=2, context=context
            )  # new workers from the same server
            next(again.batches)
            again.loader.close()
        results.append(result)
    with open(os.path.join(workdir, "results.json"), "w") as out:
        json.dump(results, out)
    sys.stdout.flush()
