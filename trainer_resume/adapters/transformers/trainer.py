"""``ResumableTrainer``: a ``transformers.Trainer`` that pauses and resumes exactly.

Where a pause lands. A SIGTERM (or ``request_pause``) is recorded at once and written
at the next *landing*: the end of an optimizer step's work, after the optimizer and
scheduler stepped, ``on_step_end`` ran and the step's logging, evaluation and
checkpoint (``_maybe_log_save_evaluate``) are done. For an epoch's last step that
work includes the epoch's end (``on_epoch_end`` and its logging, evaluation and
checkpoint), so the landing comes after those. The resumed ``train()`` then continues
with the next step's first batch and nothing is done twice or left out. The last
step of the run is no landing: a request arriving then lets the run finish.

How the Trainer is steered (transformers 5.24 internals, each named where it is used):

- the training loader is built by the trainer itself (:mod:`.loader`), outside
  ``accelerator.prepare`` and ``skip_first_batches``;
- ``_init_training_state`` tells the epoch loop which epoch a resumed run starts in;
  ``_run_epoch`` is given the resumed epoch's remaining batches and steps (so the
  accumulation windows and the epoch's short last window fall where they did), and
  ``state.epoch`` is recomputed from the loader's count in ``on_step_end``;
- ``_maybe_log_save_evaluate`` is where a landing is taken (and skipped after a pause);
- the loss bookkeeping (``_tr_loss`` and the others in :mod:`.loop_state`) is saved
  and restored with ``TrainerState``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from transformers import Trainer, TrainerCallback

from ...errors import (
    CheckpointFormatError,
    ResumeStateMismatchError,
    UnsupportedResumeConfigurationError,
)
from ...finished import refuse_if_finished
from ...loaders import ResumableDataLoader
from ...mixin import TrainingResumeMixin, serialized_training, training_step
from ...module_modes import MODES_KEY, restore_object_modes
from ...pause_signals import DEFAULT_PAUSE_SIGNALS, pause_signals_blocked
from ...resume_points import ResumePoints
from ...resume_points.files import latest_checkpoint
from ...rng import restore_random_state
from ...state import PauseCheckpoint, StrPath
from ...storage import paths
from ...storage.urls import set_storage_options
from .._kept_workers import stop_kept_workers
from . import loop_state
from .loader import TrainLoader, build_train_loader
from .refusals import check_trainer, refuse_train_arguments

__all__ = ["ResumableTrainer"]

# TrainingArguments that name where files go or change how fast batches come or how
# progress shows, never a computation or a random draw: a resume may change them (a run
# folder may move). Not the workers: the training loader's batches do not depend on
# them, but an evaluation loader's collator then draws in its workers instead of from
# the main process's generators. Left out of the signed config as a `config_ignore`
# path is, but always (a pause file does not list them).
_UNSIGNED_ARGUMENTS = (
    "output_dir",
    "run_name",
    "dataloader_pin_memory",
    "dataloader_prefetch_factor",
    "disable_tqdm",
)
# Trainer attributes a pause leaves out on purpose: wrappers of what it saves, and the
# Accelerator (whose counters the Trainer sets itself before each micro-batch).
_NOT_SAVED = ("optimizer", "model_wrapped", "accelerator", "deepspeed")
_RUN_EPOCH = inspect.signature(Trainer._run_epoch)


class _Resumed:
    """A resume in progress: the verified pause file (read once, dropped once restored),
    its RNG state and module modes, and where the loop continues."""

    __slots__ = ("at_epoch_start", "checkpoint", "modes", "path", "position", "rng")

    def __init__(self, path: str, checkpoint: Any, position: loop_state.Position) -> None:
        self.path = path
        self.checkpoint: Any = checkpoint
        self.rng = checkpoint.get("rng")  # checked by resume() before it is used
        self.modes = checkpoint.get(MODES_KEY)  # likewise
        self.position = position
        self.at_epoch_start = position.batches == 0


class _LoopCallback(TrainerCallback):
    """The trainer's own callback, first in the list: it resumes, keeps ``state.epoch``
    exact and notes where the loop is, before any other callback looks."""

    def __init__(self, trainer: ResumableTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._begin_training()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._begin_epoch()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._end_step()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._end_epoch()


class ResumableTrainer(TrainingResumeMixin, Trainer):
    """A ``transformers.Trainer`` whose ``train()`` pauses on SIGTERM and resumes exactly.

    Takes every ``Trainer`` argument, plus ``pause_path``. While ``train()`` runs, a
    SIGTERM or SIGUSR1 (to the process or its group) pauses at the next optimizer
    step's end into ``pause_path`` and ``train()`` returns normally (:attr:`paused` is
    true). Running the same command again, ``train()`` resumes from ``pause_path``
    and continues bit-identically: every later batch, loss, logged value,
    ``state.epoch``, the final weights and optimizer state are those of a run that
    was never interrupted. Once a ``train()`` completes, the run is marked finished
    and a later ``train()`` raises ``RunFinishedError`` (340).

    The training loader is the trainer's own (a ``ResumableDataLoader`` with the
    Trainer's sampler, collator, workers and seeds); batches drawn from Python's
    ``random``, NumPy's or torch's global generators (``DataCollatorForLanguageModeling``,
    augmentation in ``__getitem__``) replay exactly with any number of workers. What
    cannot be made exact is refused when ``train()`` starts, see
    :mod:`trainer_resume.adapters.transformers.refusals`.

    A subclass of your own can inherit from it instead of ``Trainer``; keep calling
    ``super()`` in the methods you override.

    Args:
        *args: ``transformers.Trainer``'s.
        pause_path: The pause file (its finished marker goes beside it); a local path or
            an fsspec URL (``s3://...``, docs/cloud-storage.md).
        storage_options: fsspec options for a ``pause_path`` that is a URL, besides what
            the environment gives.
        config: Your own settings to hold the resume to (a dict, dataclass or
            OmegaConf config), besides the ``TrainingArguments`` (which are held
            always, except ``output_dir``, ``run_name``, the loaders' pinning and
            prefetch and the progress bars). Signed as
            ``{"training_arguments": ..., "config": config}``.
        config_ignore: Dotted paths into that signed mapping left out with their
            subtrees: ``"config.logger"`` for a key of ``config``,
            ``"training_arguments.report_to"`` for an argument. A pause records
            them; a resume must pass at least those.
        version: The version of your training code; a pause file of another is refused.
        key: Sign pause files with this key (bytes, at least 16) and refuse unsigned ones.
        resume_points: Take periodic resume points (``ResumePoints``) besides the pause
            on a signal; ``train()`` continues from the newest of them and the pause file.
        signals: The signals that pause (default SIGTERM and SIGUSR1).
        **kwargs: ``transformers.Trainer``'s.
    """

    def __init__(
        self,
        *args: Any,
        pause_path: StrPath,
        config: Any = None,
        config_ignore: Collection[str] = (),
        version: str = "1",
        key: bytes | None = None,
        resume_points: ResumePoints | None = None,
        signals: Iterable[int] = DEFAULT_PAUSE_SIGNALS,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.pause_path = paths.location(pause_path)
        if storage_options is not None:
            set_storage_options(self.pause_path, storage_options)
        self._pause_signals = tuple(signals)
        self._resume_key = key
        self._points = resume_points
        if resume_points is not None and not paths.same_location(
            paths.parent(self.pause_path), resume_points.directory
        ):
            raise ValueError(
                f"pause_path {self.pause_path!r} must be in the resume points' directory "
                f"{resume_points.directory!r}: train() continues from the newest file there"
            )
        self._train_loader: TrainLoader | None = None
        self._resumed: _Resumed | None = None
        self._epoch_of_loop = 0  # the epoch _run_epoch runs, and its batch count
        self._steps_in_epoch = 1
        # Set by on_step_end: the next _maybe_log_save_evaluate ends that step's work
        # ("step"), or, when the step ends the epoch, the one after on_epoch_end ("epoch").
        self._landing: str | None = None
        self.callback_handler.callbacks.insert(0, _LoopCallback(self))
        arguments = {
            name: value
            for name, value in self.args.to_dict().items()
            if name not in _UNSIGNED_ARGUMENTS
        }
        self._initialize_training_resume(
            {"training_arguments": arguments, "config": config},
            version=version,
            key=key,
            resume_points=resume_points,
            excluded_attributes=_NOT_SAVED,
            config_ignore=config_ignore,
        )

    # ------------------------------------------------------------------ train
    @serialized_training
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> Any:
        """Train, or continue the paused run from ``pause_path``; pause on a signal.

        Returns:
            ``Trainer.train``'s ``TrainOutput``; after a pause, that of the steps run
            so far (:attr:`paused` is then true: exit, and run again to continue).

        Raises:
            RunFinishedError: the run completed before (its finished marker is there).
            UnsupportedResumeConfigurationError: a setting that cannot be resumed
                exactly (see :mod:`~trainer_resume.adapters.transformers.refusals`).
            ResumeError: the pause file is refused (nothing was trained).
        """
        refuse_train_arguments(resume_from_checkpoint, trial)
        check_trainer(self)
        self._resumed = self._resume_source()
        eval_on_start = self.args.eval_on_start
        self.pause_on_signal(self.pause_path, self._pause_signals, warn_without_step_after=None)
        try:
            if self._resumed is not None:
                self.args.eval_on_start = False  # the paused run evaluated at its start
            output = super().train(ignore_keys_for_eval=ignore_keys_for_eval)
        finally:
            self.args.eval_on_start = eval_on_start
            self.restore_signal_handlers()
            self._resumed = None
            self._landing = None
            if self._train_loader is not None:  # its workers stop; its position stays
                self._train_loader.loader.close()
            if self._points is not None:  # returned or raised: the newest point is on disk
                self._points.wait()
        if not self.paused:
            self.finish(self.pause_path)
        return output

    def _resume_source(self) -> _Resumed | None:
        # The newest of the pause file and the resume points, read and verified once;
        # resume() takes it from there when the optimizer and scheduler exist.
        refuse_if_finished(self.pause_path, key=self._resume_key)
        path = self.pause_path if paths.exists(self.pause_path) else None
        if self._points is not None:  # pause_path is in their directory (see __init__)
            path = latest_checkpoint(self._points.directory, key=self._resume_key)
        if path is None:
            return None
        checkpoint = super()._load_pause_checkpoint(path)
        extra = checkpoint.get("extra") if isinstance(checkpoint, Mapping) else None
        saved = extra.get(loop_state.EXTRA_KEY) if isinstance(extra, Mapping) else None
        if saved is None:
            raise CheckpointFormatError(
                f"{path} holds no Trainer state: it was not written by a ResumableTrainer"
            )
        where = loop_state.position(saved, self.args.gradient_accumulation_steps)
        return _Resumed(path, checkpoint, where)

    # ------------------------------------------------------------ the loader
    def get_train_dataloader(self) -> TrainLoader:  # type: ignore[override]
        """The training loader, a ``ResumableDataLoader`` built as ``Trainer`` builds its own.

        Override ``_get_train_sampler``, the collator or the dataset to change it; an
        override of this method may also return a ``ResumableDataLoader`` built with
        ``resumable=True``.
        """
        return build_train_loader(self)

    def _adopt_loader(self, loader: Any) -> TrainLoader:
        if isinstance(loader, TrainLoader):
            return loader
        if isinstance(loader, ResumableDataLoader) and loader.resumable:
            return TrainLoader(loader)
        raise UnsupportedResumeConfigurationError(
            f"{type(self).__name__}.get_train_dataloader() returns a {type(loader).__name__}, "
            "whose position a pause cannot save; return super().get_train_dataloader(), or a "
            "trainer_resume.loaders.ResumableDataLoader(..., resumable=True)"
        )

    # ------------------------------------------------- Trainer internals steered
    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        # transformers 5.24: returns (epochs_trained, steps_trained_in_current_epoch);
        # the epoch loop starts at the first. The batches already trained are the
        # loader's business (its restored position), so none are skipped.
        epochs_trained, steps = super()._init_training_state(*args, **kwargs)
        if self._resumed is not None:
            return self._resumed.position.epoch, 0
        return epochs_trained, steps

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        # transformers 5.24: _run_epoch(model, epoch, train_dataloader, steps_in_epoch,
        # num_update_steps_per_epoch, ...) numbers its batches from 0. A resumed epoch is
        # given as what is left of it, so that windows end where they did (the batches
        # delivered before are whole windows) and its short last window is kept.
        bound = _RUN_EPOCH.bind(self, *args, **kwargs)
        values = bound.arguments
        loader = self._train_loader
        if loader is None or values["train_dataloader"] not in (loader, loader.loader):
            raise RuntimeError("ResumableTrainer._run_epoch was called outside its train()")
        values["train_dataloader"] = loader
        self._epoch_of_loop = values["epoch"]
        self._steps_in_epoch = values["steps_in_epoch"]
        resumed = self._resumed
        if resumed is not None and resumed.position.epoch == values["epoch"]:
            self._resumed = None
            start = resumed.position.batches
            if start:
                if start >= values["steps_in_epoch"]:
                    raise ResumeStateMismatchError(
                        f"{resumed.path} paused after batch {start} of an epoch that has "
                        f"{values['steps_in_epoch']} here: resume with the paused run's dataset "
                        "and batch size"
                    )
                accumulation = self.args.gradient_accumulation_steps
                values["steps_in_epoch"] -= start
                values["num_update_steps_per_epoch"] -= start // accumulation
                loader.start_at(start)
                # The pause was taken just before this epoch's next batch: callbacks run
                # since the restore (on_train_begin, on_epoch_begin) must not move the RNG
                # or change the modules' modes (a layer frozen in on_train_begin).
                self._as_paused(resumed)
        return super()._run_epoch(*bound.args[1:], **bound.kwargs)

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # transformers 5.24: called after on_step_end (the step's logging, evaluation and
        # checkpoint) and after on_epoch_end (the epoch's). A landing is taken after it.
        if self.paused:
            return  # the pause holds the run as of its landing: nothing more is done
        super()._maybe_log_save_evaluate(*args, **kwargs)
        landing, self._landing = self._landing, None
        if landing is None:
            return
        loader = self._train_loader
        assert loader is not None
        if self.control.should_training_stop:
            self._count_last_step()
            return
        if landing == "step" and (loader.epoch_ended or self.control.should_epoch_stop):
            self._landing = "step-at-epoch-end"  # on_epoch_end turns it into "epoch"
            return
        if landing == "epoch":
            loader.end_epoch()
        self._step_completed()
        # One the boundary handed on to after the epoch's end, whose work is done now.
        self.pause_if_requested(epoch_end_done=True)
        if self.paused:
            self.control.should_training_stop = True

    @training_step
    def _step_completed(self) -> None:
        """An optimizer step and its end work are done: a pause or resume point may land here."""

    def _count_last_step(self) -> None:
        # The run's last step: training ends here and a pause (or resume point) must not
        # land, since a resumed loop would train past the end; count it if none would.
        points = self._points
        due = points is not None and points.wants_boundary(self.completed_steps + 1)
        if not self.pause_requested and not due:
            self._step_completed()

    # ------------------------------------------------------- callback events
    def _begin_training(self) -> None:
        self._train_loader = self._adopt_loader(self.callback_handler.train_dataloader)
        resumed = self._resumed
        if resumed is not None:
            self.resume(resumed.path)
            resumed.checkpoint = None  # restored: only its RNG state is needed again

    def _begin_epoch(self) -> None:
        resumed = self._resumed
        if resumed is not None and resumed.at_epoch_start:
            # The pause was taken before this epoch began: the callbacks run since the
            # restore (on_train_begin) must not move the RNG or change the modes.
            self._as_paused(resumed)
            self._resumed = None

    def _as_paused(self, resumed: _Resumed) -> None:
        restore_random_state(resumed.rng)
        restore_object_modes(resumed.modes, self._resume_objects())

    def _end_step(self) -> None:
        loader = self._train_loader
        assert loader is not None
        # transformers 5.24 sets state.epoch = epoch + (step + 1) / steps_in_epoch with
        # the step numbered in _run_epoch, from 0 in a resumed epoch too: the same
        # expression with the loader's count is the uninterrupted run's value.
        self.state.epoch = self._epoch_of_loop + loader.batches_in_epoch / self._steps_in_epoch
        self._landing = "step"

    def _end_epoch(self) -> None:
        # A step whose landing waits for the epoch's end work: that work ends next.
        self._landing = "epoch" if self._landing == "step-at-epoch-end" else None

    # --------------------------------------------------------- mixin hooks
    def _resume_objects(self) -> Mapping[str, Any]:
        if self.optimizer is None or self._train_loader is None:
            raise RuntimeError(
                f"{type(self).__name__} saves its state while train() runs, once the optimizer exists"
            )
        # accelerator.prepare wraps the optimizer (AcceleratedOptimizer.optimizer is the
        # torch one); its state is the torch optimizer's.
        objects: dict[str, Any] = {
            "model": self.model,
            "optimizer": getattr(self.optimizer, "optimizer", self.optimizer),
        }
        if self.lr_scheduler is not None:
            objects["lr_scheduler"] = self.lr_scheduler
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            objects["scaler"] = scaler
        return objects

    def _resume_loaders(self) -> Mapping[str, Any]:
        if self._train_loader is None:
            raise RuntimeError(f"{type(self).__name__} builds its training loader in train()")
        return {"train": self._train_loader.loader}

    def _resume_extra_state(self) -> Mapping[str, Any]:
        loader = self._train_loader
        assert loader is not None
        if loader.epoch_ended:
            where = loop_state.Position(self._epoch_of_loop + 1, 0)
        else:
            where = loop_state.Position(self._epoch_of_loop, loader.batches_in_epoch)
        return {loop_state.EXTRA_KEY: loop_state.capture(self, where)}

    def _validate_resume(self, checkpoint: PauseCheckpoint) -> None:
        loop_state.check(checkpoint["extra"].get(loop_state.EXTRA_KEY), self)

    def _load_resume_extra_state(self, state: Mapping[str, Any]) -> None:
        loop_state.restore(state[loop_state.EXTRA_KEY], self)

    def _load_pause_checkpoint(self, path: StrPath) -> Any:
        resumed = self._resumed
        if (
            resumed is not None
            and resumed.checkpoint is not None
            and os.fspath(path) == resumed.path
        ):
            return resumed.checkpoint  # read and verified when train() started
        return super()._load_pause_checkpoint(path)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate``, with the pause signals kept from its loader's workers,
        which stop when it ends.

        A signal arriving meanwhile is delivered when the evaluation ends and pauses at
        the next landing; the workers started for the evaluation ignore it.

        With ``dataloader_persistent_workers`` the Trainer keeps the evaluation loader and
        its workers for the next evaluation: their generators carry on, and the main
        process's generator is drawn from (for their seed) at the first evaluation only,
        while a resumed process starts them again. So every evaluation starts its
        workers, resumed or not, as without persistent workers (the training loader's
        workers persist).
        """
        try:
            with pause_signals_blocked():
                return super().evaluate(*args, **kwargs)
        finally:
            _stop_kept_evaluation_loaders(self)


def _stop_kept_evaluation_loaders(trainer: Trainer) -> None:
    """Stop the workers of the evaluation loaders the Trainer keeps, and forget the loaders."""
    kept = getattr(trainer, "_eval_dataloaders", None)  # with persistent workers only
    if not kept:
        return
    stop_kept_workers(kept.values())
    kept.clear()
