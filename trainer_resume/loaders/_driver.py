"""The interface between a resumable loader and the driver of a streaming library's dataset.

A driver turns the samples each worker delivered in a pass into the library's own
state (in the main process, where the library's ``state_dict()`` runs) and opens each
copy of the dataset from it (in the copy's process, before its ``iter()``); see
``_streaming`` for which datasets have one.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Starts", "StreamingDriver"]


class Starts:
    """Where the copies of a driven dataset start a pass.

    Args:
        states: Per worker, the library state its copy loads before ``iter()`` (``None``:
            as the pass starts, or a library state already shared with every copy).
        rotation: ``None`` where each worker resumes its own part of the pass (the loader
            keeps the round-robin's turn); else the library deals the rest of the pass
            out again from worker 0, so worker ``w`` reads what worker ``(rotation + w) %
            workers`` would have read next, and carries on from that worker's record.
        done: Per worker, its part of the pass is over although it was not seen to end
            (it delivered its whole share in whole batches): it is not opened again.
    """

    __slots__ = ("done", "rotation", "states")

    def __init__(
        self, states: list[Any], rotation: int | None = None, done: list[bool] | None = None
    ) -> None:
        self.states = states
        self.rotation = rotation
        self.done = done if done is not None else [False] * len(states)


class StreamingDriver(Protocol):
    """Puts the copies of one library's streaming dataset at the positions a loader recorded."""

    library: str

    def configure(self, dataset: Any, batch_size: int | None, num_workers: int) -> None:
        """At the loader's construction: give the dataset the loader's settings, as the
        library's own loader does (the split over workers may follow them)."""
        ...

    def starts(
        self, dataset: Any, epoch: int, samples: list[int], ended: list[bool], turn: int
    ) -> Starts:
        """In the main process, as pass ``epoch`` (0-based) starts, given the samples each
        worker delivered in it, whether its part ended, and the worker whose batch is due."""
        ...

    def open(self, copy: Any, epoch: int, state: Any) -> None:
        """In the copy's process, before its ``iter()``: read pass ``epoch`` from ``state``
        (a value :meth:`starts` returned, or ``None`` for the pass's start)."""
        ...
