"""``ResumeCallback``: exact pause and resume of a Lightning ``fit``.

A pause is requested by a signal (``SIGTERM``, ``SIGUSR1`` by default) or by
:meth:`ResumeCallback.request_pause`. At the next completed optimizer step all
ranks agree on it, rank 0 writes the pause checkpoint durably, the validation due
after that batch is left to the resumed fit (see ``pause_point``) and the
trainer stops through ``trainer.should_stop``. ``trainer.fit(..., ckpt_path=<pause
file>)`` continues bit-identically: Lightning restores the module, optimizers,
schedulers, loops and the loaders' delivered positions; this callback adds the
main-process RNG (restored once the train iterator exists), the config check, the
refusal of training loaders that cannot resume exactly and, when ``fit`` completes,
the finished marker.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import (
    Callback,
    GradientAccumulationScheduler,
    StochasticWeightAveraging,
)
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

from ... import distributed
from ..._module_names import canonical_state, live_state
from ..._signals import (
    DEFAULT_PAUSE_SIGNALS,
    Handler,
    forward_signal,
    install_handlers,
    restore_handlers,
)
from ...checkpoint_files.hparams import hyperparameter_entries, plain_hyperparameters
from ...checkpoint_files.lightning import LIGHTNING_PAUSE_FORMAT, PAUSE_KEY
from ...checks.config_match import check_config
from ...errors import (
    CheckpointFormatError,
    CheckpointWriteError,
    ConfigSignatureMismatchError,
    ResumeError,
    ResumeStateMismatchError,
    TrainingPausedError,
    UnsupportedResumeConfigurationError,
)
from ...finished import mark_finished, refuse_if_finished, run_finished
from ...launch_directory import warn_if_in_launch_directory
from ...module_modes import MODES_KEY, check_object_modes, object_modes, restore_object_modes
from ...rng import random_state, restore_random_state, validate_random_state
from ...signature import sign_config, warn_if_ignoring_nothing
from ...state import LightningPauseState, RandomState
from ...storage import paths
from ...storage.urls import set_storage_options
from .._kept_workers import stop_kept_workers
from .fit_loaders import check_combined_mode, check_train_loaders, end_loader_epochs
from .gradients import held_gradients, restore_gradients
from .io import DurableCheckpointIO, PauseFileReader, RunFiles, check_loadable
from .metrics import (
    epoch_metrics_in_progress,
    epoch_results_state,
    logged_metrics_state,
    restore_epoch_results,
    restore_logged_metrics,
)
from .pause_point import (
    PausePoint,
    at_batch_end,
    end_epoch_on_resume,
    end_restart,
    finish_batch_in_checkpoint,
    fit_ends_after_batch,
    restore_fit_loop,
    skip_last_save_at_train_end,
    stop_after_batch,
    undo_pending_validation_mark,
)
from .positions import DeliveredLoaderStates, LoaderPositionUnknown
from .restore_checks import ModuleSnapshot, check_module_fits, check_optimizers_fit

__all__ = ["ResumeCallback", "DEFAULT_SIGNALS"]

DEFAULT_SIGNALS = DEFAULT_PAUSE_SIGNALS
_MODULE = "module"  # the LightningModule's name in the pause entry's module modes


class ResumeCallback(Callback):
    """Pause a Lightning ``fit`` on a signal and resume it bit-identically.

    Add it to the Trainer and pass the pause file to ``fit``::

        resume = ResumeCallback("runs/pause.ckpt", config=cfg)
        trainer = pl.Trainer(callbacks=[resume], ...)
        trainer.fit(model, datamodule=data, ckpt_path=resume.ckpt_path)

    ``resume.ckpt_path`` is the pause file when one exists and ``None`` otherwise,
    so the same script starts fresh or resumes. Exactness needs training loaders
    whose position Lightning can save (``trainer_resume.loaders.ResumableDataLoader``
    with ``resumable=True``; any other loader is refused when ``fit`` starts, see
    ``strict``) and a ``LightningModule`` that draws its randomness from the
    main-process generators (Python ``random``, NumPy's global generator, torch's CPU
    and CUDA default generators), as ``Dropout`` does.

    A pause requested in the middle of a gradient accumulation
    (``accumulate_grad_batches > 1``) is deferred to the batch that completes it, so
    a pause never holds accumulated gradients; under manual optimization, whose
    windows it cannot see, it saves the gradients the module holds and the resumed fit
    puts them back. When ``fit`` completes (not paused),
    the run is marked finished (``trainer_resume.finished``): the pause file is
    retired (unless the fit did not resume from it: an unused pause file is kept),
    :attr:`ckpt_path` is ``None``, :attr:`finished` is true, and a new ``fit`` with
    this callback is refused with ``RunFinishedError`` (340). The folder of ``path``
    is created when ``fit`` starts.

    While ``fit`` runs, the callback owns ``signals``: Lightning's own ``SIGTERM``
    handling (which raises ``SIGTERMException`` at the next batch) is replaced by a
    pause, and ``fit`` returns normally. The previous handlers are restored when
    ``fit`` ends, also when it fails.

    Args:
        path: The pause file (local path). Written atomically: a crash while pausing
            leaves the previous pause file intact.
        signals: Signals that request a pause. ``()`` installs no handler; use
            :meth:`request_pause`.
        config: The run's config (dict, OmegaConf config, dataclass...). Its
            order-sensitive signature is stored in the pause file, and resuming with
            a different config fails with ``ConfigSignatureMismatchError`` before any
            training step. Values from Hydra's ``${hydra:...}`` and ``${now:...}``
            (a run directory) are signed as written, so the same command resumes.
        config_ignore: Dotted paths of ``config`` keys that describe the run rather
            than the training (``"logger"``, ``"paths.output_dir"``), left out of
            the signature with their subtrees. The pause file records them; a resume
            must pass at least those.
        strict: Refuse, when ``fit`` starts, a training loader whose position cannot
            be saved (``UnsupportedResumeConfigurationError``, 332). ``False`` warns
            that the resume will not be exact instead.

    Raises:
        TypeError, ValueError: ``config`` holds values that have no canonical form,
            ``config_ignore`` holds a malformed path or is given without a config.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        config: Any = None,
        config_ignore: Collection[str] = (),
        strict: bool = True,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
        self.path = paths.location(path)
        warn_if_in_launch_directory(self.path, "the pause path")
        if storage_options is not None:
            set_storage_options(self.path, storage_options)
        self.strict = strict
        self.signals = tuple(signal.Signals(number) for number in signals)
        self._config = sign_config(config, ignore=config_ignore) if config is not None else None
        if self._config is not None:
            warn_if_ignoring_nothing(self._config, stacklevel=2)
        if self._config is None and config_ignore:
            raise ValueError("config_ignore names keys of config: pass config=... too")
        # Plain attribute stores only: a signal handler may run between any two bytecodes.
        self._request: str | None = None
        self._paused_at: int | None = None
        self._writing_pause = False
        self._pending_rng: RandomState | None = None
        self._pending_point: PausePoint | None = None
        self._pending_metrics: Any = None
        self._pending_epoch_results: list[Any] | None = None
        # The paused module's modes: set at on_train_start, and again where the
        # uninterrupted fit went on (see _set_modes_again).
        self._pending_modes: Any = None
        self._modes_again: Any = None
        # The paused fit's trainer.accumulate_grad_batches, set with the modes again.
        self._pending_accumulation: int | None = None
        # Manual optimization: the gradients this rank's parameters held at the pause.
        self._pending_gradients: dict[str, Any] | None = None
        # trainer.should_stop set at the pause by another callback (Lightning ignores it
        # until min_epochs/min_steps are met): set again when the resumed fit starts.
        self._pending_stop = False
        self._pause_point: PausePoint | None = None
        self._undo_validation_mark = False
        self._in_resumed_epoch = False
        self._positions = DeliveredLoaderStates()
        self._handler = self._on_signal  # one bound method, so it can be recognised later
        self._previous: dict[signal.Signals, Handler] = {}
        self._owning_signals = False
        self._reader: PauseFileReader | None = None
        self._run_files = RunFiles()
        # Between the checkpoint's checks and the start of training: what was checked,
        # and the module as it was before Lightning restored it (for a late refusal).
        self._checked: dict[str, Any] | None = None
        self._snapshot: ModuleSnapshot | None = None
        # The pause file existed when fit started and the fit did not resume from it:
        # the fit's end keeps it (an exact pause is never deleted unused).
        self._unused_pause = False

    # ------------------------------------------------------------------ public API

    @property
    def ckpt_path(self) -> str | None:
        """The pause file if it exists and the run is not finished, else ``None``.

        Pass it to ``fit(ckpt_path=...)``.
        """
        if self.finished:
            return None
        return self.path if paths.exists(self.path) else None

    @property
    def finished(self) -> bool:
        """Whether the run that pauses to :attr:`path` completed (its finished marker exists).

        A requeued job can exit right away: ``if resume.finished: sys.exit(0)``.
        """
        return run_finished(self.path) is not None

    @property
    def pause_requested(self) -> bool:
        """Whether a pause was requested and not yet written."""
        return self._request is not None

    @property
    def paused(self) -> bool:
        """Whether the last ``fit`` stopped because it was paused."""
        return self._paused_at is not None

    @property
    def paused_at_step(self) -> int | None:
        """The ``trainer.global_step`` stored in the pause file of the last ``fit``, if it paused."""
        return self._paused_at

    def request_pause(self) -> None:
        """Ask for a pause at the next completed training batch (callable from any thread)."""
        self._request = "request_pause()"

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._owning_signals:
            self._request = signal.Signals(signum).name
            return
        # A stale handler (Lightning re-installs what it found at the start of fit when
        # fit fails): behave as the handler it replaced.
        forward_signal(signum, frame, self._previous.get(signal.Signals(signum), signal.SIG_DFL))

    def _install_signals(self) -> None:
        if not self.signals:
            return
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn(
                "ResumeCallback: fit runs outside the main thread, where signal handlers cannot be installed; "
                "only request_pause() can pause this run"
            )
            return
        # Our own (stale) handler from an earlier fit is not a handler to go back to.
        install_handlers(self.signals, self._handler, self._previous)
        self._owning_signals = True

    def _take_over_signals(self) -> None:
        # Lightning installs its SIGTERM handler after the setup hooks; put ours back on
        # top, so a signal always becomes a pause and never a SIGTERMException that
        # would end fit without one.
        if not self._owning_signals:
            return
        for number in self.signals:
            if signal.getsignal(number) != self._handler:
                signal.signal(number, self._handler)

    def _restore_signals(self) -> None:
        if not self._owning_signals:
            return
        self._owning_signals = False
        restore_handlers(self._previous)

    # ------------------------------------------------------------------ checkpoint IO

    def read_from(
        self,
        path: str | os.PathLike[str],
        *,
        key: bytes | None,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        """Have the next ``fit`` read ``path`` durably (a resume point of this run).

        Args:
            path: The file ``fit(ckpt_path=...)`` names.
            key: Its signing key.
            checkpoint: Its contents, when already read and verified: handed to
                Lightning instead of a second read.
        """
        self._run_files.add(path, key=key, checkpoint=checkpoint)

    def _install_reader(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        io = trainer.strategy.checkpoint_io
        # The trainer's own DurableCheckpointIO carries the user's signing key, if any.
        self._run_files.add(self.path, key=self._writer(trainer).key)

        def check(checkpoint: dict[str, Any], source: str) -> None:
            self._check_before_restore(trainer, pl_module, checkpoint, source)

        # Also around a DurableCheckpointIO: its files are checked before restoring too.
        self._reader = PauseFileReader(io, self._run_files, check)
        trainer.strategy.checkpoint_io = self._reader

    def _remove_reader(self, trainer: pl.Trainer) -> None:
        reader, self._reader = self._reader, None
        self._run_files.clear()
        self._checked = None
        if reader is not None and trainer.strategy.checkpoint_io is reader:
            trainer.strategy.checkpoint_io = reader.inner

    def _writer(self, trainer: pl.Trainer) -> DurableCheckpointIO:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, PauseFileReader):
            io = io.inner
        return io if isinstance(io, DurableCheckpointIO) else DurableCheckpointIO()

    def _check_before_restore(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        checkpoint: dict[str, Any],
        source: str,
    ) -> None:
        # Runs in the checkpoint IO, before Lightning changes anything (see restore_checks).
        if trainer.state.fn != "fit":
            return
        entry = checkpoint.get(PAUSE_KEY)
        if entry is not None:
            self._pause_entry(entry, trainer, source)
            check_object_modes(entry, {_MODULE: pl_module}, source)
            _accumulation(entry, trainer, source)
        check_module_fits(checkpoint, pl_module, source)
        if trainer.strategy.lightning_restore_optimizer:
            check_optimizers_fit(checkpoint, pl_module, trainer.optimizers, source)
        # Pause files hold canonical names: Lightning loads them under the live ones.
        checkpoint["state_dict"] = live_state(checkpoint["state_dict"], pl_module)
        self._checked = checkpoint
        self._snapshot = ModuleSnapshot(pl_module)

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Install the signal handlers and the pause-file reader for ``fit``."""
        if stage != "fit":
            return
        _refuse_epoch_start_callbacks(trainer)
        refuse_if_finished(self.path)
        # The finished marker (and a pause) go beside the pause file: its folder exists
        # from now on, or fit is refused here with the reason.
        paths.make_parent_directory(self.path)
        self._unused_pause = paths.exists(self.path)  # until the fit resumes from it
        self._request = None
        self._paused_at = None
        self._pending_rng = None
        self._pending_point = None
        self._pending_metrics = None
        self._pending_epoch_results = None
        self._pending_modes = None
        self._modes_again = None
        self._pending_accumulation = None
        self._pending_gradients = None
        self._pending_stop = False
        self._pause_point = None
        self._undo_validation_mark = False
        self._in_resumed_epoch = False
        self._positions = DeliveredLoaderStates()
        self._checked = None
        self._snapshot = None
        self._install_reader(trainer, pl_module)
        self._install_signals()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Restore the previous signal handlers and checkpoint IO."""
        if stage != "fit":
            return
        self._restore_signals()
        self._remove_reader(trainer)
        restore_fit_loop(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Restore the previous signal handlers and checkpoint IO (``teardown`` is not called on errors).

        A failure between the module's restore and the first training batch puts the
        module back as it was before the restore.
        """
        self._restore_signals()
        self._remove_reader(trainer)
        restore_fit_loop(trainer)
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            snapshot.restore(pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check the saved optimizer states against the optimizers, now that they exist.

        Lightning loads them after this hook; a refusal puts the module back as it was.
        """
        checkpoint = self._checked
        if checkpoint is None or self._snapshot is None:
            return
        if not trainer.strategy.lightning_restore_optimizer:
            return
        source = trainer.ckpt_path or "the checkpoint"
        try:
            check_optimizers_fit(checkpoint, pl_module, trainer.optimizers, os.fspath(source))
        except ResumeError:
            snapshot, self._snapshot = self._snapshot, None
            snapshot.restore(pl_module)
            raise

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take the signals back from Lightning's handler."""
        self._take_over_signals()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check loaders and hyper-parameters; restore the paused run's RNG and metrics."""
        self._take_over_signals()
        self._checked = None
        self._snapshot = None  # the restore is complete
        combined_loader = trainer.fit_loop._combined_loader
        if combined_loader is not None:
            check_train_loaders(combined_loader.flattened, strict=self.strict)
            check_combined_mode(
                combined_loader._mode,
                combined_loader.flattened,
                strict=self.strict,
                epoch_batches=trainer.num_training_batches,
            )
        # What would make the pause file unloadable is refused now, not after a preemption.
        check_loadable(
            plain_hyperparameters(hyperparameter_entries(pl_module, trainer.datamodule)),
            where=f"{self.path} (hyper-parameters)",
        )
        self._positions.on_train_start(trainer)
        if self._pending_rng is not None:
            # Here, not in on_load_checkpoint: creating the train iterator (which a
            # resumed fit does afresh, before this hook) can draw from the
            # generators, and the validation left pending by the pause runs next.
            state, self._pending_rng = self._pending_rng, None
            restore_random_state(state, _cuda_device(pl_module))
        modes, self._pending_modes = self._pending_modes, None
        if modes is not None:
            # After setup(), configure_model() and on_fit_start(), which ran again.
            restore_object_modes(modes, {_MODULE: pl_module})
            self._modes_again = modes
        gradients, self._pending_gradients = self._pending_gradients, None
        if gradients is not None:
            restore_gradients(
                pl_module, gradients, os.fspath(trainer.ckpt_path or "the checkpoint")
            )
        metrics, self._pending_metrics = self._pending_metrics, None
        if metrics is not None:
            restore_logged_metrics(trainer, metrics, pl_module.device)
        if self._pending_stop:
            self._pending_stop = False
            trainer.should_stop = True  # as in the uninterrupted fit, until its minimums
        point, self._pending_point = self._pending_point, None
        epoch_results, self._pending_epoch_results = self._pending_epoch_results, None
        if epoch_results:
            # Before the resumed fit trains on or ends the interrupted epoch.
            mid_epoch = point is not None and not point.epoch_end
            restore_epoch_results(trainer, epoch_results, pl_module.device, mid_epoch=mid_epoch)
        if point is not None:
            self._undo_validation_mark = point.validation
            self._in_resumed_epoch = True
            if point.epoch_end and combined_loader is not None:
                end_loader_epochs(combined_loader.flattened)
            if point.epoch_end and not point.validation:
                end_epoch_on_resume(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """End Lightning's restart with the epoch the pause interrupted."""
        self._set_modes_again(trainer, pl_module)
        if self._in_resumed_epoch:
            self._in_resumed_epoch = False
            end_restart(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The validation left pending by the pause: it gives back the modes it found, now
        the paused ones (its hooks may change them, as in the uninterrupted fit)."""
        if trainer.sanity_checking or self._modes_again is None:
            return
        modes, self._modes_again = self._modes_again, None
        module_mode = trainer.fit_loop.epoch_loop.val_loop._module_mode
        evaluating = {name: module.training for name, module in pl_module.named_modules()}
        restore_object_modes(modes, {_MODULE: pl_module})  # frozen, untracked: kept as set
        for name, module in pl_module.named_modules():  # Lightning's capture, as paused
            module_mode.mode[name] = module.training
            module.training = evaluating[name]  # the validation's own eval mode meanwhile
        self._set_accumulation(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After the validation left pending by the pause: put its counters back in step.

        After every validation: the workers its loaders keep with ``persistent_workers``
        stop, so each validation starts them, resumed or not (see ``adapters._kept_workers``).
        """
        if self._undo_validation_mark and not trainer.sanity_checking:
            self._undo_validation_mark = False
            undo_pending_validation_mark(trainer)
        combined_loader = getattr(trainer.fit_loop.epoch_loop.val_loop, "_combined_loader", None)
        if combined_loader is not None:
            stop_kept_workers(combined_loader.flattened)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Mark the run finished when ``fit`` completed without a pause."""
        if self._paused_at is not None or trainer.interrupted:
            return
        key = self._writer(trainer).key
        retire = not self._unused_pause
        self._on_rank_zero(
            trainer,
            lambda: mark_finished(
                self.path, completed_steps=int(trainer.global_step), key=key, retire=retire
            ),
            f"{self.path}: the finished marker could not be written",
        )

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Check the config and keep the RNG state for the first training batch."""
        if trainer.state.fn != "fit":
            return
        source = trainer.ckpt_path or "the checkpoint"
        if self._unused_pause and _same_file(trainer.ckpt_path, self.path):
            self._unused_pause = False
        kept = (
            f"; the exact pause file {self.path} exists: fit(ckpt_path=resume.ckpt_path) resumes "
            "it bit-identically (it is kept, not deleted, when this fit ends)"
            if self._unused_pause
            else ""
        )
        entry = checkpoint.get(PAUSE_KEY)
        if entry is None:
            rank_zero_warn(
                f"ResumeCallback: {source} is not a pause file (no {PAUSE_KEY!r} entry): training continues, "
                "but the main-process RNG is not restored, so the result is not bit-identical to an "
                f"uninterrupted run{kept}"
            )
            return
        if kept:
            rank_zero_warn(
                f"ResumeCallback: fit resumes from {source}, not from this callback's path{kept}"
            )
        # Checked already before the restore when read through this callback's IO.
        self._pending_rng = self._pause_entry(entry, trainer, source)
        check_object_modes(entry, {_MODULE: pl_module}, source)
        self._pending_modes = entry.get(MODES_KEY)  # absent in earlier releases' files
        if self._pending_modes is None:
            rank_zero_warn(
                f"ResumeCallback: {source} was written by an earlier release: it holds neither "
                "the module's modes (submodules in eval mode, frozen parameters) nor the "
                "gradient accumulation, so the fit goes on with those this process set up, "
                "which is exact only where they are the ones the paused fit had"
            )
        self._pending_accumulation = _accumulation(entry, trainer, source)
        self._pending_stop = entry.get("stop_requested") is True
        gradients = entry.get("gradients")
        if gradients is not None:
            self._pending_gradients = gradients[trainer.global_rank]
        self._pending_point = PausePoint(
            validation=bool(entry.get("pending_validation", False)),
            epoch_end=bool(entry.get("pending_epoch_end", False)),
        )
        self._pending_metrics = entry.get("metrics")
        epoch_results = entry.get("epoch_results")  # absent in earlier releases' files
        if isinstance(epoch_results, list) and len(epoch_results) == trainer.world_size:
            self._pending_epoch_results = epoch_results[trainer.global_rank]
        partial = entry.get("epoch_metrics_in_progress")
        if partial and epoch_results is None:
            rank_zero_warn(
                f"ResumeCallback: {source} was written by an earlier release, which did not carry "
                f"the epoch-level accumulation of {sorted(partial)}: their values for the "
                "interrupted epoch cover only the batches trained after the resume (none, if it "
                "paused at the epoch's last batch)"
            )
        elif partial:
            rank_zero_warn(
                f"ResumeCallback: the epoch-level values of {sorted(partial)} for the interrupted epoch "
                "cover only the batches trained after the resume (the pause could not carry their "
                "accumulation: a torchmetrics metric whose states the module does not save, or "
                "any torchmetrics metric under several processes, or a value logged with "
                "sync_dist_group or Python's own sum/max/min as reduce_fx); make the metric's "
                "states persistent (metric.persistent(True)) in one process, or log a tensor "
                "with torch's reductions, for exact values"
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Refuse a step after a pause; follow the loaders' delivered position."""
        if self._paused_at is not None:
            raise TrainingPausedError(
                f"the trainer went on after the pause at step {self._paused_at} (something kept "
                f"fit going after trainer.should_stop); resume from {self.path}"
            )
        # The pending validation ran before this batch, or had no batch to run.
        self._undo_validation_mark = False
        self._set_modes_again(trainer, pl_module)
        self._positions.on_train_batch_start(trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Pause after this batch when any rank asked for a pause.

        The pause file is written once the batch's other ``on_train_batch_end`` hooks
        (the callbacks after this one, ``ModelCheckpoint``'s save, the module's) have run
        (see ``pause_point.at_batch_end``).
        """
        # Every rank takes part in the reduction each batch, so all pause at the same step.
        if not _any_rank(trainer, self._request is not None):
            return
        if trainer.fit_loop.epoch_loop._should_accumulate():
            # Mid-accumulation: the gradients of this batch wait for the next ones. Pausing
            # at the batch that completes the accumulation keeps gradients out of the pause.
            return
        at_batch_end(trainer, lambda point: self._pause_after_batch(trainer, point))

    def _pause_after_batch(self, trainer: pl.Trainer, point: PausePoint) -> None:
        if fit_ends_after_batch(trainer):
            # The fit ends here as the uninterrupted one does (max_steps, or a callback
            # stopped it), its validation due first; the run is then marked finished.
            self._request = None
            return
        # Before should_stop is set: Lightning validates whenever should_stop is set.
        self._pause_point = point
        self._write_pause(trainer, point)
        self._request = None
        self._paused_at = trainer.global_step
        trainer.should_stop = True
        stop_after_batch(trainer, point)
        skip_last_save_at_train_end(trainer)
        rank_zero_info(
            f"ResumeCallback: paused at step {trainer.global_step}; pause file {self.path}"
        )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Save the loaders' delivered positions; add RNG and config to a pause file."""
        self._save_delivered_positions(trainer, checkpoint)
        if self._writing_pause:
            point = self._pause_point or PausePoint(validation=False, epoch_end=False)
            entry: LightningPauseState = {
                "format": LIGHTNING_PAUSE_FORMAT,
                "global_step": int(trainer.global_step),
                "world_size": int(trainer.world_size),
                "config_signature": self._config.signature if self._config is not None else None,
                "config": self._config.canonical if self._config is not None else None,
                "config_ignore": list(self._config.ignore) if self._config is not None else [],
                "rng": _gather_by_rank(trainer, random_state(_cuda_device(pl_module))),
                "pending_validation": point.validation,
                "pending_epoch_end": point.epoch_end,
                "metrics": _gather_by_rank(trainer, logged_metrics_state(trainer)),
                "epoch_metrics_in_progress": epoch_metrics_in_progress(trainer),
                "epoch_results": _gather_by_rank(trainer, epoch_results_state(trainer)),
                # What the module's state_dict() leaves out (eval mode, frozen parameters).
                "module_modes": object_modes({_MODULE: pl_module}),
                # Set by a GradientAccumulationScheduler when the epoch started.
                "accumulate_grad_batches": int(trainer.accumulate_grad_batches),
            }
            if trainer.should_stop:  # set by another callback; the pause's comes after
                entry["stop_requested"] = True
            if not pl_module.automatic_optimization:
                # A window the loop accumulates by hand may be in progress: no pause can
                # wait for its end, so its gradients are saved (those of a step taken too).
                entry["gradients"] = _gather_by_rank(trainer, held_gradients(pl_module))
            checkpoint[PAUSE_KEY] = entry

    # ------------------------------------------------------------------ helpers

    def _set_modes_again(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """At the first training batch or epoch end of the resumed fit (this callback's
        hook runs before the module's), unless a pending validation came first (see
        :meth:`on_validation_start`): the paused modes again, and the paused fit's
        ``accumulate_grad_batches``. Between the pause and here the uninterrupted fit ran
        nothing; the resumed fit also ran the ``on_train_start`` hooks after this
        callback's, which may set modes the training changed since, and skipped
        (mid-epoch) the ``on_train_epoch_start`` in which a
        ``GradientAccumulationScheduler`` sets the epoch's accumulation."""
        modes, self._modes_again = self._modes_again, None
        if modes is not None:
            restore_object_modes(modes, {_MODULE: pl_module})
        self._set_accumulation(trainer)

    def _set_accumulation(self, trainer: pl.Trainer) -> None:
        """The paused fit's ``accumulate_grad_batches``, once, where the modes are set again."""
        accumulation, self._pending_accumulation = self._pending_accumulation, None
        if accumulation is not None:
            trainer.accumulate_grad_batches = accumulation

    def _save_delivered_positions(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
        # Where the fit loop keeps the stateful loaders' states (see _FitLoop.on_save_checkpoint).
        fit_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        if "combined_loader" not in fit_state:
            return
        try:
            states = self._positions.delivered(trainer)
        except LoaderPositionUnknown as exc:
            if self._writing_pause:
                raise UnsupportedResumeConfigurationError(str(exc)) from exc
            rank_zero_warn(
                f"ResumeCallback: this checkpoint's loader position may be ahead of training: {exc}"
            )
            return
        if states is not None:
            fit_state["combined_loader"] = states

    def pause_checkpoint(self, trainer: pl.Trainer, point: PausePoint) -> dict[str, Any]:
        """The checkpoint a pause writes after the current batch (every rank calls it).

        Call it where ``pause_point.at_batch_end`` runs its actions, before
        ``should_stop`` is set, at a batch that completes its gradient accumulation.
        Resume points (``ResumePointsCallback``) write the same content while the fit
        goes on.
        """
        saved, self._pause_point = self._pause_point, point
        self._writing_pause = True
        try:
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            self._writing_pause = False
            self._pause_point = saved
        finish_batch_in_checkpoint(checkpoint, point)
        # Under the unwrapped modules' names: a compiled or wrapped submodule resumes
        # into the module compiled or not (see trainer_resume._module_names).
        checkpoint["state_dict"] = canonical_state(
            trainer.lightning_module, checkpoint["state_dict"]
        )
        return checkpoint

    def _write_pause(self, trainer: pl.Trainer, point: PausePoint) -> None:
        # Not trainer.save_checkpoint: the pause file must be durable whatever IO the
        # trainer uses, and a failed write must be known to every rank, not leave
        # the others waiting in a barrier.
        checkpoint = self.pause_checkpoint(trainer, point)
        writer = self._writer(trainer)
        self._on_rank_zero(
            trainer,
            lambda: writer.save_checkpoint(checkpoint, self.path),
            f"{self.path}: the pause file could not be written",
        )

    def _on_rank_zero(self, trainer: pl.Trainer, action: Callable[[], Any], failure: str) -> None:
        # Rank 0 acts; every rank learns whether it succeeded, so a failure is raised
        # everywhere instead of leaving the other ranks waiting in a collective.
        error: BaseException | None = None
        if trainer.is_global_zero:
            try:
                action()
            except (ResumeError, OSError) as exc:
                error = exc
        if not trainer.strategy.reduce_boolean_decision(error is None, all=True):
            if isinstance(error, ResumeError):
                raise error
            raise CheckpointWriteError(failure) from error

    def _pause_entry(self, entry: Any, trainer: pl.Trainer, source: str) -> RandomState:
        """Check a pause entry's format, config and RNG; return this rank's RNG state."""
        if not isinstance(entry, Mapping) or entry.get("format") != LIGHTNING_PAUSE_FORMAT:
            found = entry.get("format") if isinstance(entry, Mapping) else type(entry).__name__
            raise CheckpointFormatError(
                f"{source}: {PAUSE_KEY!r} entry has format {found!r}, expected {LIGHTNING_PAUSE_FORMAT!r}"
            )
        self._check_config(entry, source)
        return self._rng_of_this_rank(entry, trainer, source)

    def _check_config(self, entry: Mapping[str, Any], source: str) -> None:
        saved = entry.get("config_signature")
        if saved is None and self._config is None:
            return
        if saved is None:
            detail = "the paused run had no config, this run has one"
        elif self._config is None:
            detail = (
                "the paused run had a config; pass the same config to ResumeCallback(config=...)"
            )
        else:
            check_config(entry, self._config, source)
            return
        raise ConfigSignatureMismatchError(f"{source}: {detail}")

    def _rng_of_this_rank(
        self, entry: Mapping[str, Any], trainer: pl.Trainer, source: str
    ) -> RandomState:
        states = entry.get("rng")
        saved_world = entry.get("world_size")
        if saved_world != trainer.world_size:
            raise ResumeStateMismatchError(
                f"{source} was paused with {saved_world} process(es), this run has {trainer.world_size}"
            )
        if not isinstance(states, list) or len(states) != trainer.world_size:
            raise CheckpointFormatError(f"{source}: 'rng' must hold one random state per rank")
        state = states[trainer.global_rank]
        # Validate now, before any training step, without changing the generators. The
        # module may not be on its device yet, so check against the CUDA device the
        # state came from.
        saved_cuda = state.get("cuda_device") if isinstance(state, Mapping) else None
        cuda = isinstance(saved_cuda, int) and torch.cuda.is_available()
        device = torch.device("cuda", saved_cuda) if cuda else None
        try:
            validate_random_state(state, device)
        except ValueError as exc:
            raise CheckpointFormatError(f"{source}: {exc}") from exc
        return state


def _refuse_epoch_start_callbacks(trainer: pl.Trainer) -> None:
    """Refuse Lightning's ``StochasticWeightAveraging``: it sets up its averaging, its
    learning-rate schedule and the last epoch's BatchNorm update in
    ``on_train_epoch_start``, which Lightning skips when it restarts mid-epoch (the resumed
    fit went on with another learning rate, or failed at its end)."""
    for callback in trainer.callbacks:
        if isinstance(callback, StochasticWeightAveraging):
            raise UnsupportedResumeConfigurationError(
                f"{type(callback).__name__} cannot be resumed exactly after a pause in the "
                "middle of an epoch: it sets up its averaging, its learning-rate schedule "
                "and its BatchNorm update in on_train_epoch_start, which Lightning skips when "
                "it restarts mid-epoch; average in the LightningModule instead "
                "(torch.optim.swa_utils.AveragedModel as a submodule, updated in "
                "on_train_batch_end, and SWALR among configure_optimizers' schedulers), "
                "whose state the pause holds"
            )


def _accumulation(entry: Mapping[str, Any], trainer: pl.Trainer, source: str) -> int | None:
    """The paused fit's ``accumulate_grad_batches`` (``None`` in earlier releases' files).

    Raises:
        CheckpointFormatError: it is not an int >= 1 (321).
        ResumeStateMismatchError: this Trainer accumulates over another number of batches
            and no ``GradientAccumulationScheduler`` sets it per epoch (330).
    """
    saved = entry.get("accumulate_grad_batches")
    if saved is None:
        return None
    if type(saved) is not int or saved < 1:
        raise CheckpointFormatError(
            f"{source}: {PAUSE_KEY!r} entry's 'accumulate_grad_batches' must be an int >= 1"
        )
    live = trainer.accumulate_grad_batches
    scheduled = any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks)
    if saved != live and not scheduled:
        raise ResumeStateMismatchError(
            f"{source}: the paused fit accumulated gradients over {saved} batch(es) "
            f"(Trainer(accumulate_grad_batches={saved})), this Trainer over {live}; build "
            f"the Trainer with accumulate_grad_batches={saved}"
        )
    return saved


def _same_file(path: Any, other: str) -> bool:
    if path is None:
        return False
    if paths.is_url(str(path)) or paths.is_url(other):
        return paths.same_location(str(path), other)
    try:
        return os.path.samefile(os.fspath(path), other)
    except (OSError, TypeError):  # a URL, a missing file: compared by name
        return os.path.abspath(str(path)) == os.path.abspath(other)


def _cuda_device(pl_module: pl.LightningModule) -> torch.device | None:
    device = pl_module.device
    return device if device.type == "cuda" else None


def _any_rank(trainer: pl.Trainer, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank, agreed at every batch end.

    Where torch.distributed runs the strategy's processes, through the library's
    agreement, which lets go of its collective on this thread (see
    ``distributed.any_ranks``): the next epoch's loader may fork its workers right
    after this last collective of an epoch. Elsewhere, the strategy's own reduction.
    """
    if trainer.world_size == 1:
        return flag
    if distributed.world()[0] == trainer.world_size:
        return distributed.any_rank(flag)
    return trainer.strategy.reduce_boolean_decision(flag, all=False)


def _gather_by_rank(trainer: pl.Trainer, value: Any) -> list[Any]:
    if trainer.world_size == 1:
        return [value]
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise UnsupportedResumeConfigurationError(
            f"{trainer.world_size} processes without an initialized torch.distributed process group"
        )
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
