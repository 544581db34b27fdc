"""pause() from another thread, at any moment between or during steps, resumes bit-identically."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from trainer_resume.errors import TrainingPausedError
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step

STEPS = 120


class SlowNoisyDataset(Dataset):
    """Each sample takes a moment and draws its augmentation from the global generators."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        time.sleep(0.0004)
        noise = 0.1 * (torch.rand(3) + random.random() + float(np.random.rand()))
        return torch.full((3,), index / 40) + noise, torch.tensor([index % 3], dtype=torch.float32)


class LoaderTrainer(TrainingResumeMixin):
    def __init__(self, workers: int):
        torch.manual_seed(5)
        random.seed(5)
        np.random.seed(5)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        data = SlowNoisyDataset()
        self.loader = ResumableDataLoader(
            data,
            batch_size=2,
            sampler=InfiniteRandomSampler(data, resumable=True),
            num_workers=workers,
            persistent_workers=workers > 0,
            resumable=True,
        )
        self.batches = iter(self.loader)
        self._initialize_training_resume({"workers": "any"}, version="1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {"train": self.loader}

    def _rebuild_resume_iterators(self):
        self.batches = iter(self.loader)

    @training_step
    def step(self, batch=None):
        inputs, targets = next(self.batches) if batch is None else batch
        jitter = 0.1 * (random.random() + float(np.random.rand()))  # main-process draws
        loss = nn.functional.mse_loss(self.model(inputs + jitter), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def uninterrupted(workers):
    trainer = LoaderTrainer(workers)
    losses = [trainer.step() for _ in range(STEPS)]
    state = (trainer.model.state_dict(), trainer.optimizer.state_dict())
    trainer.loader.close()
    return losses, state


def run_with_pauses_from_another_thread(tmp_path, workers, fetch_outside, pauses):
    """The main thread trains; a second thread pauses it and resumes each pause file."""
    trainer = LoaderTrainer(workers)
    losses = {}
    idle, resumed, pauses_done = threading.Event(), threading.Event(), threading.Event()
    refused_batches = []
    paused_at = []
    failures = []

    def pause_and_resume_repeatedly():
        delays = random.Random(7)
        try:
            for index in range(pauses):
                # A few steps since the last resume (restarted workers need them to get
                # ahead with prefetching), then a random moment of the step/fetch cycle.
                until = min(trainer.completed_steps + (3 if workers else 1), STEPS)
                while trainer.completed_steps < until:
                    time.sleep(0.0005)
                time.sleep(delays.uniform(0.0, 0.012))
                path = tmp_path / f"pause-{index}.ckpt"
                trainer.pause(path)
                paused_at.append(trainer.completed_steps)
                assert idle.wait(60), "the training thread never stopped"
                idle.clear()
                trainer.resume(path)
                resumed.set()
        except BaseException as error:  # reported by the main thread
            failures.append(error)
            resumed.set()
        finally:
            pauses_done.set()

    controller = threading.Thread(target=pause_and_resume_repeatedly, daemon=True)
    controller.start()
    while not failures:
        if trainer.paused:
            idle.set()
            assert resumed.wait(60), "the pausing thread never resumed"
            resumed.clear()
            continue
        if trainer.completed_steps >= STEPS:
            if pauses_done.wait(0.001):
                break
            continue
        batch = next(trainer.batches) if fetch_outside else None
        try:
            loss = trainer.step(batch)
        except TrainingPausedError:
            refused_batches.append(trainer.completed_steps)  # delivered after the boundary
            continue
        losses[trainer.completed_steps] = loss
    controller.join(60)
    if failures:
        raise failures[0]
    trainer.loader.close()
    assert len(set(paused_at)) >= len(paused_at) // 2, paused_at  # pauses met many different steps
    return trainer, losses, refused_batches


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers, fetch_outside, pauses",
    # Restarting two workers at every resume is slow: fewer pauses there.
    [(0, True, 50), (0, False, 50), (2, True, 12)],
    ids=["0-workers-outside", "0-workers-inside", "2-workers-outside"],
)
def test_pauses_from_another_thread_at_random_moments_resume_bit_identically(
    tmp_path, workers, fetch_outside, pauses
):
    expected, (model, optimizer) = uninterrupted(workers)
    assert torch.isfinite(torch.stack(expected)).all()  # NaN would never compare equal
    trainer, losses, refused = run_with_pauses_from_another_thread(
        tmp_path, workers, fetch_outside, pauses
    )
    assert sorted(losses) == list(range(1, STEPS + 1))
    different = [step for step in losses if not torch.equal(losses[step], expected[step - 1])]
    assert not different, f"losses differ from the uninterrupted run at steps {different}"
    for name, value in model.items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
    saved = trainer.optimizer.state_dict()["state"]
    for index, entries in optimizer["state"].items():
        assert torch.equal(entries["momentum_buffer"], saved[index]["momentum_buffer"]), index
    if fetch_outside:  # the case this test is about really happened: a fetched batch was refused
        assert len(refused) >= pauses // 5, refused
