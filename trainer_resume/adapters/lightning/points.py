"""``ResumePointsCallback``: periodic, asynchronous resume points of a Lightning ``fit``.

The sibling of :class:`~trainer_resume.adapters.lightning.ResumeCallback`: every
``every_n_steps`` completed training batches (and/or ``every_seconds``) it copies the
checkpoint a pause would write to host memory and writes it durably in the
background (see :mod:`trainer_resume.resume_points` for the policy when writes fall
behind and for failures). After a hard kill, ``fit(ckpt_path=points.ckpt_path)``
continues from the newest point or pause file, bit-identically.
"""

from __future__ import annotations

import os
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from ...checkpoint_files.lightning import PAUSE_KEY
from ...durable import load_checkpoint
from ...errors import CheckpointFormatError
from ...finished import run_finished
from ...resume_points import ResumePoints, WhenBusy
from ...resume_points.files import Found, newest_checkpoint
from .callback import ResumeCallback
from .pause_point import PausePoint, at_batch_end, fit_ends_here

__all__ = ["ResumePointsCallback"]


def lightning_steps(checkpoint: Any) -> int:
    """The ``global_step`` of a Lightning pause file or resume point."""
    entry = checkpoint.get(PAUSE_KEY) if isinstance(checkpoint, dict) else None
    steps = entry.get("global_step") if isinstance(entry, dict) else None
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise CheckpointFormatError(
            f"no {PAUSE_KEY!r} entry with a global_step: not a Lightning pause file"
        )
    return steps


class ResumePointsCallback(Callback):
    """Take resume points of a Lightning ``fit``; ``ckpt_path`` picks the newest point or pause.

    Use it next to the run's ``ResumeCallback``::

        resume = ResumeCallback("runs/pause.ckpt", config=cfg)
        points = ResumePointsCallback(resume, "runs/points", every_n_steps=200, keep=3)
        trainer = pl.Trainer(callbacks=[resume, points], ...)
        trainer.fit(model, datamodule=data, ckpt_path=points.ckpt_path)

    A point holds exactly what ``resume`` writes when it pauses. Under DDP every rank
    takes the point at the same batch and rank 0 writes it. A failed background write
    is raised from the next training batch (``CheckpointWriteError``); ``fit`` waits for
    the write in flight before it returns.

    Args:
        resume: The run's ``ResumeCallback`` (its config check and RNG restore apply).
        directory: Where the points go (created if missing).
        every_n_steps: Take a point when ``trainer.global_step`` is a multiple of it.
        every_seconds: Take a point at the first batch this long after the last one.
        keep: Points kept; older ones are removed only after a newer one is durable.
        when_busy: ``"skip"`` or ``"wait"`` when a point is due while the last write runs.
        key: The signing key of the trainer's ``DurableCheckpointIO``, if it signs.
    """

    def __init__(
        self,
        resume: ResumeCallback,
        directory: str | os.PathLike[str],
        *,
        every_n_steps: int | None = None,
        every_seconds: float | None = None,
        keep: int = 3,
        when_busy: WhenBusy = "skip",
        key: bytes | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(resume, ResumeCallback):
            raise TypeError(f"resume must be the run's ResumeCallback, got {type(resume).__name__}")
        self.resume = resume
        self.points = ResumePoints(
            directory,
            every_steps=every_n_steps,
            every_seconds=every_seconds,
            keep=keep,
            when_busy=when_busy,
        )
        self.key = key
        self._resumes_from: Found | None = None  # the point ckpt_path named, as read there

    @property
    def ckpt_path(self) -> str | None:
        """The newest valid point or pause file (``resume_latest``'s rule), else ``None``.

        ``None`` too once the run is finished (``resume.finished``), as ``ResumeCallback``.
        """
        if self.resume.finished or run_finished(self.points.directory, key=self.key) is not None:
            return None
        # Read and verified once: its step comes from its contents, and fit gets this read.
        latest = newest_checkpoint(self.points.directory, key=self.key, steps_of=lightning_steps)
        pause = self.resume.ckpt_path
        if pause is not None and latest is not None:
            if lightning_steps(load_checkpoint(pause, key=self.key)) >= latest.completed_steps:
                latest = None
        self._resumes_from = latest
        return latest.path if latest is not None else pause

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Once the run is finished (``resume`` marked it), retire the points with the pause file."""
        self.points.wait()
        if trainer.is_global_zero and self.resume.finished:
            self.points.retire(completed_steps=int(trainer.global_step), key=self.key)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Let ``fit`` read the point ``ckpt_path`` named, as it was read there (verified)."""
        if stage != "fit" or self._resumes_from is None:
            return
        found, self._resumes_from = self._resumes_from, None
        self.resume.read_from(found.path, key=self.key, checkpoint=found.checkpoint)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Wait for the write in flight."""
        self.points.wait()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Wait for the write in flight."""
        self.points.wait()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Take a point when one is due (every rank at the same batch under DDP), where a
        pause of this batch would be taken (``pause_point.at_batch_end``)."""
        if trainer.fit_loop.epoch_loop._should_accumulate():
            # Mid-accumulation (the same on every rank): a point waits for the batch that
            # completes it, as a pause does, so no gradients are in flight.
            return
        at_batch_end(trainer, lambda point: self._take_point(trainer, point))

    def _take_point(self, trainer: pl.Trainer, point: PausePoint) -> None:
        failure = self.points.at_step_boundary(
            trainer.global_step,
            lambda copy: copy(self.resume.pause_checkpoint(trainer, point), {}),
            key=self.key,
            # Where the fit ends after this batch, a fit resumed from a point there would
            # skip the validation due: the point moves on, past the end (the ranks agree
            # in the boundary's own collective).
            defer=fit_ends_here(trainer),
            # ResumeCallback's entry already holds every rank's RNG: rank 0 writes its checkpoint.
            combine=lambda checkpoint: checkpoint if trainer.is_global_zero else None,
        )
        if failure is not None:
            raise failure
