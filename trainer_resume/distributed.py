"""Collective pause and resume for trainers running under ``torch.distributed``.

Used by :class:`~trainer_resume.mixin.TrainingResumeMixin` when a process group with
more than one rank is initialized; a single process never runs a collective.

The commit rule: one pause file, written by rank 0 through ``save_checkpoint``
(atomic: temp file, fsync, replace), holds every rank's loader, extra and RNG
state under ``"distributed"``. Either the whole pause is in that file or the
previous file is left untouched, so a pause interrupted on any rank (a rank killed
before the states were gathered, rank 0 killed while writing) is never resumed.

Resume rules (``rank_view``):

* Same world size: rank ``r`` takes rank ``r``'s states: bit-exact.
* Another world size: the loaders continue from the *global position* (every rank
  saved the same global cursor, because all ranks paused at the same completed
  step) and re-shard it over the new ranks; each rank's RNG is re-derived as
  ``derive_seed(rng_base_seed, completed_steps, rank)``; extra states must be equal
  on all saved ranks; the step count is converted so that the number of samples
  seen is kept: ``completed_steps_new = completed_steps_old * W_old // W_new``
  (per-rank batch size unchanged), and per-step LR schedulers (``last_epoch ==
  completed_steps_old``) are moved to ``completed_steps_new``. A warning says the
  run is sample-exact but not bit-comparable to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from .difference import first_difference
from .errors import (
    ERRORS_BY_CODE,
    CheckpointFormatError,
    CheckpointWriteError,
    ResumeError,
    ResumeStateMismatchError,
    WorldSizeChangeWarning,
)
from .rng import derive_seed, random_state, restore_random_state, seed_cpu_generators
from .state import (
    DDP_WINDOW_KEY,
    GRADIENTS_KEY,
    RANK_BUFFERS_KEY,
    RANK_CONFIG_KEY,
    SHARDED_WINDOW_KEY,
    DistributedPauseState,
    PauseCheckpoint,
    RandomState,
    RankConfig,
    RankPauseState,
)

__all__ = [
    "DISTRIBUTED_FORMAT",
    "DISTRIBUTED_KEY",
    "DistributedPauseState",
    "RankPauseState",
    "agree",
    "agreed",
    "agreed_pause",
    "announce_refusal",
    "any_rank",
    "any_ranks",
    "combined_pause",
    "config_of",
    "collectives_on",
    "commit",
    "current_group",
    "converted_steps",
    "exchange",
    "gather_pause",
    "is_distributed",
    "pause_path_agreed",
    "rank_view",
    "rank_zero_result",
    "world",
]

DISTRIBUTED_FORMAT = "trainer_resume.distributed/1"
DISTRIBUTED_KEY = "distributed"


# ----------------------------------------------------------------------- the group


_AVAILABLE = dist.is_available()  # fixed by the torch build


def _default_group_record() -> Any:
    """Where torch records the default process group (``distributed_c10d._world``, whose
    ``_default_pg`` is what ``dist.is_initialized()`` asks about), if this torch keeps it
    there; ``None``: ask ``dist.is_initialized()``."""
    if not _AVAILABLE:
        return None
    from torch.distributed import distributed_c10d

    record = getattr(distributed_c10d, "_world", None)
    if record is None or "_default_pg" not in getattr(record, "__dict__", {}):
        return None
    return record


_GROUP_RECORD = _default_group_record()


def is_distributed() -> bool:
    """True when a ``torch.distributed`` process group with more than one rank is initialized."""
    # Asked after every training step: where no group was made, one attribute read says so
    # (no call); where one was, torch's own answer.
    record = _GROUP_RECORD
    if record is not None and record._default_pg is None:
        return False
    return _AVAILABLE and dist.is_initialized() and dist.get_world_size() > 1


def world() -> tuple[int, int]:
    """``(world_size, rank)`` of the initialized process group, ``(1, 0)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


_THREAD = threading.local()


@contextmanager
def collectives_on(group: Any) -> Generator[None, None, None]:
    """Run this thread's collectives of this module on ``group`` (a gloo group of every rank).

    A background writer's collectives go to a group of their own, so they never
    interleave with the training thread's on the default group.
    """
    previous = getattr(_THREAD, "group", None)
    _THREAD.group = group
    try:
        yield
    finally:
        _THREAD.group = previous


def current_group() -> Any:
    """The group this thread's collectives run on (``None``: the default group)."""
    return getattr(_THREAD, "group", None)


def _device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo (and the others) take CPU tensors.
    if current_group() is None and dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """All-reduce ``flag`` with MAX: true on every rank when it is true on one."""
    return any_ranks([flag])[0]


# The work of the latest ``any_ranks``: see there.
_held_work: list[Any] = [None]


def any_ranks(flags: Sequence[bool]) -> list[bool]:
    """``any_rank`` of several flags in one collective.

    Its work is held here until the next call, which releases it on a Python thread.
    Released by the backend's own thread (gloo's run loop), a work holding a tensor
    made in Python takes the GIL there with a thread state created for the
    occasion; this runs at every step boundary, and a fork at that instant
    (a loader starting its workers for the next epoch) hangs the child on CPython
    3.11 before 3.11.8 and on 3.10 (CPython gh-112275).
    """
    value = torch.tensor([1 if flag else 0 for flag in flags], dtype=torch.int32, device=_device())
    work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=current_group(), async_op=True)
    work.wait()
    result = [bool(item) for item in value.tolist()]
    _held_work[0] = work  # the previous one is released here, by this thread
    return result


def _described(error: BaseException | str | None) -> tuple[int | None, str] | None:
    if error is None:
        return None
    if isinstance(error, ResumeError):
        return error.code, error.detail or error.message
    if isinstance(error, BaseException):
        return None, f"{type(error).__name__}: {error}"
    return None, error


def _refusal(action: str, rank: int, described: tuple[int | None, str]) -> Exception:
    # Another rank's refusal, as the same catalogue error when it was one, naming that rank.
    code, text = described
    detail = f"{action} refused on rank {rank}: {text}"
    if code in ERRORS_BY_CODE:
        return ERRORS_BY_CODE[code](detail)
    return RuntimeError(detail)


def exchange(payload: Any, action: str, error: BaseException | None = None) -> list[Any]:
    """All-gather ``payload``, or fail on every rank when any rank has an ``error``.

    Returns:
        Every rank's payload, by rank.

    Raises:
        BaseException: this rank's own ``error``; on the other ranks the same
            catalogue error (a ``ResumeError``) or a ``RuntimeError``, saying which
            rank refused and why.
    """
    entries, failed = _gathered(error, payload)
    if failed:
        if error is not None:
            raise error
        raise _refusal(action, *failed[0])
    return [entry[1] for entry in entries]


def _gathered(error: BaseException | str | None, payload: Any) -> tuple[list[Any], list[Any]]:
    # One entry shape for agree() and exchange(): a rank that failed early and agrees
    # while the others exchange still reads as a refusal, never as a payload.
    entries: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, (_described(error), payload), group=current_group())
    return entries, [(rank, entry[0]) for rank, entry in enumerate(entries) if entry[0] is not None]


def agree(local_error: BaseException | str | None, action: str) -> None:
    """Raise on every rank when any rank reports an error (so none waits in a later collective).

    Raises:
        ResumeError: another rank refused with a catalogue error: the same class,
            naming that rank (the caller raises its own error first when it has one).
        RuntimeError: another rank reported any other ``local_error``.
    """
    _, failed = _gathered(local_error, None)
    if failed:
        raise _refusal(action, *failed[0])


def announce_refusal(error: BaseException, action: str) -> None:
    """Tell the other ranks that this rank refuses ``action`` (they raise in their
    ``agree``); the caller then raises its own ``error``."""
    try:
        agree(error, action)
    except Exception:  # noqa: BLE001 - every rank failed; this one raises its own error
        pass


@contextmanager
def agreed(action: str, collective: bool = True) -> Generator[None, None, None]:
    """Run the body as a step every rank agrees on (``collective``; else it just runs).

    An error raised inside is announced to the other ranks (:func:`announce_refusal`)
    and raised here; after a body that returned, :func:`agree` raises on this rank when
    another refused. So no rank waits forever in a later collective.
    """
    try:
        yield
    except Exception as error:
        if collective:
            announce_refusal(error, action)
        raise
    if collective:
        agree(None, action)


def rank_zero_result(compute: Callable[[], Any]) -> Any:
    """Rank 0 runs ``compute``; every rank gets its result, or raises the error it raised."""
    outcome: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("ok", compute())
        except Exception as exc:  # noqa: BLE001 - raised on every rank below
            outcome[0] = ("error", exc)
    dist.broadcast_object_list(outcome, src=0, group=current_group())
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def pause_path_agreed(requested: str | None) -> str | None:
    """At a step boundary: the pause path when any rank asked for a pause, else ``None``.

    One small all-reduce per step; the paths are exchanged only when a pause is due.
    """
    return agreed_pause(requested, defer=False)[0]


def agreed_pause(requested: str | None, *, defer: bool) -> tuple[str | None, bool]:
    """At a step boundary: ``(pause path or None, deferred)``, the same on every rank.

    ``defer`` (this rank wants a pause requested now to land at a later boundary) is
    agreed in the same all-reduce as the request: when any rank asked and any rank
    defers, no rank pauses here and ``deferred`` is true everywhere, so a
    rank-dependent answer never leaves one rank pausing alone.
    """
    asked, deferring = any_ranks([requested is not None, defer])
    if not asked:
        return None, False
    if deferring:
        return None, True
    paths: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(paths, requested)
    return next(path for path in paths if path is not None), False


# ----------------------------------------------------------------------- pause


def _rng_base_seed(state: RandomState) -> int:
    # A fixed function of the saved torch CPU state: no generator is drawn from at pause.
    digest = hashlib.sha256(state["torch"].numpy().tobytes()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def gather_pause(checkpoint: PauseCheckpoint) -> PauseCheckpoint | None:
    """Collect every rank's loader, extra and RNG state; rank 0 gets the whole pause, others ``None``.

    Raises:
        RuntimeError: the ranks are not at the same completed step (on every rank).
    """
    size, rank = dist.get_world_size(), dist.get_rank()
    state: RankPauseState = {
        "loaders": checkpoint["loaders"],
        "extra": checkpoint["extra"],
        "rng": checkpoint["rng"],
    }
    if checkpoint.get(GRADIENTS_KEY) is not None:  # each rank's own, also under no_sync
        state[GRADIENTS_KEY] = checkpoint[GRADIENTS_KEY]
    if checkpoint.get(DDP_WINDOW_KEY) is not None:  # each rank's reducer marks its own
        state[DDP_WINDOW_KEY] = checkpoint[DDP_WINDOW_KEY]
    if checkpoint.get(RANK_BUFFERS_KEY) is not None:  # a sharded model's, one per rank
        state[RANK_BUFFERS_KEY] = checkpoint[RANK_BUFFERS_KEY]
    mine = (checkpoint["completed_steps"], state, config_of(checkpoint))
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, mine)
    steps = [entry[0] for entry in gathered]
    if len(set(steps)) != 1:
        raise RuntimeError(
            f"pause() needs every rank at the same completed step; the ranks are at {steps}"
        )
    if rank != 0:
        return None
    return combined_pause(
        checkpoint, [entry[1] for entry in gathered], [entry[2] for entry in gathered]
    )


def config_of(checkpoint: Mapping[str, Any]) -> RankConfig:
    """The signed config a pause checkpoint records (its rank's)."""
    return {
        "config_signature": checkpoint["config_signature"],
        "config": checkpoint.get("config"),
        "config_ignore": checkpoint.get("config_ignore", []),
    }


def combined_pause(
    checkpoint: PauseCheckpoint,
    ranks: list[RankPauseState],
    configs: Sequence[RankConfig] | None = None,
) -> PauseCheckpoint:
    """Rank 0's checkpoint with every rank's loader, extra and RNG state under ``"distributed"``.

    ``configs``: each rank's signed config. Where they differ (a value per rank, as a
    device), each goes beside its rank's state, and a resume on as many ranks checks each
    rank's config against its own; the top level holds rank 0's, as always.
    """
    if configs is not None and any(
        (config["config_signature"], config["config_ignore"])
        != (configs[0]["config_signature"], configs[0]["config_ignore"])
        for config in configs
    ):
        ranks = [{**state, RANK_CONFIG_KEY: config} for state, config in zip(ranks, configs)]  # type: ignore[typeddict-item]
    combined = checkpoint.copy()
    combined["distributed"] = {
        "format": DISTRIBUTED_FORMAT,
        "world_size": len(ranks),
        "rng_base_seed": _rng_base_seed(checkpoint["rng"]),
        "ranks": ranks,
    }
    return combined


def commit(write: Callable[[], None], path: str) -> None:
    """Rank 0 runs ``write``; every rank learns whether it succeeded (this is also the barrier).

    Raises:
        CheckpointWriteError: on every rank when rank 0's write failed.
    """
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - reported to every rank below, then re-raised here
            error = exc
    if any_rank(error is not None):
        if isinstance(error, CheckpointWriteError):
            raise error
        if error is not None:
            raise CheckpointWriteError(f"{path}: {type(error).__name__}: {error}") from error
        raise CheckpointWriteError(
            f"{path}: rank 0 could not write the pause file; nothing there was replaced"
        )


# ----------------------------------------------------------------------- resume


def converted_steps(completed_steps: int, saved_world: int, world_size: int) -> int:
    """Steps at the same number of seen samples: ``completed_steps * saved_world // world_size``."""
    return completed_steps * saved_world // world_size


def _ranks(
    checkpoint: Mapping[str, Any], location: str
) -> tuple[int, list[Mapping[str, Any]], int | None]:
    entry = checkpoint.get(DISTRIBUTED_KEY)
    if entry is None:  # a single-process pause file: one rank, the top-level states
        return 1, [checkpoint], None
    if not isinstance(entry, Mapping) or entry.get("format") != DISTRIBUTED_FORMAT:
        found = entry.get("format") if isinstance(entry, Mapping) else type(entry).__name__
        raise CheckpointFormatError(
            f"{location}: {DISTRIBUTED_KEY!r} has format {found!r}, expected {DISTRIBUTED_FORMAT!r}"
        )
    size, ranks, base = (
        entry.get("world_size"),
        entry.get("ranks"),
        entry.get("rng_base_seed"),
    )
    if not isinstance(size, int) or size < 1 or not isinstance(ranks, list) or len(ranks) != size:
        raise CheckpointFormatError(
            f"{location}: {DISTRIBUTED_KEY!r} must hold world_size >= 1 and one state per rank"
        )
    for index, state in enumerate(ranks):
        if not isinstance(state, Mapping) or not all(
            isinstance(state.get(key), dict) for key in ("loaders", "extra", "rng")
        ):
            raise CheckpointFormatError(
                f"{location}: rank {index}'s state lacks loaders, extra or rng"
            )
        if not isinstance(state.get(GRADIENTS_KEY, {}), dict):
            raise CheckpointFormatError(f"{location}: rank {index}'s gradients are not a dict")
        if not isinstance(state.get(DDP_WINDOW_KEY, {}), dict):
            raise CheckpointFormatError(f"{location}: rank {index}'s DDP window is not a dict")
        if not isinstance(state.get(RANK_BUFFERS_KEY, {}), dict):
            raise CheckpointFormatError(f"{location}: rank {index}'s buffers are not a dict")
        config = state.get(RANK_CONFIG_KEY)
        if config is not None and not (
            isinstance(config, dict) and isinstance(config.get("config_signature"), str)
        ):
            raise CheckpointFormatError(f"{location}: rank {index}'s config is malformed")
    if not isinstance(base, int):
        raise CheckpointFormatError(f"{location}: {DISTRIBUTED_KEY!r} lacks an int rng_base_seed")
    return size, ranks, base


def _derived_rng(seed: int, device: int | None) -> RandomState:
    """The RNG state a fresh rank starts from: every main-process generator seeded from ``seed``."""
    current = random_state(device)
    try:
        seed_cpu_generators(seed)
        if device is not None:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        return random_state(device)
    finally:
        restore_random_state(current, device)


def rank_view(
    checkpoint: PauseCheckpoint,
    *,
    world_size: int,
    rank: int,
    location: str,
    device: int | None,
    objects: Mapping[str, Any],
    scheduler_steps: str = "convert",
) -> PauseCheckpoint:
    """This rank's view of a pause file: a single-rank checkpoint the usual checks and restore take.

    ``scheduler_steps``: with another world size, ``"convert"`` moves the per-step LR
    schedulers to the converted step count (schedules over samples), ``"keep"`` leaves
    them at the paused step (schedules over optimizer steps).

    Changes nothing outside the returned dict (schedulers' saved states are copied
    before their step counts are converted).

    Raises:
        CheckpointFormatError: the ``"distributed"`` entry is malformed.
        ResumeStateMismatchError: the saved ranks' loader positions or extra states
            differ, so they cannot be redistributed over another world size.
    """
    saved_world, ranks, base = _ranks(checkpoint, location)
    view = checkpoint.copy()
    view.pop("distributed", None)
    if saved_world == world_size:
        mine = ranks[rank]
        view["loaders"], view["extra"], view["rng"] = (
            mine["loaders"],
            mine["extra"],
            mine["rng"],
        )
        if mine.get(RANK_CONFIG_KEY) is not None:  # checked against this rank's own
            view.update(mine[RANK_CONFIG_KEY])  # type: ignore[typeddict-item]
        _set_gradients(view, mine)
        return view
    if checkpoint.get(SHARDED_WINDOW_KEY):
        raise ResumeStateMismatchError(
            f"{location} was paused with {saved_world} rank(s) and cannot be redistributed over "
            f"{world_size}: it was paused inside a gradient-accumulation window of a sharded "
            "model (it held gradients no optimizer step had applied), which are the window's "
            f"partial sums averaged over {saved_world} rank(s); resume with {saved_world} rank(s)"
        )
    _check_redistributable(ranks, saved_world, world_size, location)
    _set_gradients(view, ranks[0])
    steps = checkpoint["completed_steps"]
    new_steps = converted_steps(steps, saved_world, world_size)
    seed_base = base if base is not None else _single_base(ranks[0]["rng"])
    view["loaders"], view["extra"] = ranks[0]["loaders"], ranks[0]["extra"]
    view["rng"] = _derived_rng(derive_seed(seed_base, steps, rank), device)
    view["completed_steps"] = new_steps
    if scheduler_steps == "keep":
        moved: list[str] = []
        kept = _per_step_schedulers(checkpoint["objects"], objects, steps)
    else:
        view["objects"], moved = _converted_schedulers(
            dict(checkpoint["objects"]), objects, steps, new_steps
        )
        kept = []
    warnings.warn(
        WorldSizeChangeWarning(
            f"{location} was paused with {saved_world} rank(s) and is resumed with {world_size}: the loaders continue "
            f"the global stream from the same position (no sample skipped; a ShardedBatchSampler completes the "
            f"rest of its epoch so that each rank gets as many batches, repeating a few samples as it does at "
            f"any epoch's end when the ranks do not divide it) and steps are converted "
            f"{steps} -> {new_steps}, but each rank's RNG is re-derived, so the run is sample-exact, not "
            f"bit-comparable to an uninterrupted one{_scheduler_note(moved, steps, new_steps)}"
            f"{_kept_note(kept, steps)}"
        ),
        stacklevel=3,
    )
    return view


def _ordered_by_world_size(state: Any) -> bool:
    # A resumable loader's epoch-sampler state (EpochSamplerSettings in state.py).
    sampler = state.get("sampler") if isinstance(state, Mapping) else None
    settings = sampler.get("settings") if isinstance(sampler, Mapping) else None
    return isinstance(settings, Mapping) and settings.get("sampler") == "DistributedSampler"


def _set_gradients(view: dict[str, Any], rank: Mapping[str, Any]) -> None:
    # A rank's gradients, its DDP window record and its sharded models' buffers, where it
    # has them.
    for key in (GRADIENTS_KEY, DDP_WINDOW_KEY, RANK_BUFFERS_KEY):
        if rank.get(key) is None:
            view.pop(key, None)
        else:
            view[key] = rank[key]


def _check_redistributable(
    ranks: list[Mapping[str, Any]], saved_world: int, world_size: int, location: str
) -> None:
    for loader, state in ranks[0]["loaders"].items():
        if _ordered_by_world_size(state):
            raise ResumeStateMismatchError(
                f"{location} was paused with {saved_world} rank(s) and cannot be resumed with "
                f"{world_size}: loader {loader!r} reads a DistributedSampler, which orders each epoch "
                f"by the number of ranks, so its position means nothing with another number; resume "
                f"with {saved_world} rank(s), or read one global stream that re-shards sample-exactly "
                "(InfiniteRandomSampler, build_batch_sampler or ShardedBatchSampler, which "
                "trainer_resume.adapters.fabric.setup_dataloaders and "
                "trainer_resume.adapters.accelerate.prepare_loader build; see docs/distributed.md)"
            )
    # What every new rank takes from rank 0 must have been the same on every saved rank.
    for name, what in (
        ("loaders", "loader positions"),
        ("extra", "extra states"),
        (GRADIENTS_KEY, "accumulated gradients"),
        (DDP_WINDOW_KEY, "DDP window records"),
    ):
        for index, other in enumerate(ranks[1:], start=1):
            difference = first_difference(other.get(name), ranks[0].get(name))
            if difference is None:
                continue
            if name in (GRADIENTS_KEY, DDP_WINDOW_KEY):
                reason = (
                    "it was paused inside a gradient-accumulation window, where each rank holds "
                    "the partial sum of its own micro-batches"
                )
            else:
                reason = f"their {what} differ (rank 0 and rank {index}, at {difference.path!r})"
            raise ResumeStateMismatchError(
                f"{location} was paused with {saved_world} rank(s) and cannot be redistributed over "
                f"{world_size}: {reason}; resume with {saved_world} rank(s)"
            )


def _single_base(state: Any) -> int:
    try:
        return _rng_base_seed(state)
    except (KeyError, TypeError, AttributeError) as exc:
        raise CheckpointFormatError(f"rng state has no torch CPU state: {exc}") from exc


def _scheduler_note(moved: list[str], steps: int, new_steps: int) -> str:
    """What the step conversion did to the per-step LR schedulers, for the warning."""
    if not moved or steps == new_steps:
        return ""
    fewer = "fewer" if new_steps > steps else "more"
    return (
        f"; the LR scheduler(s) {moved}, stepped once per step, continue from step {new_steps}, "
        f"not {steps}, as the step count does (the samples seen are kept): a schedule over a "
        f"number of optimizer steps (warmup, cosine over N steps) has {abs(new_steps - steps)} "
        f"{fewer} of its steps left than at the pause, so it ends "
        f"{'sooner' if new_steps > steps else 'later'} in samples (docs/distributed.md, Resume)"
    )


def _kept_note(kept: list[str], steps: int) -> str:
    if not kept:
        return ""
    return (
        f"; the LR scheduler(s) {kept} stay at step {steps} (scheduler_steps='keep'): their "
        "schedules continue over optimizer steps from where they paused"
    )


def _per_step_schedulers(
    states: Mapping[str, Any], objects: Mapping[str, Any], steps: int
) -> list[str]:
    """The LR schedulers stepped once per step: their saved ``last_epoch`` is the step count."""
    schedulers = torch.optim.lr_scheduler.LRScheduler
    return [
        name
        for name, obj in objects.items()
        if isinstance(obj, schedulers)
        and isinstance(states.get(name), Mapping)
        and states[name].get("last_epoch") == steps
    ]


def _converted_schedulers(
    states: dict[str, Any], objects: Mapping[str, Any], steps: int, new_steps: int
) -> tuple[dict[str, Any], list[str]]:
    """The saved states with each per-step scheduler moved to ``new_steps``, and their names."""
    moved = _per_step_schedulers(states, objects, steps)
    for name in moved:
        state = dict(states[name])  # the loaded file's dict stays as read
        state["last_epoch"] = new_steps
        if "_step_count" in state:
            state["_step_count"] = new_steps + 1
        states[name] = state
    return states, moved
