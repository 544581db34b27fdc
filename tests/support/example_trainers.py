"""Factories for the example trainer and deliberately broken variants (importable by spawned processes)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from omegaconf import OmegaConf

from trainer_resume.example import ExampleTrainer, default_config
from trainer_resume.rng import random_state, restore_random_state

CYCLE = 6  # batches per pass over the dataset with the config below


def small_config(**train: Any) -> dict[str, Any]:
    """The bundled config, shrunk: 48 samples in batches of 8, still 2 workers."""
    base = default_config()
    base.data.num_samples = 8 * CYCLE
    base.data.image_size = 12
    base.model.channels = [8, 16]
    base.loader.batch_size = 8
    base.scheduler.warmup_steps = 3
    base.scheduler.total_steps = 20
    base.amp.growth_interval = 2  # the scale moves within a few steps
    base.train.steps = 14
    for key, value in train.items():
        base.train[key] = value
    return OmegaConf.to_container(base)


def run_step(trainer: ExampleTrainer) -> torch.Tensor:
    return trainer.train_step()


def snapshot(trainer: ExampleTrainer) -> dict[str, Any]:
    return trainer.snapshot()


def make(kind: type[ExampleTrainer] = ExampleTrainer) -> ExampleTrainer:
    # One intra-op thread in every process of a comparison: the parent's and a spawned
    # child's kernels then split their work identically, and 2 shared cores are not
    # oversubscribed by the loader workers. The tests restore the parent's setting.
    torch.set_num_threads(1)
    return kind(small_config())


class DropsOptimizerState(ExampleTrainer):
    def _resume_objects(self):
        objects = super()._resume_objects()
        del objects["optimizer"]
        return objects


class SkipsRngRestore(ExampleTrainer):
    def resume(self, path):
        before = random_state()
        super().resume(path)
        restore_random_state(before)  # undoes the RNG restore


class SkipsLoaderState(ExampleTrainer):
    def _resume_loaders(self):
        return {}


class DrawsOnIterator(ExampleTrainer):
    """A pipeline whose iterator creation draws from torch's global generator, as
    ``torch.utils.data.DataLoader`` does for its base seed."""

    def _new_batch_iterator(self):
        torch.empty((), dtype=torch.int64).random_()
        return super()._new_batch_iterator()


class RestoresRngBeforeIterators(DrawsOnIterator):
    def _rebuild_resume_iterators(self):
        pass  # deferred until after the RNG restore below

    def resume(self, path):
        super().resume(path)
        DrawsOnIterator._rebuild_resume_iterators(self)


def factory(kind: type[ExampleTrainer] = ExampleTrainer):
    return functools.partial(make, kind)
