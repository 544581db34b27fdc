"""MosaicML's ``StreamingDataset`` (the ``streaming`` package), driven through its state API.

What its own ``StreamingDataLoader`` relies on, and what a resumable loader over the
dataset does with it:

* The dataset deals each epoch out over the workers so that torch's round-robin
  delivers one global order, the same with any number of workers; it needs the
  loader's ``batch_size`` for that (its ``batch_size`` argument), and a loader with
  another one is refused.
* Its epoch counter (``next_epoch``) lives in shared memory and each ``iter()``
  advances it; the loader sets it before each pass, so pass ``p`` reads epoch ``p``.
* ``state_dict(num_samples, from_beginning=True)`` names a place in the epoch by the
  samples delivered since the epoch's start (the sum of the workers' delivered
  samples), and ``load_state_dict`` shares it with every worker, which skip that many
  samples of the global order at their next ``iter()`` and deal the rest out from
  worker 0 again. So the copies start from the state loaded in the main process, and
  worker ``w`` carries on with the generators of the worker whose batches it now
  reads (see ``Starts.rotation``). A state saved at an epoch's end names the next
  epoch's start: MosaicML's own state there (``sample_in_epoch`` equal to the epoch's
  size) resumes into an empty epoch.

Refused before the loader exists: ``batch_size=None`` or another ``batch_size`` than
the dataset's, ``replication`` (its counts are not the delivered samples), and
several processes (``torch.distributed``), whose global counts were not tested.

Tested with mosaicml-streaming 0.13.0 (``next_epoch``, ``batch_size``,
``replication``, ``state_dict`` / ``load_state_dict`` and the keys of their state:
``epoch``, ``sample_in_epoch``, ``num_canonical_nodes``, ``shuffle_seed``,
``initial_physical_nodes``).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..errors import UnsupportedResumeConfigurationError
from ._driver import Starts

__all__ = ["MosaicDriver"]


class MosaicDriver:
    """Positions the copies of a MosaicML ``StreamingDataset`` (see the module docstring)."""

    library = "mosaicml"

    def __init__(self) -> None:
        self._workers = 1

    def configure(self, dataset: Any, batch_size: int | None, num_workers: int) -> None:
        name = type(dataset).__name__
        if batch_size is None or getattr(dataset, "batch_size", None) != batch_size:
            raise UnsupportedResumeConfigurationError(
                f"{name} is MosaicML's StreamingDataset built with batch_size="
                f"{getattr(dataset, 'batch_size', None)!r} but the loader's batch_size is "
                f"{batch_size!r}: MosaicML deals its samples out over the workers by that batch "
                "size, so a resume could not name the delivered samples; build the dataset "
                "with the loader's batch_size"
            )
        if getattr(dataset, "replication", None) not in (None, 1):
            raise UnsupportedResumeConfigurationError(
                f"{name} is MosaicML's StreamingDataset with replication="
                f"{dataset.replication!r}, whose resume counts are not the delivered samples; "
                "leave replication unset with a ResumableDataLoader"
            )
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise UnsupportedResumeConfigurationError(
                f"{name} is MosaicML's StreamingDataset read by {dist.get_world_size()} "
                "processes; a ResumableDataLoader resumes it exactly in one process only (its "
                "counts over several ranks were not tested)"
            )
        self._workers = max(num_workers, 1)

    def starts(
        self, dataset: Any, epoch: int, samples: list[int], ended: list[bool], turn: int
    ) -> Starts:
        delivered = sum(samples)
        # state_dict() reads the epoch as next_epoch - 1; the keys it cannot know are set.
        dataset.next_epoch = epoch + 1
        state = dict(dataset.state_dict(delivered, True))
        state["epoch"], state["sample_in_epoch"] = epoch, delivered
        # Every copy reads the state shared here at its iter(), and the epoch counter
        # names this pass (an older state's epoch would win over a lower counter).
        dataset.load_state_dict(state)
        dataset.next_epoch = epoch
        return Starts([None] * self._workers, rotation=turn if delivered else None)

    def open(self, copy: Any, epoch: int, state: Any) -> None:
        pass  # the shared state and counter set in starts() position every copy
