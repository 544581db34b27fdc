"""Hugging Face ``datasets`` streaming datasets (``datasets.IterableDataset``): which resume exactly.

A streaming dataset saves its position with ``state_dict()`` and, after
``load_state_dict()``, starts its next iteration there. Two of its ways cannot be
resumed as they are:

* ``.shuffle(buffer_size=...)`` draws from a buffer of examples that its state does
  not hold: a loaded state refills the buffer with new examples (Hugging Face says so
  when it loads one), so no loader can resume the stream exactly. It is refused
  before the loader exists unless the user accepts that
  (``allow_inexact_shuffle_buffer=True``).
* A loaded state is applied at every later iteration of the same epoch, not only the
  next one. The loader loads a state only into the pass it resumes, so at the start of
  every other pass it takes the loaded state back, and a copy then starts that pass as
  in the uninterrupted run, whether or not the user calls ``set_epoch``. A resumed pass
  whose epoch is not the state's would start over: that is refused.

What this reads of ``datasets`` (checked against datasets 5.2.0): an
``IterableDataset``'s ``_ex_iterable`` (its pipeline of examples iterables, linked by
their ``ex_iterable`` / ``ex_iterables`` attributes, as ``datasets`` itself walks it),
the class ``BufferShuffledExamplesIterable``, the ``_starting_state_dict`` a loaded
state waits in, ``epoch`` and the ``"epoch"`` entry of its state. Where the pipeline
holds a class this module does not know, or an attribute is missing, a buffer cannot
be ruled out: the loader warns instead of refusing.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from ..errors import UncheckedResumeWarning, UnsupportedResumeConfigurationError

__all__ = ["check_streaming_dataset", "is_streaming_dataset", "prepare_pass"]

TESTED_VERSIONS = "5.2.0"
_BUFFER = "BufferShuffledExamplesIterable"
# The examples iterables of datasets 5.2.0: all but the buffer keep their whole position
# in their state.
_KNOWN = frozenset(
    (
        "ArrowExamplesIterable",
        _BUFFER,
        "CyclingMultiSourcesExamplesIterable",
        "ExamplesIterable",
        "FilteredExamplesIterable",
        "FormattedExamplesIterable",
        "HorizontallyConcatenatedMultiSourcesExamplesIterable",
        "InterleavedShardsExamplesIterable",
        "MappedExamplesIterable",
        "RandomlyCyclingMultiSourcesExamplesIterable",
        "RebatchedArrowExamplesIterable",
        "RepeatExamplesIterable",
        "SelectColumnsIterable",
        "SkipExamplesIterable",
        "StepExamplesIterable",
        "TakeExamplesIterable",
        "VerticallyConcatenatedMultiSourcesExamplesIterable",
    )
)


def is_streaming_dataset(dataset: Any) -> bool:
    """``dataset`` is a ``datasets.IterableDataset`` (``datasets`` is not imported here)."""
    module = sys.modules.get("datasets.iterable_dataset")
    kind = getattr(module, "IterableDataset", None)
    return isinstance(kind, type) and isinstance(dataset, kind)


def _version() -> str:
    return str(getattr(sys.modules.get("datasets"), "__version__", "unknown"))


def _pipeline(dataset: Any) -> tuple[list[str], str | None]:
    """The class names of the dataset's examples iterables, and why the walk is incomplete."""
    if not hasattr(dataset, "_starting_state_dict"):
        return [], "it has no _starting_state_dict"
    root = getattr(dataset, "_ex_iterable", None)
    if root is None:
        return [], "it has no _ex_iterable"
    names: list[str] = []
    pending, seen = [root], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        names.append(type(node).__name__)
        if type(node).__name__ not in _KNOWN:
            return names, f"its pipeline holds a {type(node).__name__}, unknown to this check"
        child = getattr(node, "ex_iterable", None)
        if child is not None:
            pending.append(child)
        pending.extend(getattr(node, "ex_iterables", None) or ())
    return names, None


def check_streaming_dataset(
    dataset: Any, *, allow_inexact_shuffle_buffer: bool, num_workers: int = 0
) -> None:
    """Refuse a streaming dataset shuffled with a buffer; warn where that cannot be ruled out.

    Raises:
        UnsupportedResumeConfigurationError: the pipeline holds a shuffle buffer and
            ``allow_inexact_shuffle_buffer`` is false, or it is true with workers (a
            worker's copy fails to load such a state: no pause of it could be resumed).
    """
    names, incomplete = _pipeline(dataset)
    if _BUFFER in names and allow_inexact_shuffle_buffer and num_workers > 0:
        raise UnsupportedResumeConfigurationError(
            f"the Hugging Face streaming dataset is shuffled with a buffer, and with "
            f"num_workers={num_workers} a worker's copy fails to load its state (datasets "
            f"{_version()} raises IndexError in load_state_dict()), so no pause of this loader "
            "could be resumed; use num_workers=0 with the buffer, or shuffle without a buffer "
            "(a map-style datasets.Dataset with ResumableDataLoader(shuffle=True))"
        )
    if _BUFFER in names and not allow_inexact_shuffle_buffer:
        raise UnsupportedResumeConfigurationError(
            "the Hugging Face streaming dataset is shuffled with a buffer (.shuffle(buffer_size="
            "...)), whose examples its state_dict() does not hold: a loaded state refills the "
            "buffer with other examples, so no loader can resume it exactly; shuffle without a "
            "buffer instead (use a map-style datasets.Dataset, e.g. load_dataset(...) without "
            "streaming=True, with ResumableDataLoader(shuffle=True), or stream the data files in "
            "an order you shuffle yourself), or pass allow_inexact_shuffle_buffer=True to accept "
            "a resume that refills the buffer"
        )
    if incomplete is not None:
        warnings.warn(
            UncheckedResumeWarning(
                f"could not check whether the Hugging Face streaming dataset is shuffled with a "
                f"buffer (datasets {_version()}; the check was tested with datasets "
                f"{TESTED_VERSIONS}): {incomplete}. A shuffle buffer (.shuffle(buffer_size=...)) "
                "would make a resume differ from the uninterrupted run"
            ),
            stacklevel=4,
        )


def prepare_pass(dataset: Any, resuming_inside: bool) -> str | None:
    """Before a copy's ``iter()``: take back a loaded state that is not this pass's to resume.

    Returns:
        Why the pass cannot be read exactly (a resumed pass in another epoch than its
        state's), or None.
    """
    starting = getattr(dataset, "_starting_state_dict", None)
    if not starting:
        return None
    if not resuming_inside:
        # Loaded for an earlier pass (or at a pass's end): the uninterrupted run starts
        # this pass from the beginning, with no loaded state.
        dataset._starting_state_dict = None
        return None
    saved, current = starting.get("epoch"), getattr(dataset, "epoch", None)
    if saved != current:
        return (
            f"the Hugging Face streaming dataset is in epoch {current} but the pass being resumed "
            f"was saved in epoch {saved}: it would start the pass over instead of resuming it; call "
            f"dataset.set_epoch({saved}) before the resumed pass, as the saved run did"
        )
    return None
