"""The base of every batch sampler that ``build_batch_sampler`` makes.

A target only says how one cycle is ordered (``_order``); this base cuts the order
into batches, walks cycles, keeps the delivered cursor and checks saved states.
Each cycle has the same number of samples, so a cursor ``(cycle, offset)`` maps to
``consumed`` in closed form, and a cycle's batches are regenerated from
``(seed, cycle)`` whenever they are needed: they are never part of the state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sized
from typing import Any, ClassVar

import torch
from torch.utils.data import Sampler

from ..errors import (
    LoaderStateError,
    ResumableBatchConfigurationError,
)
from ..state import BatchSamplerSettings, BatchSamplerState
from . import _state_keys as keys
from ._cursor import ResumableCursor
from ._cycles import cycle_generator
from ._sharding import resolve_replicas

__all__ = ["Batch", "ResumableBatchSampler"]

# (cursor cycle, cursor offset in batches, first stream position, indices); the cursor is
# the global one this rank's batch is read from (the batch itself is ``rank`` further).
Batch = tuple[int, int, int, list[int]]

_READABLE_SETTINGS = (
    "target",
    "batch_size",
    "shuffle",
    "drop_last",
    "dataset_size",
    "cycle_samples",
)


def _require_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")
    return value


class ResumableBatchSampler(ResumableCursor[BatchSamplerState], Sampler[list[int]]):
    """Batches cut from an endless stream of cycles; built by :func:`build_batch_sampler`.

    Each cycle is an order of ``cycle_samples`` indices fixed by ``(seed, cycle)``
    (the seed is drawn once from ``generator``), cut into batches of
    ``batch_size``; the last batch of a cycle is partial unless ``drop_last``
    (which drops the remainder of every cycle instead). With ``repeat=False`` an
    iteration ends after one cycle and the next ``iter()`` starts the next cycle;
    with ``repeat=True`` it continues forever.

    Plain (``resumable=False``): each ``iter()`` starts at the first cycle no
    iteration has started yet. Resumable: each ``iter()`` starts at the cursor of
    delivered batches, moved only by :meth:`advance` / :meth:`advance_batch` or by a
    :class:`~trainer_resume.loaders.ResumableDataLoader`. ``repeat`` changes where
    iterations end, not the stream, so it is not part of the settings digest.

    Batches handed out are new lists. The order of the cycle being read is held by
    the iterator reading it and freed when it moves on; nothing per cycle is kept
    on the sampler.

    Sharding (``num_replicas = W``, ``rank = r``; defaults from an initialized
    ``torch.distributed`` process group, else 1 and 0): the global stream is cut
    into batches and rank ``r`` takes whole global batches ``G + r, G + r + W, ...``
    from the global cursor ``G`` (in batches). Delivering one batch moves a rank's
    cursor by ``W`` batches, so ranks at the same step hold the same cursor and a
    state resumes with any world size. With ``repeat=False`` every rank must get the
    same number of batches per cycle: the batches per cycle must be divisible by
    ``W`` (checked at construction), and so must the batches left in the cycle of a
    loaded state (checked on load). Every rank must draw the same seed.
    """

    target: ClassVar[str] = ""

    def __init__(
        self,
        dataset: Sized,
        batch_size: int,
        *,
        repeat: bool,
        shuffle: bool,
        drop_last: bool,
        resumable: bool = False,
        generator: torch.Generator | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        **options: Any,
    ) -> None:
        self.num_replicas, self.rank = resolve_replicas(num_replicas, rank)
        if not keys.is_int(batch_size):
            raise TypeError(
                f"batch_size must be an int, got {type(batch_size).__name__}: {batch_size!r}"
            )
        self.repeat = _require_bool("repeat", repeat)
        self.shuffle = _require_bool("shuffle", shuffle)
        self.drop_last = _require_bool("drop_last", drop_last)
        self.resumable = _require_bool("resumable", resumable)
        if batch_size < 1:
            raise ResumableBatchConfigurationError(
                f"batch_size must be at least 1, got {batch_size}"
            )
        size = len(dataset)
        if size < 1:
            raise ResumableBatchConfigurationError(
                f"{self.target!r} batch sampler got an empty dataset"
            )
        self.batch_size = batch_size
        self._dataset_size = size
        self._configure(dataset, dict(options))
        raw = self._raw_cycle_samples()
        samples = raw - raw % batch_size if drop_last else raw
        if samples < 1:
            raise ResumableBatchConfigurationError(
                f"{self.target!r} with batch_size={batch_size}, drop_last={drop_last} yields no batch "
                f"({raw} sample(s) per cycle)"
            )
        self._raw_samples = raw
        self._cycle_samples = samples
        self._batches_per_cycle = -(-samples // batch_size)
        if not repeat and self._batches_per_cycle % self.num_replicas:
            raise ResumableBatchConfigurationError(
                f"repeat=False with num_replicas={self.num_replicas}: a cycle has {self._batches_per_cycle} "
                f"batches, which the ranks cannot share evenly (their iterations would end after different "
                f"numbers of batches); use repeat=True or a batch size / world size that divides the cycle"
            )
        self._settings: BatchSamplerSettings = {
            "target": self.target,
            "batch_size": batch_size,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "dataset_size": size,
            "cycle_samples": samples,
        }
        self._digest = self._compute_digest()
        self._seed = keys.draw_seed(generator)
        self._cycle = 0  # resumable cursor: next undelivered batch is (cycle, offset)
        self._offset = 0
        self._next_cycle = 0  # plain mode: the first cycle no iteration has started

    # --- target hooks -------------------------------------------------------------

    def _configure(self, dataset: Sized, options: dict[str, Any]) -> None:
        """Hook: take the target's options (raise TypeError on unknown ones)."""
        if options:
            raise TypeError(f"{self.target!r} takes no option(s) {sorted(options)}")

    def _raw_cycle_samples(self) -> int:
        """Hook: samples in one cycle before ``drop_last``."""
        raise NotImplementedError

    def _order(self, cycle: int, generator: torch.Generator) -> torch.Tensor:
        """Hook: the indices of ``cycle`` in order, drawing randomness from ``generator`` only."""
        raise NotImplementedError

    def _digest_parts(self) -> list[bytes]:
        """Hook: bytes that fix the target's options (labels, groups, counts)."""
        return []

    # --- the stream ----------------------------------------------------------------

    @property
    def dataset_size(self) -> int:
        return self._dataset_size

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def cycle_samples(self) -> int:
        """Samples per cycle after ``drop_last``."""
        return self._cycle_samples

    @property
    def batches_per_cycle(self) -> int:
        return self._batches_per_cycle

    @property
    def settings_digest(self) -> str:
        return self._digest

    @property
    def cursor(self) -> tuple[int, int]:
        """``(cycle, offset in batches)`` of the next undelivered batch (resumable mode)."""
        return self._cycle, self._offset

    def consumed_at(self, cycle: int, offset: int) -> int:
        """Stream position of the first sample of batch ``offset`` of ``cycle``."""
        return cycle * self._cycle_samples + offset * self.batch_size

    def __len__(self) -> int:
        if self.repeat:
            raise TypeError(f"a {type(self).__name__} with repeat=True is endless and has no len()")
        return (
            self._batches_per_cycle // self.num_replicas
        )  # this rank's share (divisible: checked at construction)

    def __iter__(self) -> Iterator[list[int]]:
        if self.resumable:
            start = self._cycle, self._offset
        else:
            start = self._next_cycle, 0
        return (batch for _, _, _, batch in self.batches_from(*start))

    def batches_from(self, cycle: int, offset: int) -> Iterator[Batch]:
        """Walk this rank's batches from global cursor ``(cycle, offset)``; ends after that cycle unless ``repeat``."""
        seed, size, samples = self._seed, self.batch_size, self._cycle_samples
        count, repeat, plain = self._batches_per_cycle, self.repeat, not self.resumable
        stride, rank = self.num_replicas, self.rank
        first_cycle, held, order = cycle, -1, None
        cursor = cycle * count + offset  # global batch index of the cursor
        while True:
            batch_cycle, batch = divmod(cursor + rank, count)
            if not repeat and batch_cycle != first_cycle:
                return
            if batch_cycle != held:
                if plain:
                    self._next_cycle = max(self._next_cycle, batch_cycle + 1)
                order = None  # only the cycle being read is held
                order, held = self._cycle_order(seed, batch_cycle), batch_cycle
            low = batch * size
            yield (
                *divmod(cursor, count),
                batch_cycle * samples + low,
                order[low : low + size].tolist(),
            )
            cursor += stride

    def _cycle_order(self, seed: int, cycle: int) -> torch.Tensor:
        order = self._order(cycle, cycle_generator(seed, cycle))
        if order.dtype != torch.int64 or order.shape != (self._raw_samples,):
            raise RuntimeError(
                f"{type(self).__name__}._order returned {tuple(order.shape)} {order.dtype}, "
                f"expected ({self._raw_samples},) int64"
            )
        return order[: self._cycle_samples]

    def next_cursor(self, cycle: int, offset: int) -> tuple[int, int]:
        """The global cursor after this rank delivers the batch read from cursor ``(cycle, offset)``."""
        return divmod(
            cycle * self._batches_per_cycle + offset + self.num_replicas, self._batches_per_cycle
        )

    # --- state: ResumableCursor's guards call the hooks below -------------------

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely against this sampler's settings; changes nothing.

        Raises:
            ResumableModeRequiredError: built with ``resumable=False``.
            LoaderStateError: wrong format, settings, types, ranges, or cycle/offset/
                consumed that do not agree.
            ResumableSamplerGeneratorError: the seed is not an int in ``[0, 2**63)``.
        """
        self._require_resumable("validate_state_dict")
        what = "batch sampler state"
        keys.check_mapping(
            state,
            what,
            (keys.FORMAT, keys.SETTINGS_DIGEST, keys.SEED, keys.CYCLE, keys.OFFSET, keys.CONSUMED),
            (keys.SETTINGS, keys.NUM_REPLICAS),
        )
        keys.check_format(state, what, keys.BATCH_SAMPLER_FORMAT)
        keys.check_replicas(state, what)
        self._check_settings(state, what)
        keys.check_seed(state, what)
        cycle = keys.check_count(state, what, keys.CYCLE)
        offset = keys.check_count(state, what, keys.OFFSET)
        consumed = keys.check_count(state, what, keys.CONSUMED)
        if offset >= self._batches_per_cycle:
            raise LoaderStateError(
                f"{what}[{keys.OFFSET!r}] = {offset} but a cycle has {self._batches_per_cycle} batches"
            )
        if not self.repeat and (self._batches_per_cycle - offset) % self.num_replicas:
            raise LoaderStateError(
                f"{what}: {self._batches_per_cycle - offset} batch(es) are left in cycle {cycle}, which "
                f"{self.num_replicas} ranks with repeat=False cannot share evenly; resume with a world size "
                f"that divides it, or with repeat=True"
            )
        expected = self.consumed_at(cycle, offset)
        if consumed != expected:
            raise LoaderStateError(
                f"{what}: consumed {consumed} != cycle*cycle_samples+offset*batch_size = "
                f"{cycle}*{self._cycle_samples}+{offset}*{self.batch_size} = {expected}"
            )

    def advance_batch(self) -> None:
        """Record one more batch (whatever its size) as delivered."""
        self.advance(1)

    def _state(self) -> BatchSamplerState:
        """Hook: the cursor as a :class:`BatchSamplerState`."""
        return {
            keys.FORMAT: keys.BATCH_SAMPLER_FORMAT,
            keys.SETTINGS_DIGEST: self._digest,
            keys.SETTINGS: dict(self._settings),
            keys.SEED: self._seed,
            keys.CYCLE: self._cycle,
            keys.OFFSET: self._offset,
            keys.CONSUMED: self.consumed_at(self._cycle, self._offset),
            keys.NUM_REPLICAS: self.num_replicas,
        }  # type: ignore[return-value]

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state."""
        self._seed = state[keys.SEED]
        self._commit(state[keys.CYCLE], state[keys.OFFSET])

    def _advance(self, count: int) -> None:
        """Hook: ``count`` more batches delivered by this rank."""
        moved = count * self.num_replicas
        cycle, offset = divmod(
            self._cycle * self._batches_per_cycle + self._offset + moved, self._batches_per_cycle
        )
        self.commit(cycle, offset)

    def _samples_at(self, cycle: int, offset: int) -> int:  # type: ignore[override]
        """Hook: global samples delivered at ``(cycle, offset)``."""
        return self.consumed_at(cycle, offset)

    def _commit(self, cycle: int, offset: int) -> None:  # type: ignore[override]
        """Hook: set the delivered cursor."""
        self._cycle, self._offset = cycle, offset

    def _check_settings(self, state: Mapping[str, Any], what: str) -> None:
        settings = state.get(keys.SETTINGS)
        if settings is not None:
            if not isinstance(settings, Mapping):
                raise LoaderStateError(f"{what}[{keys.SETTINGS!r}] must be a dict")
            for name in _READABLE_SETTINGS:
                if name in settings and settings[name] != self._settings[name]:  # type: ignore[literal-required]
                    raise LoaderStateError(
                        f"{what}: setting {name!r} was {settings[name]!r}, this sampler has "
                        f"{self._settings[name]!r}"  # type: ignore[literal-required]
                    )
        if state[keys.SETTINGS_DIGEST] != self._digest:
            raise LoaderStateError(
                f"{what}[{keys.SETTINGS_DIGEST!r}] differs from this sampler's: the target's options "
                f"(labels, groups or ratios) or other settings changed"
            )

    def _compute_digest(self) -> str:
        digest = hashlib.sha256()
        parts = [repr(self._settings[name]).encode() for name in _READABLE_SETTINGS]  # type: ignore[literal-required]
        for part in parts + self._digest_parts():
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.hexdigest()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={self.batch_size}, dataset_size={self._dataset_size}, "
            f"cycle_samples={self._cycle_samples}, repeat={self.repeat}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, resumable={self.resumable}"
            + (
                f", num_replicas={self.num_replicas}, rank={self.rank})"
                if self.num_replicas > 1
                else ")"
            )
        )
