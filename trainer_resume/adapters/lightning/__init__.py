"""PyTorch Lightning integration (install the ``lightning`` extra).

- :class:`ResumeCallback`: pause a ``Trainer.fit`` on a signal and resume it
  bit-identically with ``fit(ckpt_path=...)``.
- :class:`DurableCheckpointIO`: a ``CheckpointIO`` plugin that writes every
  checkpoint durably and loads it verified and weights-only.
- :func:`load_from_checkpoint` and :func:`plain_lightning_checkpoint`: read those
  files as Lightning's ``load_from_checkpoint`` and a plain checkpoint dict.

Requires ``pytorch_lightning`` 2.5.3 or later (tested with 2.5.3 to 2.6.6, :data:`RELEASES`),
the first release with Lightning's own fixes to resumed loop counters (2.5.0) and to the
double iteration on resume (2.5.3). The adapter reads Lightning's loop internals, every
one named in :data:`INTERNALS` and checked when it is imported: a release without one of
them (or with another shape of it) is refused with ``FrameworkReleaseError`` (352) naming
it; a newer release than the tested ones warns once (``UntestedReleaseWarning``) and
works. This is the ``pytorch_lightning`` package; the unified ``lightning`` package has
its own class hierarchy and is not supported.
"""

from __future__ import annotations

from .._release import LIGHTNING, Attribute, Function, Name, Refers, check_release

RELEASES = LIGHTNING
_TRAINER = "pytorch_lightning:Trainer"
_CALLBACK = "pytorch_lightning.callbacks:Callback"
_FIT = "pytorch_lightning.loops.fit_loop:_FitLoop"
_EPOCH = "pytorch_lightning.loops.training_epoch_loop:_TrainingEpochLoop"
_EVALUATION = "pytorch_lightning.loops.evaluation_loop:_EvaluationLoop"
_PROGRESS = "pytorch_lightning.loops.progress"
_COMBINED = "pytorch_lightning.utilities.combined_loader:CombinedLoader"
_CONNECTOR = "pytorch_lightning.trainer.connectors.checkpoint_connector:_CheckpointConnector"
_LOGGER = "pytorch_lightning.trainer.connectors.logger_connector.logger_connector:_LoggerConnector"
_RESULT = "pytorch_lightning.trainer.connectors.logger_connector.result"
_IO = "lightning_fabric.plugins.io.checkpoint_io:CheckpointIO"

# Everything of Lightning the adapter's modules read, call, override or rely on Lightning doing.
INTERNALS = (
    # callback.py and points.py: the callback hooks overridden, with the arguments Lightning passes.
    Function(f"{_CALLBACK}.setup", positional=3),
    Function(f"{_CALLBACK}.teardown", positional=3),
    Function(f"{_CALLBACK}.on_exception", positional=3),
    Function(f"{_CALLBACK}.on_fit_start", positional=2),
    Function(f"{_CALLBACK}.on_fit_end", positional=2),
    Function(f"{_CALLBACK}.on_sanity_check_start", positional=2),
    Function(f"{_CALLBACK}.on_train_start", positional=2),
    Function(f"{_CALLBACK}.on_train_epoch_end", positional=2),
    Function(f"{_CALLBACK}.on_validation_start", positional=2),
    Function(f"{_CALLBACK}.on_validation_end", positional=2),
    Function(f"{_CALLBACK}.on_load_checkpoint", positional=3),
    Function(f"{_CALLBACK}.on_save_checkpoint", positional=3),
    Function(f"{_CALLBACK}.on_train_batch_start", positional=4),
    Function(f"{_CALLBACK}.on_train_batch_end", positional=5),
    Function("pytorch_lightning.utilities.rank_zero:rank_zero_info", positional=1),
    Function("pytorch_lightning.utilities.rank_zero:rank_zero_warn", positional=1),
    # callback.py: the trainer and strategy read, the pause checkpoint made.
    Attribute(f"{_TRAINER}.fit_loop"),
    Attribute(f"{_TRAINER}.strategy"),
    Attribute(f"{_TRAINER}.state"),
    Attribute("pytorch_lightning.trainer.states:TrainerState.fn"),
    Attribute(f"{_TRAINER}.global_step"),
    Attribute(f"{_TRAINER}.num_training_batches"),
    Attribute(f"{_TRAINER}.world_size"),
    Attribute(f"{_TRAINER}.global_rank"),
    Attribute(f"{_TRAINER}.is_global_zero"),
    Attribute(f"{_TRAINER}.should_stop", settable=True),
    Attribute(f"{_TRAINER}.ckpt_path"),
    Attribute(
        f"{_TRAINER}.datamodule", set_by="pytorch_lightning.trainer.connectors.data_connector"
    ),
    Attribute(f"{_TRAINER}.optimizers"),
    Attribute(f"{_TRAINER}.interrupted"),
    Attribute(f"{_TRAINER}.sanity_checking"),
    Attribute("pytorch_lightning.strategies:Strategy.checkpoint_io", settable=True),
    Attribute("pytorch_lightning.strategies:Strategy.lightning_restore_optimizer"),
    Function(
        "pytorch_lightning.strategies:Strategy.reduce_boolean_decision",
        positional=1,
        keywords=("all",),
    ),
    Attribute("pytorch_lightning:LightningModule.device"),
    Attribute(f"{_TRAINER}._checkpoint_connector"),
    Function(f"{_CONNECTOR}.dump_checkpoint", keywords=("weights_only",)),
    Refers(f"{_CONNECTOR}.dump_checkpoint", "loops"),
    Refers(f"{_CONNECTOR}._get_loops_state_dict", "fit_loop"),
    # positions.py: the delivered loader positions, despite the fetcher's prefetch.
    Attribute(f"{_FIT}._data_fetcher"),
    Attribute(f"{_FIT}._combined_loader"),
    Attribute(f"{_COMBINED}.flattened"),
    Attribute(f"{_COMBINED}._mode"),  # "max_size" over loaders of different lengths is refused
    Attribute(f"{_COMBINED}._iterator"),
    Refers(f"{_COMBINED}._state_dicts", "flattened", "state_dict"),
    Refers(f"{_FIT}.on_save_checkpoint", "combined_loader", "_state_dicts"),
    Attribute("pytorch_lightning.loops.fetchers:_PrefetchDataFetcher.batches"),
    # pause_point.py: where a pause lands in the fit loop, and the loops' checkpoint entries.
    Attribute(f"{_FIT}.epoch_loop"),
    Function(f"{_EPOCH}._should_check_val_fx", positional=1),
    Function(f"{_EPOCH}._num_ready_batches_reached", positional=0),
    Function(f"{_EPOCH}._should_accumulate", positional=0),
    Attribute(f"{_EPOCH}._skip_next_val", settable=True),
    Attribute(f"{_FIT}._can_stop_early"),  # no pause where fit ends after the batch anyway
    # stop_after_batch: the paused process stops before min_epochs / min_steps are met.
    Attribute(f"{_FIT}.min_epochs", settable=True),
    Attribute(f"{_EPOCH}.min_steps", settable=True),
    Function(f"{_FIT}.on_advance_end", positional=0),
    Refers(f"{_FIT}.run", "on_advance_end"),
    # at_batch_end: a pause is written in the epoch loop's on_advance_end, after the batch's
    # on_train_batch_end hooks, before its validation and plateau schedulers.
    Function(f"{_EPOCH}.on_advance_end", positional=1),
    Refers(f"{_EPOCH}.run", "on_advance_end"),
    Refers(f"{_EPOCH}.advance", "on_train_batch_end", "increment_completed"),
    Refers(f"{_EPOCH}.on_advance_end", "val_loop", "update_lr_schedulers", "_batches_that_stepped"),
    Attribute(f"{_EPOCH}.val_loop"),
    Attribute(f"{_EVALUATION}._combined_loader"),  # its loaders' kept workers stopped
    Attribute(f"{_EVALUATION}._has_run", settable=True),
    # callback.py: the modes a pending validation gives back (Lightning's capture).
    Attribute(f"{_EVALUATION}._module_mode"),
    Attribute("pytorch_lightning.utilities.model_helpers:_ModuleMode.mode"),
    Attribute(f"{_EPOCH}.restarting", settable=True),
    Attribute(f"{_FIT}._restarting", settable=True),
    Attribute(f"{_EPOCH}.batch_progress"),
    Attribute("pytorch_lightning.loops.progress:_BatchProgress.is_last_batch"),
    Attribute(f"{_EVALUATION}.batch_progress"),
    Attribute(f"{_PROGRESS}:_BatchProgress.total"),
    Attribute(f"{_PROGRESS}:_BatchProgress.current"),
    Attribute(f"{_PROGRESS}:_ProcessedTracker.ready", settable=True),
    Attribute(f"{_PROGRESS}:_ProcessedTracker.started", settable=True),
    Attribute(f"{_PROGRESS}:_ProcessedTracker.processed"),
    Attribute(f"{_PROGRESS}:_ProcessedTracker.completed"),
    Refers("pytorch_lightning.loops.loop:_Loop.state_dict", "state_dict"),
    Refers(f"{_EPOCH}.on_save_checkpoint", "_batches_that_stepped"),
    # metrics.py: the last logged metrics, and the epoch metrics in progress.
    Attribute(f"{_TRAINER}.callback_metrics"),
    Attribute(f"{_TRAINER}.logged_metrics"),
    Attribute(f"{_TRAINER}.progress_bar_metrics"),
    Attribute(f"{_TRAINER}._logger_connector"),
    Attribute(f"{_LOGGER}._callback_metrics", settable=True),
    Attribute(f"{_LOGGER}._logged_metrics", settable=True),
    Attribute(f"{_LOGGER}._progress_bar_metrics", settable=True),
    Refers(f"{_LOGGER}.callback_metrics", "_callback_metrics"),
    Refers(f"{_LOGGER}.logged_metrics", "_logged_metrics"),
    Refers(f"{_LOGGER}.progress_bar_metrics", "_progress_bar_metrics"),
    Attribute(f"{_EPOCH}._results"),
    Attribute(f"{_RESULT}:_ResultMetric.meta"),
    Attribute(f"{_RESULT}:_ResultMetric._update_count", settable=True),
    Attribute(f"{_RESULT}:_ResultMetric.is_tensor"),
    Attribute(f"{_RESULT}:_ResultMetric.value", settable=True),
    Attribute(f"{_RESULT}:_ResultMetric.cumulated_batch_size", settable=True),
    Attribute(f"{_RESULT}:_ResultMetric.has_reset"),
    Attribute(f"{_RESULT}:_ResultMetric._computed", settable=True),
    Attribute(f"{_RESULT}:_ResultMetric._forward_cache", settable=True),
    Attribute(f"{_RESULT}:_Metadata.on_epoch"),
    Attribute(f"{_RESULT}:_Metadata.name"),
    # The arguments of the self.log call that registers a carried accumulation again.
    Attribute(f"{_RESULT}:_Metadata.fx"),
    Attribute(f"{_RESULT}:_Metadata.prog_bar"),
    Attribute(f"{_RESULT}:_Metadata.logger"),
    Attribute(f"{_RESULT}:_Metadata.on_step"),
    Attribute(f"{_RESULT}:_Metadata.reduce_fx"),
    Attribute(f"{_RESULT}:_Metadata.enable_graph"),
    Attribute(f"{_RESULT}:_Metadata.add_dataloader_idx"),
    Attribute(f"{_RESULT}:_Metadata.dataloader_idx"),
    Attribute(f"{_RESULT}:_Metadata.metric_attribute"),
    Attribute(f"{_RESULT}:_Metadata.is_mean_reduction"),
    Attribute(f"{_RESULT}:_Metadata.sync"),
    Attribute(f"{_RESULT}:_Sync.should"),
    Attribute(f"{_RESULT}:_Sync.group"),
    Attribute(f"{_RESULT}:_Sync.rank_zero_only"),
    Function(
        f"{_RESULT}:_ResultCollection.log",
        positional=3,
        keywords=(
            "prog_bar",
            "logger",
            "on_step",
            "on_epoch",
            "reduce_fx",
            "enable_graph",
            "sync_dist",
            "sync_dist_fn",
            "add_dataloader_idx",
            "batch_size",
            "metric_attribute",
            "rank_zero_only",
        ),
    ),
    # Lightning resets a hook's logged tensors at its first call in an epoch's first batch.
    Attribute(f"{_LOGGER}._first_loop_iter", settable=True),
    Refers(f"{_LOGGER}.should_reset_tensors", "_first_loop_iter"),
    # io.py: the checkpoint IO plugin, as Lightning calls it.
    Name(_IO),
    Function(f"{_IO}.save_checkpoint", positional=2, keywords=("storage_options",)),
    # weights_only is handed on only when Lightning passed it (2.6 and later).
    Function(f"{_IO}.load_checkpoint", positional=1, keywords=("map_location",)),
    Function(f"{_IO}.remove_checkpoint", positional=1),
    Function(f"{_IO}.teardown", positional=0),
    Function("lightning_fabric.utilities.cloud_io:get_filesystem", positional=1),
    # loading.py: the steps of Lightning's load_from_checkpoint after its torch.load.
    Refers(
        "pytorch_lightning.core.saving:_load_from_checkpoint",
        "_pl_migrate_checkpoint",
        "_load_state",
    ),
    Name("pytorch_lightning.core.saving:_default_map_location"),
    Function("pytorch_lightning.core.saving:_load_state", positional=2, keywords=("strict",)),
    Function(
        "pytorch_lightning.utilities.migration.utils:_pl_migrate_checkpoint",
        positional=1,
        keywords=("checkpoint_path",),
    ),
    Attribute("pytorch_lightning:LightningModule.CHECKPOINT_HYPER_PARAMS_KEY"),
    # restore_checks.py
    Attribute("pytorch_lightning:LightningModule.strict_loading"),
)

check_release(LIGHTNING, adapter="lightning", extra="lightning", internals=INTERNALS)

from ...checkpoint_files.lightning import plain_lightning_checkpoint  # noqa: E402
from .callback import ResumeCallback  # noqa: E402
from .io import DurableCheckpointIO  # noqa: E402
from .loading import load_from_checkpoint  # noqa: E402
from .points import ResumePointsCallback  # noqa: E402

# The names docs/lightning.md documents; the constants stay in their own modules
# (checkpoint_files.lightning, callback) and the schema in trainer_resume.state.
__all__ = [
    "INTERNALS",
    "RELEASES",
    "ResumeCallback",
    "ResumePointsCallback",
    "DurableCheckpointIO",
    "load_from_checkpoint",
    "plain_lightning_checkpoint",
]
