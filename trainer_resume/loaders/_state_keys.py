"""Format markers, key names and the checks shared by every loader state (the
generic ones, also used by the adapters' loaders, come from ``checks.loader_state``).

A rejected state must name what is wrong and change nothing, so the checks here
only read; each raises :class:`~trainer_resume.errors.LoaderStateError` (or, for a
seed, :class:`~trainer_resume.errors.ResumableSamplerGeneratorError`) with the
offending key in the detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

# The checks every loader state shares with the adapters' loaders; the loader modules
# read them here.
from ..checks.loader_state import FORMAT as FORMAT
from ..checks.loader_state import SEED_LIMIT as SEED_LIMIT
from ..checks.loader_state import check_count as check_count
from ..checks.loader_state import check_format as check_format
from ..checks.loader_state import check_mapping as check_mapping
from ..errors import LoaderStateError, ResumableSamplerGeneratorError

# The format markers and the int check live with the schemas in state.py; the loader
# modules read them here.
from ..state import BATCH_SAMPLER_FORMAT as BATCH_SAMPLER_FORMAT
from ..state import EPOCH_SAMPLER_FORMAT as EPOCH_SAMPLER_FORMAT
from ..state import ITERABLE_DATASET_FORMAT as ITERABLE_DATASET_FORMAT
from ..state import LOADER_FORMAT as LOADER_FORMAT
from ..state import SAMPLER_FORMAT as SAMPLER_FORMAT
from ..state import STATEFUL_SAMPLER_FORMAT as STATEFUL_SAMPLER_FORMAT
from ..state import is_int as is_int

# Key names of the saved states (the TypedDicts in trainer_resume.state list them).
DATASET_SIZE = "dataset_size"
SEED = "seed"
CONSUMED = "consumed"
CYCLE = "cycle"
OFFSET = "offset"
SETTINGS = "settings"
SETTINGS_DIGEST = "settings_digest"
AUGMENTATION_SEED = "augmentation_seed"
AUGMENTATION_SEEDING = (
    "augmentation_seeding"  # "batch" or "sample" (absent in older states: "sample")
)
BATCH_SIZE = "batch_size"
DELIVERED_BATCHES = "delivered_batches"
SAMPLER = "sampler"
NUM_REPLICAS = "num_replicas"  # world size the state was written with (absent in older states: 1)
EPOCH = "epoch"
DELIVERED = "delivered"
GENERATOR = "generator"
# The sampler generator's state at the saved position, within an epoch begun before it
# (absent in older states, and at an epoch's start: the generator is set to "generator").
GENERATOR_NOW = "generator_now"
SAMPLER_EPOCH = "sampler_epoch"
SAMPLES = "samples"
SAMPLER_STATE = "sampler_state"
NEXT_WORKER = "next_worker"
WORKERS = "workers"
DATASET_STATE = "dataset_state"
ITERATOR_STATE = "iterator_state"
GENERATORS = "generators"
BATCHES = "batches"
ENDED = "ended"

# Formats of earlier versions that this one cannot resume, and why (said when one is loaded).
RETIRED_FORMATS = {
    "trainer_resume.iterable_dataset/1": (
        "it was saved by an earlier version, which seeded each batch of an IterableDataset "
        "instead of saving its copies' generator states, so the rest of its pass cannot be "
        "replayed here; resume it with that version, or start from a state saved by this one"
    ),
}


def draw_seed(generator: torch.Generator | None) -> int:
    """Draw one seed in ``[0, 2**63)`` from ``generator`` (torch's default CPU RNG if None)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def check_seed(state: Mapping[str, Any], what: str, key: str = SEED) -> int:
    """A sampler seed; a bad one means the sampler's RNG state is corrupted (351)."""
    value = state[key]
    if not is_int(value) or not 0 <= value < SEED_LIMIT:
        raise ResumableSamplerGeneratorError(
            f"{what}[{key!r}] = {value!r} is not a seed (an int in [0, 2**63))"
        )
    return value


def mismatched_setting(
    state: Mapping[str, Any], what: str, expected: Mapping[str, Any]
) -> tuple[str, Any, Any] | None:
    """The first of ``expected``'s settings that ``state[SETTINGS]`` lacks or holds with
    another type or value, as ``(name, saved or None, expected)``; None when all match.

    Raises:
        LoaderStateError: ``state[SETTINGS]`` is not a dict.
    """
    settings = state[SETTINGS]
    if not isinstance(settings, Mapping):
        raise LoaderStateError(f"{what}[{SETTINGS!r}] must be a dict")
    for name, value in expected.items():
        if name not in settings or type(settings[name]) is not type(value):
            return name, settings.get(name), value
        if settings[name] != value:
            return name, settings[name], value
    return None


def check_epoch_state(
    state: Any,
    what: str,
    expected_format: str,
    settings: Mapping[str, Any],
    more_keys: Iterable[str],
    fix: str,
    optional_keys: Iterable[str] = (),
) -> tuple[int, int, int]:
    """The start every per-epoch loader state shares (torch's own samplers, an
    ``IterableDataset``): a dict of ``format``, ``settings``, ``epoch``, ``offset``,
    ``delivered`` and ``more_keys`` (and any of ``optional_keys``); the format; the settings the loader was built with;
    the three counts. ``fix`` ends the refusal of another setting (``{name}`` and
    ``{saved}`` are filled in).

    Returns:
        ``(epoch, offset, delivered)``.
    """
    check_mapping(
        state, what, (FORMAT, SETTINGS, EPOCH, OFFSET, DELIVERED, *more_keys), optional_keys
    )
    check_format(state, what, expected_format)
    mismatch = mismatched_setting(state, what, settings)
    if mismatch is not None:
        name, saved, value = mismatch
        raise LoaderStateError(
            f"{what}: setting {name!r} was {saved!r}, this loader has {value!r}; "
            + fix.format(name=name, saved=saved)
        )
    return (
        check_count(state, what, EPOCH),
        check_count(state, what, OFFSET),
        check_count(state, what, DELIVERED),
    )


def check_replicas(state: Mapping[str, Any], what: str) -> int:
    """The optional ``num_replicas`` entry: an int >= 1; states written before it existed read as 1."""
    if NUM_REPLICAS not in state:
        return 1
    value = state[NUM_REPLICAS]
    if not is_int(value) or not 1 <= value < SEED_LIMIT:
        raise LoaderStateError(f"{what}[{NUM_REPLICAS!r}] must be an int >= 1, got {value!r}")
    return value
