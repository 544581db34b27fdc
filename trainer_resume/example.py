"""The example trainer: a realistic small training job that pauses and resumes exactly.

A small CNN with Dropout and BatchNorm, AdamW with a per-step LR schedule, bfloat16
autocast on CPU with ``torch.amp.GradScaler("cpu")``, and a ``ResumableDataLoader``
with 2 workers whose augmentation (random crop, flip, pixel noise) draws from Python
``random``, NumPy's global generator and torch. A ``samples_seen`` counter is the
extra state. Everything is built from a config mapping (a plain dict or an
OmegaConf ``DictConfig``) with the sections of the bundled ``configs/demo.yaml``::

    from trainer_resume.example import default_config, run_training

    config = default_config()
    first = run_training(config, pause_after=20, pause_path="pause.ckpt")  # returns paused at step 20
    rest = run_training(config, resume_path="pause.ckpt")  # steps 21 .. train.steps, exactly
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from .durable import load_checkpoint
from .loaders import InfiniteRandomSampler, ResumableDataLoader
from .mixin import TrainingResumeMixin, serialized_training, training_step
from .rng import derive_seed, random_state, restore_random_state
from .state import cpu_state

__all__ = [
    "EXAMPLE_VERSION",
    "ExampleTrainer",
    "SyntheticImages",
    "TrainingResult",
    "build_model",
    "default_config",
    "default_config_text",
    "run_training",
]

EXAMPLE_VERSION = "1"

_SAMPLER_SEED = 1
_LOADER_SEED = 2


def default_config_text() -> str:
    """The bundled default config (``trainer_resume/configs/demo.yaml``) as YAML text."""
    return (resources.files("trainer_resume") / "configs" / "demo.yaml").read_text(encoding="utf-8")


def default_config() -> DictConfig:
    """The bundled default config as an OmegaConf ``DictConfig``."""
    config = OmegaConf.create(default_config_text())
    assert isinstance(config, DictConfig)
    return config


class SyntheticImages(Dataset):
    """Images scattered around one random prototype per class, with random augmentation.

    The images are generated once from ``seed``. ``dataset[i]`` returns
    ``(image, label)``: the image reflect-padded by ``crop_padding`` and cropped back
    at an offset from Python ``random``, flipped horizontally when NumPy's global
    generator says so, plus torch noise. Under a ``ResumableDataLoader`` these draws
    are seeded per sample, so they replay exactly after a resume.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        image_size: int,
        channels: int,
        num_classes: int,
        seed: int,
        noise: float,
        crop_padding: int,
        flip_probability: float,
        pixel_noise: float,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        prototypes = torch.randn(num_classes, channels, image_size, image_size, generator=generator)
        self.labels = torch.randint(num_classes, (num_samples,), generator=generator)
        shape = (num_samples, channels, image_size, image_size)
        self.images = prototypes[self.labels] + noise * torch.randn(shape, generator=generator)
        self.crop_padding = crop_padding
        self.flip_probability = flip_probability
        self.pixel_noise = pixel_noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        pad = self.crop_padding
        if pad:
            size = image.shape[-1]
            padded = F.pad(image, (pad, pad, pad, pad), mode="reflect")
            top, left = random.randint(0, 2 * pad), random.randint(0, 2 * pad)
            image = padded[:, top : top + size, left : left + size]
        if np.random.random() < self.flip_probability:
            image = image.flip(-1)
        image = image + self.pixel_noise * torch.randn_like(image)
        return image.contiguous(), self.labels[index]


def build_model(config: Any) -> nn.Sequential:
    """The small CNN of the ``model`` and ``data`` sections."""
    first, second = config.model.channels
    return nn.Sequential(
        nn.Conv2d(config.data.channels, first, 3, padding=1, bias=False),
        nn.BatchNorm2d(first),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(first, second, 3, padding=1, bias=False),
        nn.BatchNorm2d(second),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(config.model.dropout),
        nn.Linear(second, config.data.num_classes),
    )


def _schedule(warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _as_config(config: Mapping[str, Any] | DictConfig) -> DictConfig:
    view = config if isinstance(config, DictConfig) else OmegaConf.create(dict(config))
    if not isinstance(view, DictConfig):
        raise TypeError(f"config must be a mapping, got {type(config).__name__}")
    view = OmegaConf.create(OmegaConf.to_container(view, resolve=True))
    OmegaConf.set_struct(view, True)  # a missing section or key fails naming it
    return view


class ExampleTrainer(TrainingResumeMixin):
    """The example training job, built from a config (see ``configs/demo.yaml``).

    Seeds Python, NumPy and torch from ``train.seed`` (as a training script does),
    then builds the model, AdamW, the LR schedule, the GradScaler and the loader.
    ``train_step()`` runs one step and returns its loss; ``snapshot()`` returns the
    state to compare between runs; ``close()`` stops the loader's workers.

    Args:
        config: A plain mapping or an OmegaConf ``DictConfig``; it is signed (``load``
            excluded), so a pause file resumes only under the same config.
    """

    def __init__(self, config: Mapping[str, Any] | DictConfig) -> None:
        self.config = cfg = _as_config(config)
        seed = int(cfg.train.seed)
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)
        self.model = build_model(cfg)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.optimizer.lr,
            betas=tuple(cfg.optimizer.betas),
            weight_decay=cfg.optimizer.weight_decay,
        )
        schedule = cfg.scheduler
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            _schedule(schedule.warmup_steps, schedule.total_steps, schedule.min_lr_ratio),
        )
        self.autocast_dtype = getattr(torch, cfg.amp.dtype)
        self.scaler = torch.amp.GradScaler(
            "cpu",
            init_scale=cfg.amp.init_scale,
            growth_interval=cfg.amp.growth_interval,
            enabled=cfg.amp.enabled,
        )
        self.dataset = SyntheticImages(
            num_samples=cfg.data.num_samples,
            image_size=cfg.data.image_size,
            channels=cfg.data.channels,
            num_classes=cfg.data.num_classes,
            seed=cfg.data.seed,
            noise=cfg.data.noise,
            crop_padding=cfg.loader.crop_padding,
            flip_probability=cfg.loader.flip_probability,
            pixel_noise=cfg.loader.pixel_noise,
        )
        sampler = InfiniteRandomSampler(
            self.dataset,
            generator=torch.Generator().manual_seed(derive_seed(seed, _SAMPLER_SEED)),
            resumable=True,
        )
        self.loader = ResumableDataLoader(
            self.dataset,
            batch_size=cfg.loader.batch_size,
            sampler=sampler,
            num_workers=cfg.loader.num_workers,
            generator=torch.Generator().manual_seed(derive_seed(seed, _LOADER_SEED)),
            resumable=True,
        )
        self.samples_seen = 0
        self._batches = self._new_batch_iterator()
        self._initialize_training_resume(config, version=EXAMPLE_VERSION)

    # --- resume hooks -------------------------------------------------------------
    def _resume_objects(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }

    def _resume_loaders(self) -> dict[str, ResumableDataLoader]:
        return {"train": self.loader}

    def _regular_checkpoint(self) -> dict[str, Any]:
        return {"model": self.model.state_dict()}

    def _resume_shared_keys(self) -> tuple[str, ...]:
        return ("model",)

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"samples_seen": self.samples_seen}

    def _load_resume_extra_state(self, state: Mapping[str, Any]) -> None:
        self.samples_seen = int(state["samples_seen"])

    def _rebuild_resume_iterators(self) -> None:
        self._batches = self._new_batch_iterator()

    def _new_batch_iterator(self) -> Any:
        return iter(self.loader)

    # --- training -----------------------------------------------------------------
    @training_step
    def train_step(self) -> torch.Tensor:
        """Run one optimisation step; return the loss (float32 scalar)."""
        images, labels = next(self._batches)
        self.model.train()
        with torch.autocast(
            "cpu", dtype=self.autocast_dtype, enabled=bool(self.config.amp.enabled)
        ):
            logits = self.model(images)
        loss = F.cross_entropy(logits.float(), labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.samples_seen += int(labels.numel())
        return loss.detach()

    @serialized_training
    def load_weights(self, path: str | os.PathLike[str]) -> int:
        """Load only the model weights from a pause file (the usual weights-only resume).

        The optimizer, schedule, scaler, loader position and RNG stay fresh.

        Returns:
            The completed steps recorded in the file.
        """
        checkpoint = load_checkpoint(path)
        weights = checkpoint["objects"].get("model")
        if weights is None:
            weights = checkpoint["regular"]["model"]
        self.model.load_state_dict(weights)
        return int(checkpoint["completed_steps"])

    def snapshot(self) -> dict[str, Any]:
        """CPU copies of the model, optimizer, schedule, scaler, loader position and
        counters, plus the next draws of Python, NumPy and torch (the global
        generators are left as they were)."""
        return {
            "model": cpu_state(self.model.state_dict()),
            "optimizer": cpu_state(self.optimizer.state_dict()),
            "scheduler": cpu_state(self.scheduler.state_dict()),
            "scaler": cpu_state(self.scaler.state_dict()),
            "loader": cpu_state(self.loader.state_dict()),
            "extra": {"samples_seen": self.samples_seen, "completed_steps": self.completed_steps},
            "rng": rng_draws(),
        }

    def close(self) -> None:
        """Stop the loader's workers and put back signal handlers this trainer installed."""
        self.restore_signal_handlers()
        self.loader.close()


def rng_draws() -> dict[str, torch.Tensor]:
    """The next few numbers of Python ``random``, NumPy's global generator and torch CPU,
    without consuming them."""
    saved = random_state()
    try:
        return {
            "python": torch.tensor([random.random() for _ in range(4)], dtype=torch.float64),
            "numpy": torch.from_numpy(np.random.random(4)),
            "torch": torch.rand(4),
        }
    finally:
        restore_random_state(saved)


@dataclass
class TrainingResult:
    """What one call of :func:`run_training` did.

    Attributes:
        losses: The loss of every step run in this call, in order.
        first_step: Global 1-based index of ``losses[0]`` (``completed + 1`` at start).
        completed_steps: Steps completed when the call returned (global).
        paused: Whether the call ended with a pause (file written).
        snapshot: ``ExampleTrainer.snapshot()`` at the end.
    """

    losses: list[float]
    first_step: int
    completed_steps: int
    paused: bool
    snapshot: dict[str, Any]

    def as_state(self) -> dict[str, Any]:
        """Plain data (``torch.save`` / ``torch.load(weights_only=True)`` round-trip)."""
        return asdict(self)


def run_training(
    config: Mapping[str, Any] | DictConfig,
    *,
    steps: int | None = None,
    pause_path: str | os.PathLike[str] | None = None,
    pause_after: int | None = None,
    handle_signals: bool = False,
    wait_for_pause_after: int | None = None,
    wait_timeout: float = 120.0,
    resume_path: str | os.PathLike[str] | None = None,
    weights_only_path: str | os.PathLike[str] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainingResult:
    """Train the example trainer up to ``steps`` completed steps (global), or until it pauses.

    Meant to be the body of a training process: it sets torch's intra-op threads to
    ``train.threads`` for its duration.

    Args:
        config: The config (plain mapping or ``DictConfig``).
        steps: Total steps of the run (default ``train.steps``); a resumed run
            continues from the file's completed steps up to this total.
        pause_path: Where a pause is written (needed by ``pause_after``,
            ``handle_signals`` and ``wait_for_pause_after``).
        pause_after: Pause after this many completed steps and return.
        handle_signals: Turn the signals of ``pause.signals`` (default SIGTERM and
            SIGUSR1) into a pause at the next step boundary.
        wait_for_pause_after: After this many completed steps, wait (up to
            ``wait_timeout`` seconds) for a pause request (a signal) and pause right
            there, so that a pause sent from outside lands on a known step.
        wait_timeout: See ``wait_for_pause_after``.
        resume_path: Resume from this pause file first (exact resume).
        weights_only_path: Load only the model weights from this pause file and
            continue from its step with a fresh optimizer, schedule, scaler, loader
            and RNG (the usual, inexact resume; for comparison).
        on_step: Called as ``on_step(step, loss)`` after every step.

    Returns:
        A :class:`TrainingResult`.

    Raises:
        ValueError: a pause option without ``pause_path``, or both resume options.
        TimeoutError: no pause request arrived within ``wait_timeout``.
    """
    if pause_path is None and (
        pause_after is not None or handle_signals or wait_for_pause_after is not None
    ):
        raise ValueError("pause_after, handle_signals and wait_for_pause_after need pause_path")
    if resume_path is not None and weights_only_path is not None:
        raise ValueError("give resume_path or weights_only_path, not both")
    threads = torch.get_num_threads()
    trainer = None
    try:
        trainer = ExampleTrainer(config)
        torch.set_num_threads(int(trainer.config.train.threads))
        total = int(trainer.config.train.steps if steps is None else steps)
        start = 0
        if resume_path is not None:
            trainer.resume(resume_path)
            start = trainer.completed_steps
        elif weights_only_path is not None:
            start = trainer.load_weights(weights_only_path)
        if handle_signals:
            names = trainer.config.pause.signals
            trainer.pause_on_signal(
                pause_path, signals=[signal.Signals[str(name)] for name in names]
            )
        losses: list[float] = []
        step = start
        while step < total and not trainer.paused:
            loss = float(trainer.train_step())
            step += 1
            losses.append(loss)
            if on_step is not None:
                on_step(step, loss)
            if trainer.paused:
                break
            if pause_after is not None and step == pause_after:
                trainer.pause(pause_path)
            elif wait_for_pause_after is not None and step == wait_for_pause_after:
                _wait_for_request(trainer, wait_timeout)
        return TrainingResult(losses, start + 1, step, trainer.paused, trainer.snapshot())
    finally:
        if trainer is not None:
            trainer.close()
        torch.set_num_threads(threads)


def _wait_for_request(trainer: ExampleTrainer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not trainer.pause_requested:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no pause request arrived within {timeout} s after step {trainer.completed_steps}"
            )
        time.sleep(0.005)
    trainer.pause_if_requested()
