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

ACCELERATE_VERSIONS = (">=1.15", "<1.16")  # the tested range, as in the extra

try:
    import accelerate as _accelerate
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainer_resume.adapters.accelerate needs accelerate 1.15: "
        "pip install 'trainer-resume[accelerate]'"
    ) from _exc

# packaging comes with accelerate, so it is imported once accelerate is known present.
from packaging.version import Version as _Version  # noqa: E402

if not _Version("1.15") <= _Version(_accelerate.__version__) < _Version("1.16"):
    raise ImportError(
        f"trainer_resume.adapters.accelerate is tested with accelerate 1.15 and found "
        f"{_accelerate.__version__}: it reads Accelerate internals (GradientState's loader "
        "registration, Accelerator.step) that other releases may change; install "
        "'accelerate>=1.15,<1.16'"
    )

from .accelerator_state import (  # noqa: E402
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
