"""Hugging Face ``transformers`` Trainer integration (install the ``transformers`` extra).

:class:`ResumableTrainer` is a ``transformers.Trainer`` with an exact pause and resume:
swap the class, pass ``pause_path``, and a SIGTERM pauses ``train()`` at the next
optimizer-step end; running the same command again continues bit-identically. See
``docs/transformers.md``.

Requires ``transformers`` 5.24 or later (tested with 5.24 to 5.25.0, :data:`RELEASES`) and
``accelerate`` 1.15 or later. The trainer reads and overrides Trainer internals, every one
named in :data:`INTERNALS` and checked when it is imported: a release without one of them
(or with another shape of it) is refused with ``FrameworkReleaseError`` (352) naming it; a
newer release than the tested ones warns once (``UntestedReleaseWarning``) and works.
"""

from __future__ import annotations

from .._release import ACCELERATE, TRANSFORMERS, Attribute, Function, Name, Refers, check_release

RELEASES = TRANSFORMERS
_TRAINER = "transformers.trainer:Trainer"
_ARGS = "transformers.training_args:TrainingArguments"
_CALLBACK = "transformers.trainer_callback:TrainerCallback"

# Everything of transformers the trainer's modules read, call, override or rely on the
# Trainer calling.
INTERNALS = (
    Name("transformers:Trainer"),
    Name("transformers:TrainerCallback"),
    # trainer.py: the loop's internals steered. The Trainer's loop calls each override.
    Function(f"{_TRAINER}.train", keywords=("ignore_keys_for_eval",)),
    Refers(f"{_TRAINER}.train", "_inner_training_loop"),
    Refers(
        f"{_TRAINER}._inner_training_loop",
        "get_train_dataloader",
        "_init_training_state",
        "_run_epoch",
        "on_train_begin",
        "on_epoch_begin",
        "_tr_loss",
        "_total_loss_scalar",
        "_globalstep_last_logged",
        "_initial_global_step",
        "_initial_num_input_tokens_seen",
    ),
    Function(f"{_TRAINER}._init_training_state"),
    Function(
        f"{_TRAINER}._run_epoch",
        parameters=("epoch", "train_dataloader", "steps_in_epoch", "num_update_steps_per_epoch"),
    ),
    Refers(f"{_TRAINER}._run_epoch", "_maybe_log_save_evaluate", "on_step_end", "on_epoch_end"),
    Function(f"{_TRAINER}._maybe_log_save_evaluate"),
    Function(f"{_TRAINER}.evaluate"),
    # The evaluation loaders kept with persistent workers, which evaluate() stops.
    Refers(f"{_TRAINER}.get_eval_dataloader", "_eval_dataloaders"),
    Refers(f"{_TRAINER}._get_dataloader", "_eval_dataloaders"),
    Function(f"{_TRAINER}.get_train_dataloader"),
    Attribute(f"{_TRAINER}.args"),
    Attribute(f"{_TRAINER}.callback_handler"),
    Attribute(f"{_TRAINER}.state"),
    Attribute(f"{_TRAINER}.control"),
    Attribute(f"{_TRAINER}.model"),
    Attribute(f"{_TRAINER}.optimizer"),
    Attribute(f"{_TRAINER}.lr_scheduler"),
    Attribute(f"{_TRAINER}.accelerator"),
    Attribute(f"{_TRAINER}.model_wrapped"),
    Attribute(f"{_TRAINER}.deepspeed"),
    Attribute("transformers.trainer_callback:CallbackHandler.callbacks"),
    # The loader get_train_dataloader() returned, as the loop iterates it.
    Attribute(
        "transformers.trainer_callback:CallbackHandler.train_dataloader",
        set_by="transformers.trainer:Trainer",
    ),
    Function(f"{_CALLBACK}.on_train_begin", positional=3),
    Function(f"{_CALLBACK}.on_epoch_begin", positional=3),
    Function(f"{_CALLBACK}.on_step_end", positional=3),
    Function(f"{_CALLBACK}.on_epoch_end", positional=3),
    Attribute("transformers.trainer_callback:TrainerControl.should_training_stop", settable=True),
    Attribute("transformers.trainer_callback:TrainerControl.should_epoch_stop", settable=True),
    Attribute("transformers.trainer_callback:TrainerState.epoch", settable=True),
    Function(f"{_ARGS}.to_dict", positional=0),
    Attribute(f"{_ARGS}.eval_on_start", settable=True),
    Attribute(f"{_ARGS}.gradient_accumulation_steps"),
    Attribute(f"{_ARGS}.output_dir"),
    Attribute(f"{_ARGS}.run_name"),
    Attribute(f"{_ARGS}.disable_tqdm"),
    # loop_state.py: what the Trainer carries between optimizer steps.
    Name("transformers.trainer_callback:TrainerState"),
    Name("transformers.trainer_callback:TrainerControl"),
    Function("transformers.trainer_callback:ExportableState.state", positional=0),
    Attribute(f"{_TRAINER}._tr_loss", settable=True),
    Attribute(f"{_TRAINER}._total_loss_scalar", settable=True),
    Attribute(f"{_TRAINER}._globalstep_last_logged", settable=True),
    Attribute(f"{_TRAINER}._initial_global_step", settable=True),
    Attribute(f"{_TRAINER}._initial_num_input_tokens_seen", settable=True),
    Attribute(f"{_TRAINER}.current_flos", settable=True),
    Attribute(f"{_ARGS}.device"),
    # loader.py: the training loader, built from what Trainer._get_dataloader builds it from.
    Attribute(f"{_TRAINER}.train_dataset"),
    Attribute(f"{_TRAINER}.data_collator"),
    Attribute(f"{_TRAINER}._train_batch_size"),
    Function(f"{_TRAINER}._get_train_sampler", positional=1),
    Function(f"{_TRAINER}._remove_unused_columns", positional=1, keywords=("description",)),
    Function(
        f"{_TRAINER}._get_collator_with_removed_columns", positional=1, keywords=("description",)
    ),
    Function(
        "transformers.trainer_utils:seed_worker", positional=1, keywords=("num_workers", "rank")
    ),
    Function("transformers.utils:is_datasets_available", positional=0),
    Attribute(f"{_ARGS}.data_seed"),
    Attribute(f"{_ARGS}.seed"),
    Attribute(f"{_ARGS}.dataloader_num_workers"),
    Attribute(f"{_ARGS}.dataloader_pin_memory"),
    Attribute(f"{_ARGS}.dataloader_persistent_workers"),
    Attribute(f"{_ARGS}.dataloader_multiprocessing_context"),
    Attribute(f"{_ARGS}.dataloader_prefetch_factor"),
    Attribute(f"{_ARGS}.dataloader_in_order"),
    Attribute(f"{_ARGS}.dataloader_drop_last"),
    Attribute(f"{_ARGS}.process_index"),
    # refusals.py: the settings refused (a renamed one would no longer be).
    Attribute(f"{_ARGS}.train_sampling_strategy"),
    Attribute(f"{_ARGS}.enable_jit_checkpoint"),
    Attribute(f"{_ARGS}.auto_find_batch_size"),
    Attribute(f"{_ARGS}.fsdp"),
    Attribute(f"{_ARGS}.world_size"),
    Attribute(f"{_ARGS}.n_gpu"),
    Attribute(f"{_ARGS}.parallelism_config"),
    Attribute(f"{_TRAINER}.is_deepspeed_enabled"),
    Attribute(f"{_TRAINER}.is_fsdp_enabled"),
    Attribute(f"{_TRAINER}.is_model_parallel"),
    Attribute("transformers.trainer_utils:RemoveColumnsCollator.data_collator"),
    Attribute("transformers.data.data_collator:DataCollatorForLanguageModeling.seed"),
    Function(
        "transformers.data.data_collator:DataCollatorForLanguageModeling.get_generator",
        positional=1,
    ),
)

# What the trainer reads of the Accelerator the Trainer builds.
ACCELERATE_INTERNALS = (
    Attribute("accelerate.accelerator:Accelerator.num_processes"),
    Attribute("accelerate.accelerator:Accelerator.scaler"),
    Attribute("accelerate.optimizer:AcceleratedOptimizer.optimizer"),
)

check_release(
    ACCELERATE, adapter="transformers", extra="transformers", internals=ACCELERATE_INTERNALS
)
check_release(TRANSFORMERS, adapter="transformers", extra="transformers", internals=INTERNALS)

from .trainer import ResumableTrainer  # noqa: E402

__all__ = ["ResumableTrainer", "INTERNALS", "ACCELERATE_INTERNALS", "RELEASES"]
