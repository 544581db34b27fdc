"""Which of an ``Accelerator``'s data-loading settings a prepared loader reproduces.

``accelerator.prepare`` shapes a data loader by the Accelerator's
``DataLoaderConfiguration``, its ``rng_types`` and its distributed setup.
:func:`~trainer_resume.adapters.accelerate.prepare_loader` reproduces the defaults and
the options below exactly; every other setting is refused here, before anything is
built, with the setting and its fix named (``UnsupportedResumeConfigurationError``, 332).

Honoured: ``even_batches=True`` (the default; ``False`` is refused with more than one
process, where it would give the processes different numbers of batches, and has no
effect with one), ``non_blocking``, ``device_placement``, ``rng_types=["generator"]``
(the default; the rank-0 sync of the sampler generator is done once, see
``prepare_loader``). Refused: ``split_batches=True``, ``dispatch_batches=True``,
``use_seedable_sampler=True``, ``use_stateful_dataloader=True``, ``"torch"`` / ``"cuda"``
/ ``"xla"`` in ``rng_types`` with more than one process, TPU (XLA) and Megatron-LM
setups, and device meshes (tensor or context parallelism, whose data-parallel size is
not the number of processes).
"""

from __future__ import annotations

from typing import Any

from accelerate.utils import DistributedType

from ...errors import UnsupportedResumeConfigurationError

__all__ = ["check_accelerator"]

# DataLoaderConfiguration fields that must keep a value, with the reason and fix.
_REQUIRED = (
    (
        "split_batches",
        False,
        "prepare_loader shares whole batches among the processes, as with the default",
    ),
    (
        "dispatch_batches",
        (None, False),
        "every process reads its own batches from its own loader; batches dispatched from "
        "the main process are not reproduced",
    ),
    (
        "use_seedable_sampler",
        False,
        "the prepared loader records its sampler's order exactly, so a SeedableRandomSampler "
        "is not needed, and its order would differ",
    ),
    (
        "use_stateful_dataloader",
        False,
        "the prepared loader saves its own delivered position; a StatefulDataLoader's state "
        "is not used",
    ),
)


def _refuse(setting: str, value: Any, reason: str, fix: str) -> UnsupportedResumeConfigurationError:
    return UnsupportedResumeConfigurationError(
        f"prepare_loader does not reproduce Accelerator {setting}={value!r}: {reason}; {fix}"
    )


def check_accelerator(accelerator: Any) -> None:
    """Refuse an Accelerator whose data-loading settings a prepared loader would not reproduce.

    Reads ``accelerator.dataloader_config`` (``DataLoaderConfiguration``),
    ``accelerator.rng_types``, ``accelerator.distributed_type``,
    ``accelerator.num_processes`` and the device mesh (``Accelerator._prepare_device_mesh``).

    Raises:
        UnsupportedResumeConfigurationError: a setting listed as refused in the module.
    """
    config = accelerator.dataloader_config
    for name, allowed, reason in _REQUIRED:
        value = getattr(config, name)
        if value not in (allowed if isinstance(allowed, tuple) else (allowed,)):
            default = allowed[0] if isinstance(allowed, tuple) else allowed
            raise _refuse(
                f"DataLoaderConfiguration({name})",
                value,
                reason,
                f"leave {name}={default!r} (the default)",
            )
    several = accelerator.num_processes > 1
    if several and not config.even_batches:
        raise _refuse(
            "DataLoaderConfiguration(even_batches)",
            False,
            f"the {accelerator.num_processes} processes would read different numbers of batches",
            "leave even_batches=True (the default)",
        )
    synced = sorted(str(getattr(kind, "value", kind)) for kind in accelerator.rng_types or ())
    if several and any(kind != "generator" for kind in synced):
        raise _refuse(
            "rng_types",
            synced,
            "a global generator synchronized from process 0 at every epoch's start would not be "
            "synchronized again where a resumed epoch starts",
            "leave rng_types unset (['generator'])",
        )
    kind = accelerator.distributed_type
    if kind in (DistributedType.XLA, DistributedType.MEGATRON_LM):
        raise _refuse(
            "distributed_type",
            str(kind),
            "its loaders are wrapped by that backend",
            "run on CPU, CUDA or another device torch's DistributedDataParallel drives",
        )
    # Accelerate's own prepare shares data by the mesh's data-parallel size (private
    # Accelerator._prepare_device_mesh, read in accelerate 1.15).
    if accelerator._prepare_device_mesh() is not None:
        raise _refuse(
            "torch_device_mesh",
            "set",
            "the data-parallel size of a tensor- or context-parallel mesh is not the number of "
            "processes",
            "use data parallelism only (DDP or FSDP without a device mesh)",
        )
