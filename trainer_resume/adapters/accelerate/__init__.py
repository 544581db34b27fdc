"""Hugging Face Accelerate integration (install the ``accelerate`` extra).

- :func:`prepare_loader`: what ``accelerator.prepare`` does for a data loader, for a
  ``ResumableDataLoader``: shared among the processes, batches on the device,
  registered with the Accelerator's gradient state, and still resumable.
- :func:`accelerator_state`: the Accelerator's micro-step counter and gradient-sync
  state, as a resume object, so a pause inside ``accelerator.accumulate`` is exact.
- :func:`resume_objects`: a loop's prepared objects plus those two, for
  ``_resume_objects()``.

Importing it also gives the refusal of a loader ``accelerator.prepare`` made (returned
from ``_resume_loaders()``) a fix that names :func:`prepare_loader`.

Requires ``accelerate`` 1.15 or later (tested with 1.15 to 1.16.0, :data:`RELEASES`). The
adapter reads Accelerate internals, every one named in :data:`INTERNALS` and checked when
it is imported: a release without one of them (or with another shape of it) is refused
with ``FrameworkReleaseError`` (352) naming it; a newer release than the tested ones warns
once (``UntestedReleaseWarning``) and works.
"""

from __future__ import annotations

from .._release import ACCELERATE, Attribute, Function, Name, Refers, check_release

RELEASES = ACCELERATE
_STATE = "accelerate.state:GradientState"
_ACCELERATOR = "accelerate.accelerator:Accelerator"
_CONFIG = "accelerate.utils.dataclasses:DataLoaderConfiguration"

# Everything of Accelerate the adapter's modules read, call or rely on Accelerate doing.
INTERNALS = (
    # loader.py: PreparedLoader registers with the gradient state as DataLoaderShard does,
    # and GradientState reads end_of_dataloader and remainder from the loader registered last.
    Function(f"{_STATE}._add_dataloader", positional=1),
    Function(f"{_STATE}._remove_dataloader", positional=1),
    Refers(f"{_STATE}.end_of_dataloader", "active_dataloader", "end_of_dataloader"),
    Refers(f"{_STATE}.remainder", "active_dataloader", "remainder"),
    Attribute(f"{_ACCELERATOR}.gradient_state"),
    Attribute(f"{_ACCELERATOR}.device"),
    Attribute(f"{_ACCELERATOR}.device_placement"),
    Attribute(f"{_ACCELERATOR}.non_blocking"),
    Attribute(f"{_ACCELERATOR}.num_processes"),
    Attribute(f"{_ACCELERATOR}.process_index"),
    Function("accelerate.utils:broadcast_object_list", positional=1, keywords=("from_process",)),
    Function("accelerate.utils:send_to_device", positional=2, keywords=("non_blocking",)),
    # settings.py: the data-loading settings a prepared loader reproduces or refuses.
    Attribute(f"{_ACCELERATOR}.dataloader_config"),
    Attribute(f"{_CONFIG}.split_batches"),
    Attribute(f"{_CONFIG}.dispatch_batches"),
    Attribute(f"{_CONFIG}.use_seedable_sampler"),
    Attribute(f"{_CONFIG}.use_stateful_dataloader"),
    Attribute(f"{_CONFIG}.even_batches"),
    Attribute(f"{_ACCELERATOR}.rng_types"),
    Attribute(f"{_ACCELERATOR}.distributed_type"),
    Name("accelerate.utils:DistributedType.XLA"),
    Name("accelerate.utils:DistributedType.MEGATRON_LM"),
    Function(f"{_ACCELERATOR}._prepare_device_mesh", positional=0),
    # accelerator_state.py: accumulate decides a micro-step's sync from Accelerator.step and
    # these settings alone (Accelerator._do_sync), so saving them makes a pause exact.
    Attribute(f"{_ACCELERATOR}.step", settable=True),
    Attribute(f"{_ACCELERATOR}.sync_gradients", settable=True),
    Attribute(f"{_STATE}.num_steps"),
    Attribute(f"{_STATE}.adjust_scheduler"),
    Attribute(f"{_STATE}.sync_with_dataloader"),
    Attribute(f"{_STATE}.plugin_kwargs"),
    Refers(f"{_ACCELERATOR}.accumulate", "_do_sync", "sync_each_batch"),
    Refers(
        f"{_ACCELERATOR}._do_sync", "step", "num_steps", "sync_with_dataloader", "end_of_dataloader"
    ),
    # objects.py
    Function(f"{_ACCELERATOR}.unwrap_model", positional=1),
    Attribute(f"{_ACCELERATOR}._custom_objects"),  # what register_for_checkpointing added
    Attribute(f"{_ACCELERATOR}.scaler"),
    # wrappers.py: Accelerate's loader wrappers, refused with the fix.
    Name("accelerate.data_loader:DataLoaderShard"),
    Name("accelerate.data_loader:DataLoaderDispatcher"),
    Name("accelerate.data_loader:SkipDataLoader"),
    Name("accelerate.data_loader:SkipBatchSampler"),
)

check_release(ACCELERATE, adapter="accelerate", extra="accelerate", internals=INTERNALS)

from .accelerator_state import (  # noqa: E402 (after the release check)
    ACCELERATOR_FORMAT,
    AcceleratorResumeState,
    accelerator_state,
)
from .loader import PreparedLoader, prepare_loader  # noqa: E402
from .objects import resume_objects  # noqa: E402
from .wrappers import prepared_loader_hint  # noqa: E402  (registers the refusal's fix)

__all__ = [
    "prepare_loader",
    "PreparedLoader",
    "accelerator_state",
    "AcceleratorResumeState",
    "resume_objects",
    "prepared_loader_hint",
    "ACCELERATOR_FORMAT",
    "INTERNALS",
    "RELEASES",
]
