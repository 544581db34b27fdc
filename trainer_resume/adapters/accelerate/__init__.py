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

Requires ``accelerate`` 1.15 (``>=1.15,<1.16``): the adapter reads Accelerate internals
(``GradientState._add_dataloader`` / ``_remove_dataloader`` and the
``end_of_dataloader`` / ``remainder`` it reads from a loader, ``Accelerator.step``,
``GradientState.plugin_kwargs``, ``DataLoaderConfiguration``,
``Accelerator._prepare_device_mesh``), tested against that release only.
"""

from __future__ import annotations

from .._release import tested_release

ACCELERATE_VERSIONS = (">=1.15", "<1.16")  # the tested range, as in the extra

tested_release(
    "accelerate",
    adapter="accelerate",
    extra="accelerate",
    tested="1.15",
    below="1.16",
    reads="it reads Accelerate internals (GradientState's loader registration, Accelerator.step)",
)

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
    "ACCELERATE_VERSIONS",
]
