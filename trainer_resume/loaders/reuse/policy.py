"""Closed-form reuse schedule: which prepared sample serves index ``i`` in epoch ``e``.

Every index gets a phase ``i % lifetime`` that shifts its generations, so that
after epoch 0 only about ``1 / lifetime`` of the samples expire per epoch instead
of all of them every ``lifetime`` epochs. Everything is a pure function of
``(seed, lifetime, index, epoch)``: inputs do not depend on the number of workers
or their speed, and resuming needs nothing but the epoch number.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...rng import derive_seed
from .keyed_permutation import KeyedPermutation

__all__ = ["ReusePolicy", "ReuseKey"]

# Separates the shuffle keys from the sample seeds, which mix three values
# (seed, index, generation): the shuffle key mixes four, tag first.
_ORDER_TAG = 0x4F52_4445_52  # "ORDER"


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``minimum``, else raise.

    Raises:
        TypeError: ``value`` is not an int.
        ValueError: ``value`` is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class ReuseKey:
    """Identity of the prepared sample that serves ``index`` in ``epoch``.

    Attributes:
        index: dataset index.
        epoch: the epoch being served.
        generation: which preparation of this index serves the epoch; a new
            generation means a new ``seed`` and a rebuild.
        seed: the sample seed, ``derive_seed(policy.seed, index, generation)``.
        first_epoch: the first epoch this generation serves.
        use: position of ``epoch`` in the generation's ``lifetime``-epoch window,
            ``0 <= use < lifetime``; the sample is used again after this epoch
            exactly when ``use < lifetime - 1``. Generation 0 of an index with
            phase ``p`` starts at ``use == p`` (its window began before epoch 0).
    """

    index: int
    epoch: int
    generation: int
    seed: int
    first_epoch: int
    use: int


@dataclass(frozen=True)
class ReusePolicy:
    """How long a prepared sample lives and how epochs are shuffled.

    For index ``i`` and epoch ``e``: ``phase = i % lifetime``,
    ``generation = (e + phase) // lifetime``, ``use = (e + phase) % lifetime``,
    ``seed = derive_seed(seed, i, generation)`` and
    ``first_epoch = max(0, generation * lifetime - phase)``. Every sample serves
    ``lifetime`` consecutive epochs, except generation 0, which serves
    ``lifetime - phase``.

    Args:
        lifetime: number of consecutive epochs a prepared sample serves (1: every
            epoch prepares every sample anew).
        seed: base of the sample seeds and of the per-epoch shuffle.

    Raises:
        TypeError: ``lifetime`` or ``seed`` is not an int.
        ValueError: ``lifetime < 1``.
    """

    lifetime: int
    seed: int

    def __post_init__(self) -> None:
        check_int("lifetime", self.lifetime, 1)
        check_int("seed", self.seed)

    def key(self, index: int, epoch: int) -> ReuseKey:
        """Return the :class:`ReuseKey` of ``index`` in ``epoch`` (O(1)).

        Raises:
            TypeError: ``index`` or ``epoch`` is not an int.
            ValueError: ``index`` or ``epoch`` is negative.
        """
        check_int("index", index, 0)
        check_int("epoch", epoch, 0)
        lifetime = self.lifetime
        phase = index % lifetime
        generation, use = divmod(epoch + phase, lifetime)
        return ReuseKey(
            index=index,
            epoch=epoch,
            generation=generation,
            seed=derive_seed(self.seed, index, generation),
            first_epoch=max(0, generation * lifetime - phase),
            use=use,
        )

    def permutation(self, epoch: int, size: int) -> KeyedPermutation:
        """Return epoch ``epoch``'s shuffled order of ``range(size)`` as a keyed permutation.

        Raises:
            TypeError: ``epoch`` or ``size`` is not an int.
            ValueError: ``epoch < 0`` or ``size < 1``.
        """
        check_int("epoch", epoch, 0)
        check_int("size", size, 1)
        return KeyedPermutation(size, derive_seed(_ORDER_TAG, self.seed, epoch, size))

    def order(self, position: int, epoch: int, size: int) -> int:
        """Return the index at ``position`` of epoch ``epoch``'s shuffled order.

        Computed directly (a keyed Feistel permutation with cycle walking), without
        generating earlier epochs or the rest of the permutation; the cost does not
        grow with ``position`` or ``epoch``.

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``epoch < 0`` or ``size < 1``.
            IndexError: ``position`` is outside ``range(size)``.
        """
        check_int("position", position)
        return self.permutation(epoch, size)(position)
