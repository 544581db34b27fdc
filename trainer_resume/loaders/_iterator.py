"""The iterator of a resumable loader: delivers batches and commits their positions.

Reference layout (no cycles, so dropping the loader and its iterator stops the
workers at once, without waiting for the garbage collector)::

    loader -> iterator -> internal torch iterator -> Tasks -> source -> sampler
    loader -> Stream <- iterator

Neither the iterator nor anything below it refers back to the loader.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch.utils.data._utils.fetch import _IterableDatasetFetcher, _MapDatasetFetcher
from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

from ..errors import IteratorInvalidatedError, LoaderCommitFailedError, LoaderFetchFailedError
from ..pause_signals import quiet_child_exits
from ._fetch import FetchFailure, as_is
from ._sources import Pending, Source

__all__ = ["Stream", "ResumableIterator", "cause_of", "release", "shutdown"]

_profiler_enabled = torch.autograd._profiler_enabled


class Stream:
    """What a loader and its iterators share: the source and the failure flags."""

    __slots__ = ("source", "augmentation_seed", "fetch_failure", "commit_failure")

    def __init__(self, source: Source, augmentation_seed: int) -> None:
        self.source = source
        self.augmentation_seed = augmentation_seed
        self.fetch_failure: str | None = None  # set until close() or load_state_dict()
        self.commit_failure: str | None = None  # set until load_state_dict()

    def require_committable(self) -> None:
        if self.commit_failure is not None:
            raise LoaderCommitFailedError(
                f"{self.commit_failure}; call load_state_dict() with a saved state to recover"
            )


def shutdown(inner: Any) -> None:
    """Stop the workers of an internal torch iterator now (no-op for single-process ones)."""
    stop = getattr(inner, "_shutdown_workers", None)
    if stop is not None:
        with quiet_child_exits():  # a worker that dies in its own exit is not a failure now
            stop()


def release(inner: Any) -> None:
    """Let go of an internal iterator that is done: persistent workers stay for the next
    ``iter()`` (whose reset drops what they prefetched), others stop now."""
    if not getattr(inner, "_persistent_workers", False):
        shutdown(inner)


class ResumableIterator:
    """Iterator over a resumable loader's shared stream; see ``ResumableDataLoader``."""

    def __init__(self, stream: Stream, inner: Any, pending: deque[Pending], epoch: int = 0) -> None:
        self._stream = stream
        self._inner: Any = inner
        self._direct = _direct_route(inner)
        self._pending = pending
        self._dead: BaseException | None = None  # the error every later next() raises
        self._exhausted = False
        self.epoch = epoch  # the epoch this iterator reads (sources with epochs)
        self.delivered = 0  # batches this iterator returned
        self.boundaries = 0  # a trainer's step boundaries that recorded it (boundary_record)

    def __iter__(self) -> ResumableIterator:
        return self

    @property
    def alive(self) -> bool:
        """Still able to deliver batches (not exhausted, failed, closed or replaced)."""
        return self._dead is None and not self._exhausted

    @property
    def ended(self) -> bool:
        """Its iteration ended with a batch it delivered (not closed, failed or replaced)."""
        return self._exhausted and self._dead is None and self.delivered > 0

    def __next__(self) -> Any:
        if self._dead is not None:
            raise type(self._dead)(self._dead.detail)  # type: ignore[attr-defined]
        if self._exhausted:
            raise StopIteration
        if self._stream.commit_failure is not None:
            self._stream.require_committable()
        data = self._receive()
        try:
            batch, last = self._commit(data)
        except Exception as exc:
            # The batch is not handed out: the recorded position is now unknown.
            self._stream.commit_failure = (
                f"recording the delivered position failed: {type(exc).__name__}: {exc}"
            )
            self._kill(LoaderCommitFailedError(self._stream.commit_failure))
            raise LoaderCommitFailedError(
                f"{self._stream.commit_failure}; call load_state_dict() with a saved state to recover"
            ) from exc
        self.delivered += 1
        if last:
            # The iteration's last batch: end now instead of leaving a StopIteration
            # pending, which a consumer that stops after len(loader) batches would
            # otherwise meet as an empty next epoch.
            self._finish()
        return batch

    def _pull(self) -> Any:
        """The internal iterator's next item; its end closes the epoch, its failures kill this iterator."""
        inner = self._inner
        try:
            if type(inner) is _SingleProcessDataLoaderIter and not _profiler_enabled():
                # Its __next__ wraps _next_data (sampler, fetch, pin) in a profiler record
                # and bookkeeping that cost as much as seeding a batch; with a profiler
                # running the record is kept.
                direct = self._direct
                if direct is not None:
                    tasks, items = direct
                    return next(items) if tasks is None else items(next(tasks))
                return inner._next_data()
            return next(inner)
        except StopIteration:
            self._exhausted = True
            self._inner = self._direct = None
            self._stream.source.end_epoch(self.epoch)
            raise
        except Exception as exc:
            raise self._fail_fetch(
                self._describe_pending(f"fetching failed: {type(exc).__name__}: {exc}")
            ) from exc
        except BaseException:
            # Interrupted inside the internal iterator (KeyboardInterrupt): its queues
            # may have lost a batch, so it is not reused; the cursor is exact anyway.
            self._fail_fetch(self._describe_pending("fetching was interrupted"))
            raise

    def _receive(self) -> Any:
        """Hook: the next item that carries a batch, as the internal loader made it."""
        data = self._pull()
        if type(data) is FetchFailure:
            raise self._fail_fetch(data.describe()) from cause_of(data)
        return data

    def _commit(self, data: Any) -> tuple[Any, bool]:
        """Hook: record ``data``'s batch as delivered; the batch and whether it ends the iteration."""
        _, before, after, last = self._pending.popleft()
        self._stream.source.commit(before, after)
        return data, last

    def _finish(self) -> None:
        """The iteration is over: persistent workers stay for the next one."""
        self._exhausted = True
        inner, self._inner = self._inner, None
        self._direct = None
        self._pending.clear()
        release(inner)

    def retire(self, reason: str) -> None:
        """Replaced by a new iterator: later ``next()`` raises IteratorInvalidatedError;
        persistent workers are kept for the new one."""
        if self._dead is None:
            self._dead = IteratorInvalidatedError(reason)
        inner, self._inner = self._inner, None
        self._direct = None
        self._pending.clear()
        if inner is not None:
            release(inner)

    def invalidate(self, reason: str) -> None:
        """Stop this iterator's workers; every later ``next()`` raises IteratorInvalidatedError."""
        self._kill(IteratorInvalidatedError(reason))

    def _fail_fetch(self, detail: str) -> LoaderFetchFailedError:
        detail = (
            f"{detail}; call close() on the loader, then iter() resumes at the last delivered batch"
        )
        self._stream.fetch_failure = detail
        self._kill(LoaderFetchFailedError(detail))
        return LoaderFetchFailedError(detail)

    def _kill(self, error: BaseException) -> None:
        if self._dead is None or isinstance(error, IteratorInvalidatedError):
            self._dead = error
        inner, self._inner = self._inner, None
        self._direct = None
        self._pending.clear()
        if inner is not None:
            shutdown(inner)

    def _describe_pending(self, what: str) -> str:
        if self._pending:
            return f"{what} (batch starting at stream position {self._pending[0][0]})"
        return what


def _direct_route(inner: Any) -> tuple[Any, Any] | None:
    """What a single-process internal iterator's ``_next_data`` does, without the calls
    around it (the next index, the fetcher's ``fetch``, the identity collate of
    :func:`as_is`): ``(tasks, fetch)``, each item ``fetch(next(tasks))``, over a map-style
    fetcher; ``(None, items)``, each item ``next(items)``, over an iterable one. ``None``
    where it does more (pinned memory, batches it collates itself), so ``_next_data`` runs.
    """
    # Read with defaults that keep _next_data, should a torch release rename what is read.
    if type(inner) is not _SingleProcessDataLoaderIter or getattr(inner, "_pin_memory", True):
        return None
    fetcher = getattr(inner, "_dataset_fetcher", None)
    if (
        getattr(fetcher, "auto_collation", True)
        or getattr(fetcher, "collate_fn", None) is not as_is
    ):
        return None
    if type(fetcher) is _MapDatasetFetcher and hasattr(inner, "_sampler_iter"):
        return inner._sampler_iter, fetcher.dataset.__getitem__
    if type(fetcher) is _IterableDatasetFetcher and getattr(fetcher, "ended", True) is False:
        return None, fetcher.dataset_iter
    return None


def cause_of(failure: FetchFailure) -> BaseException:
    """The exception to chain a fetch failure's error from (rebuilt where it did not unpickle)."""
    cause = failure.exception
    if cause is None:
        return RuntimeError(
            f"{failure.summary} (the original exception could not be pickled out of the worker; "
            f"its traceback there:)\n{failure.remote_traceback}"
        )
    if failure.remote_traceback is not None and hasattr(cause, "add_note"):
        cause.add_note(f"Traceback in the worker process:\n{failure.remote_traceback}")
    return cause
