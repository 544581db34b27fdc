"""A small trainer whose resume objects return its model wrapped: compiled, by DataParallel,
both, or not at all.

It is run in the test process, by ``compiled_runs.py`` in a process of its own, and by
an earlier release of the package (``tests/compat/make_wrapped_files.py``), so it imports
only public names every release has.

``wrapping`` names what ``_resume_objects()`` returns as ``"model"`` (the names its
``state_dict()`` has) and what the optimizer is built from; ``compiled`` says whether the
steps run through ``torch.compile``. A wrapping that is compiled while the steps run eager
(an ``OptimizedModule`` that is never called) has the names of a compiled module and the
arithmetic of the eager one: a file of it resumes bit-identically into an eager trainer.
DataParallel over no GPU calls its module, so it changes the names and nothing else.

Each step is one micro-batch of a 2-batch gradient-accumulation window, so a pause after
an odd step carries gradients; AdamW over two weight-decay groups, a per-step LR schedule,
gradient clipping and dropout drawing from torch's generator.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume import TrainingResumeMixin, random_state, training_step
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

WRAPPINGS = ("plain", "compiled", "parallel", "compiled+parallel", "parallel+compiled")
CONFIG = {"model": {"width": 4, "dropout": 0.25}, "optim": {"lr": 0.05}, "accumulate": 2}
VERSION = "wrapped/1"
BATCH = 2
STEPS = 8  # every run ends here
PAUSE_STEP = 3  # inside an accumulation window: the pause holds gradients


def plain_module() -> nn.Module:
    """Two layers of the same shape, so a moment given to the wrong one would not be refused."""
    width = CONFIG["model"]["width"]
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Dropout(CONFIG["model"]["dropout"]),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 1),
    )


def wrap(module: nn.Module, wrapping: str) -> nn.Module:
    """``module`` wrapped as ``wrapping`` says: ``"compiled+parallel"`` is
    ``torch.compile(DataParallel(module))``. Compiling happens at a first call only."""
    wrapped = module
    for layer in wrapping.split("+")[::-1]:
        if layer == "parallel":
            wrapped = nn.DataParallel(wrapped)
        elif layer == "compiled":
            wrapped = torch.compile(wrapped)
        elif layer != "plain":
            raise ValueError(f"unknown wrapping {wrapping!r}")
    return wrapped


class WrappedTrainer(TrainingResumeMixin):
    """The trainer; ``wrapping`` and ``compiled`` as the module docstring says; ``resume_points``
    (a ``ResumePoints``) to take points."""

    def __init__(
        self, wrapping: str = "plain", *, compiled: bool = False, resume_points: Any = None
    ) -> None:
        torch.manual_seed(0)
        self.module = plain_module()
        self.network = torch.compile(self.module) if compiled else self.module  # runs the steps
        self.model = wrap(self.module, wrapping)
        named = list(self.model.named_parameters())
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=CONFIG["optim"]["lr"],
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, 10) / 10))
        )
        generator = torch.Generator().manual_seed(7)
        width = CONFIG["model"]["width"]
        dataset = TensorDataset(
            torch.randn(12, width, generator=generator), torch.randn(12, 1, generator=generator)
        )
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            sampler=InfiniteRandomSampler(
                dataset, generator=torch.Generator().manual_seed(11), resumable=True
            ),
            resumable=True,
        )
        self.batches = iter(self.loader)
        self.losses: list[torch.Tensor] = []  # of the steps run by this object
        torch.manual_seed(100)  # the dropout masks' generator
        self._initialize_training_resume(CONFIG, version=VERSION, resume_points=resume_points)

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _rebuild_resume_iterators(self) -> None:
        self.batches = iter(self.loader)

    @training_step
    def step(self) -> None:
        inputs, targets = next(self.batches)
        loss = nn.functional.mse_loss(self.network(inputs), targets) / CONFIG["accumulate"]
        loss.backward()
        self.losses.append(loss.detach().clone())
        if (self.completed_steps + 1) % CONFIG["accumulate"] == 0:
            nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)

    def run_to(self, steps: int) -> None:
        while self.completed_steps < steps:
            self.step()

    def outcome(self) -> dict[str, Any]:
        """What an exact continuation reproduces, by the plain module's parameter names: the
        weights, each parameter's gradient and optimizer state, the optimizer's and
        scheduler's states, the losses of the steps this object ran, the generators now."""
        named = dict(self.module.named_parameters())
        return _copied(
            {
                "model": self.module.state_dict(),
                "gradients": {name: param.grad for name, param in named.items()},
                "moments": {name: self.optimizer.state.get(p, {}) for name, p in named.items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "losses": self.losses,
                "completed_steps": self.completed_steps,
                "rng": random_state(),
            }
        )


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copied(item) for item in value]
    return value
