"""Streaming datasets whose position another library's loader passes in: driven, or refused.

Streaming-dataset libraries keep a dataset's position in their own loader: their
datasets have ``state_dict()`` / ``load_state_dict()``, but ``state_dict()`` takes
the sample counts that loader tracks (litdata: ``num_samples_yielded, num_workers,
batch_size``; MosaicML: ``num_samples, from_beginning``) and must run in the main
process. A resumable loader that took them as ordinary stateful datasets could not
call it at all. So:

* a dataset this package knows how to drive gets a :class:`StreamingDriver`: the
  loader records, per worker, how many samples each copy delivered (as for any
  ``IterableDataset``), and the driver turns those counts into the library's own
  state through its documented API, in the main process, when a pass starts; the
  loader's generators (seeded per pass and worker, carried from batch to batch and
  saved with the position) replay the augmentation on top;
* any other ``IterableDataset`` whose ``state_dict()`` needs arguments, and the
  classes of these libraries whose state belongs to their own loader, are refused
  before the loader exists, naming the library and what to use instead.

The libraries are recognised by class through ``sys.modules``: nothing here imports
them, so a dataset of a library that is not imported is not one of theirs.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from ..errors import UnsupportedResumeConfigurationError
from ._driver import StreamingDriver

__all__ = ["check_state_arguments", "driver_for", "required_arguments"]


def required_arguments(method: Any) -> list[str]:
    """The parameters ``method`` cannot be called without (none where it cannot be inspected)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        parameter.name
        for parameter in parameters
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def _class_in(dataset: Any, module: str, name: str) -> bool:
    kind = getattr(sys.modules.get(module), name, None)
    return isinstance(kind, type) and isinstance(dataset, kind)


# Classes whose position lives in their library's own loader and that no driver reads:
# (module, class, library, what to use instead).
_LOADER_OWNED = (
    (
        "litdata.streaming.combined",
        "CombinedStreamingDataset",
        "litdata",
        "read each litdata.StreamingDataset through its own ResumableDataLoader",
    ),
    (
        "litdata.streaming.parallel",
        "ParallelStreamingDataset",
        "litdata",
        "read each litdata.StreamingDataset through its own ResumableDataLoader",
    ),
)

_ELSEWHERE = (
    "or keep the library's own loader and return it from _resume_loaders(), declared with "
    "trainer_resume.declare_no_random_draws(loader) if its samples draw no random numbers "
    "(docs/streaming.md)"
)


def driver_for(dataset: Any) -> StreamingDriver | None:
    """The driver of ``dataset``'s library, or ``None`` when it is not a dataset one drives."""
    if _class_in(dataset, "litdata.streaming.dataset", "StreamingDataset"):
        from ._litdata import LitdataDriver

        return LitdataDriver()
    if _class_in(dataset, "streaming.base.dataset", "StreamingDataset"):
        from ._mosaicml import MosaicDriver

        return MosaicDriver()
    return None


def check_state_arguments(dataset: Any) -> None:
    """Refuse an ``IterableDataset`` whose state another library's loader must pass in.

    Raises:
        UnsupportedResumeConfigurationError: a class of a streaming library whose state
            belongs to that library's loader, or a ``state_dict()`` that needs arguments
            (332).
    """
    name = type(dataset).__name__
    for module, kind, library, instead in _LOADER_OWNED:
        if _class_in(dataset, module, kind):
            raise UnsupportedResumeConfigurationError(
                f"{name} is {library}'s {kind}, whose position is kept by {library}'s own "
                f"StreamingDataLoader (its state_dict() takes that loader's counts), which a "
                f"ResumableDataLoader cannot drive exactly; {instead}, {_ELSEWHERE}"
            )
    method = getattr(dataset, "state_dict", None)
    if not callable(method) or not callable(getattr(dataset, "load_state_dict", None)):
        return
    needed = required_arguments(method)
    if needed:
        raise UnsupportedResumeConfigurationError(
            f"{name} is an IterableDataset whose state_dict() needs arguments "
            f"({', '.join(needed)}): its position is passed in by another library's loader, "
            "which a ResumableDataLoader cannot drive; give the dataset a state_dict() without "
            "arguments and load_state_dict() (torchdata's Stateful protocol), use a dataset a "
            f"ResumableDataLoader drives (litdata's or MosaicML's StreamingDataset), {_ELSEWHERE}"
        )
