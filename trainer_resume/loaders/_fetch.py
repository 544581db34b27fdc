"""Fetching one batch with replayable augmentation, in the main process or a worker.

The loader hands its workers ``(seed base, first stream position, indices)`` tasks
instead of bare indices, and the global generators (Python ``random``, NumPy's global
generator, torch CPU) are seeded from the task, so the same stream position gives the
same augmentation in any process, with any number of workers:

* per batch: ``seed_batch(batch_seed(base, first position))`` before the batch's
  first sample; its samples and then ``collate_fn`` draw in order from it. A batch is
  always fetched whole by one process, so this is exact, at one reseed per batch; a
  sample's augmentation then depends on its place in the batch.
* per sample: sample ``i`` runs seeded by ``derive_seed(base, position)`` and
  ``collate_fn`` by the batch seed, as under ``rng_scope``, so a sample's augmentation
  depends only on its stream position (not on the batch size or the world size), at
  one reseed per sample.

A failing sample or collate is returned as a :class:`FetchFailure` (not raised) so the main process can
report the dataset index and chain the original exception, whatever the worker did.
"""

from __future__ import annotations

import functools
import pickle
import traceback
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from ..rng import derive_seed_run, derive_seeds, seed_cpu_generators, seed_deriver
from ._seeding import run_seeded

__all__ = ["BatchFetcher", "FetchFailure", "as_is", "batch_seed"]

_COLLATE_SALT = 0x636F_6C6C_6174_65  # b"collate": keeps batch seeds apart from sample seeds


def batch_seed(augmentation_seed: int, first_position: int) -> int:
    """Seed of the batch starting at ``first_position`` (per-sample seeding: of its ``collate_fn``):
    ``derive_seed(augmentation_seed, first_position, _COLLATE_SALT)``."""
    seeds = _BATCH_SEEDS.get(augmentation_seed)
    if seeds is None:
        if len(_BATCH_SEEDS) >= 64:  # a few loaders' seeds at a time
            _BATCH_SEEDS.clear()
        seeds = _BATCH_SEEDS[augmentation_seed] = _BatchSeeds(augmentation_seed)
    seed = seeds.ahead.get(first_position)
    return seed if seed is not None else seeds.miss(first_position)


_RUN = 1024  # batch seeds computed ahead at a time


class _BatchSeeds:
    """One augmentation seed's batch seeds, computed ahead (it runs once per batch, where
    the mix's arithmetic on Python ints costs more than the rest of the seeding).

    ``ahead`` maps positions to their seeds. Once three positions asked for in a row
    are evenly spaced (consecutive batches: a batch size apart, times the workers or
    ranks sharing the stream), the next ``_RUN`` positions at that distance are computed
    in one NumPy pass; any other position is computed alone. A seed is a function of
    its position only, so what was computed ahead changes nothing.
    """

    __slots__ = ("_augmentation_seed", "_derive", "_last", "_step", "ahead")

    def __init__(self, augmentation_seed: int) -> None:
        self._augmentation_seed = augmentation_seed
        self._derive = seed_deriver(augmentation_seed, _COLLATE_SALT)
        self._last: int | None = None  # the last position asked for that was not ahead
        self._step = 0  # the distance from the one before it
        self.ahead: dict[int, int] = {}

    def miss(self, position: int) -> int:
        """The seed of a position not computed ahead (and the run after it, if it is one)."""
        last, step = self._last, self._step
        self._last = position
        if last is None:
            return self._derive(position)
        self._step = position - last
        if step <= 0 or self._step != step:
            return self._derive(position)
        run = derive_seed_run(self._augmentation_seed, position, step, _RUN, _COLLATE_SALT)
        self.ahead = dict(zip(range(position, position + _RUN * step, step), run))
        self._last = position + (_RUN - 1) * step  # the run goes on at its end
        return run[0]


# augmentation seed -> its batch seeds (runs per batch)
_BATCH_SEEDS: dict[int, _BatchSeeds] = {}


def _seeded_per_sample() -> None:
    pass


def _in_worker() -> bool:
    return get_worker_info() is not None


def as_is(batch: Any) -> Any:
    """The collate function of the internal loader: batches are collated by :class:`BatchFetcher`."""
    return batch


class FetchFailure:
    """Returned instead of a batch when ``dataset[index]``, ``collate_fn`` or an iteration raised."""

    __slots__ = (
        "exception",
        "first_position",
        "index",
        "position",
        "remote_traceback",
        "stage",
        "summary",
    )

    def __init__(
        self,
        first_position: int,
        index: Any,
        position: int,
        stage: str,
        exception: BaseException,
        *,
        in_worker: bool,
    ) -> None:
        self.first_position = first_position
        self.index = index
        self.position = position
        self.stage = stage
        self.summary = f"{type(exception).__name__}: {exception}"
        self.remote_traceback: str | None = None
        self.exception: BaseException | None = exception
        if in_worker:
            # The failure crosses a process boundary: keep the exception only if it
            # survives pickling, and its formatted traceback in any case.
            self.remote_traceback = "".join(
                traceback.format_exception(type(exception), exception, exception.__traceback__)
            )
            try:
                self.exception = pickle.loads(pickle.dumps(exception))
            except Exception:
                self.exception = None

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def describe(self) -> str:
        if self.stage == "iteration":
            return f"iterating the dataset raised {self.summary} ({self.index})"
        if self.stage == "dataset":
            return (
                f"dataset[{self.index!r}] raised {self.summary} (stream position {self.position})"
            )
        return f"collate_fn raised {self.summary} on the batch starting at stream position {self.first_position}"


class BatchFetcher(Dataset):
    """The internal loader's dataset: ``fetcher[(base, first_position, indices)]`` is a collated batch.

    Attribute reads it does not define go to the wrapped dataset, so code that
    configures ``get_worker_info().dataset`` in ``worker_init_fn`` still finds the
    user's attributes; ``get_worker_info().dataset.dataset`` is the user's dataset.

    Args:
        dataset: The user's map-style dataset.
        collate_fn: The user's collate function.
        batched: Tasks carry a list of indices (``batch_size`` set) or one index
            (``batch_size=None``, where ``collate_fn`` gets the single sample).
        stride: Global-stream distance between the samples of one task (the world
            size for a sharded sampler, 1 otherwise): per-sample seeds follow global
            positions, so a sample's augmentation does not depend on the world size.
        per_sample: Seed every sample (else once per batch).
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batched: bool,
        stride: int = 1,
        *,
        per_sample: bool = False,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batched = batched
        self.stride = stride
        self.per_sample = per_sample

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks; private names are refused so that
        # unpickling (which probes for hooks before __dict__ is filled) cannot recurse.
        dataset = self.__dict__.get("dataset")
        if name.startswith("_") or dataset is None:
            raise AttributeError(name)
        return getattr(dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, task: tuple[int, int, Any]) -> Any:
        base, first_position, indices = task
        return run_seeded(
            # per sample: _fetch seeds each sample and the collate itself
            _seeded_per_sample if self.per_sample else batch_seed(base, first_position),
            functools.partial(self._fetch, base, first_position, indices),
        )

    def _fetch(self, base: int, first_position: int, indices: Any) -> Any:
        dataset = self.dataset
        batch = indices if self.batched else (indices,)
        stride = self.stride
        if not self.per_sample and self.batched and hasattr(dataset, "__getitems__"):
            try:
                samples = dataset.__getitems__(list(batch))
            except Exception as exc:
                return FetchFailure(
                    first_position, batch, first_position, "dataset", exc, in_worker=_in_worker()
                )
        elif self.per_sample:
            samples = []
            seeds = derive_seeds(base, first_position, len(batch), stride=stride)
            for offset, index in enumerate(batch):
                seed_cpu_generators(seeds[offset])
                try:
                    samples.append(dataset[index])
                except Exception as exc:
                    position = first_position + offset * stride
                    return FetchFailure(
                        first_position, index, position, "dataset", exc, in_worker=_in_worker()
                    )
            seed_cpu_generators(batch_seed(base, first_position))
        else:
            samples = []
            append = samples.append
            try:
                for index in batch:  # as torch's fetcher, a list of dataset[index]
                    append(dataset[index])
            except Exception as exc:
                offset = len(samples)
                position = first_position + offset * stride
                return FetchFailure(
                    first_position, batch[offset], position, "dataset", exc, in_worker=_in_worker()
                )
        try:
            return self.collate_fn(samples if self.batched else samples[0])
        except Exception as exc:
            return FetchFailure(
                first_position, None, first_position, "collate", exc, in_worker=_in_worker()
            )
