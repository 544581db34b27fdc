"""The iterator of a resumable loader over an ``IterableDataset``: delivers the batches of one pass.

The internal loader yields the tagged items of :mod:`._iterable`; this iterator
hands the batches to the caller and records each worker's state when its batch is
delivered. Whether the pass has ended is known only from the items after the last
batch, so :meth:`IterableIterator.look_ahead` (called by ``state_dict()``) reads on
to the next batch, which it keeps for the next ``next()`` without counting it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..errors import LoaderFetchFailedError, UnsupportedResumeConfigurationError
from ._iterable import BATCH, END, FAILED, REFUSED, SKIP
from ._iterable_source import IterableSource
from ._iterator import ResumableIterator, Stream, cause_of

__all__ = ["IterableIterator"]

_NOTHING = object()


class IterableIterator(ResumableIterator):
    """Iterator over one pass of a stateful ``IterableDataset``; see ``ResumableDataLoader``."""

    def __init__(self, stream: Stream, inner: Any, epoch: int) -> None:
        super().__init__(stream, inner, deque(), epoch)
        self._source: IterableSource = stream.source  # type: ignore[assignment]
        self._ahead: Any = _NOTHING  # a batch item read by look_ahead(), not delivered yet
        # Per worker, the generator states its last batch that carried them carried (a
        # worker sends UNCHANGED for the same states again; see _iterable).
        self._generators: dict[int, Any] = {}

    def look_ahead(self) -> None:
        """Read on to the next batch, so a pass that has ended is known to have ended.

        Nothing is delivered: the batch is kept for the next ``next()``. A failure here
        is raised by that ``next()``; nothing happens after the iterator stopped or
        before it delivered its first batch (then the pass has not started to move).
        """
        if (
            self._dead is not None  # not alive (written out: it runs at every step boundary)
            or self._exhausted
            or self._ahead is not _NOTHING
            or not self.delivered
        ):
            return
        try:
            self._ahead = self._next_batch_item()
        except (StopIteration, LoaderFetchFailedError, UnsupportedResumeConfigurationError):
            pass  # the end is recorded; a failure is kept for next()

    def _receive(self) -> Any:
        item, self._ahead = self._ahead, _NOTHING
        return item if item is not _NOTHING else self._next_batch_item()

    def _next_batch_item(self) -> Any:
        while True:
            tag, worker, payload, states = self._pull()
            if tag == BATCH:
                generators = states[3]
                if type(generators) is str:  # UNCHANGED
                    states = (*states[:3], self._generators[worker])
                elif generators is not None:
                    self._generators[worker] = generators
                return worker, payload, states
            if tag == END:
                self._source.end_worker(worker, states)
            elif tag == FAILED:
                raise self._fail_fetch(payload.describe()) from cause_of(payload)
            elif tag == REFUSED:
                error = UnsupportedResumeConfigurationError(payload)
                self._kill(error)
                raise error
            elif tag != SKIP:
                raise RuntimeError(f"unknown item tag {tag!r} from the internal loader")

    def _commit(self, data: Any) -> tuple[Any, bool]:
        worker, batch, states = data
        self._source.commit_batch(worker, states)
        return batch, False
