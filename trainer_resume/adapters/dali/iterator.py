"""``ResumableDALIIterator``: DALI's PyTorch iterator whose position is a pause file entry.

It iterates exactly like ``DALIGenericIterator(pipelines, output_map, **kwargs)``
over the pipelines ``pipeline_fn(**pipeline_kwargs)`` builds, and takes part in
``_resume_loaders()`` like any resumable loader: ``state_dict()`` holds DALI's
checkpoint of each pipeline (readers, random operators, the DALI iterator's counters)
after the last *delivered* batch, plus what DALI does not know (the epoch, a reset
still due); ``validate_state_dict()`` checks a state completely, DALI's reading of the
checkpoints included, changing nothing; ``load_state_dict()`` then swaps in the
pipelines rebuilt with ``checkpoint=``.

The end of an epoch: DALI's iterator says an epoch has ended only by raising
``StopIteration`` on the call after its last batch. So that a state taken after an
epoch's last batch names the next epoch (and the resumed loop does not run an empty
extra epoch), ``state_dict()`` (and :attr:`epoch`, :attr:`epoch_ended`, ``iter()`` and
``reset()``) read one batch ahead once a batch of the epoch was delivered, and keep it
for the next ``next()``. The checkpoint is taken before that read: the kept batch is
produced again after a resume. :attr:`epoch_ended` says the same to the trainer mixin,
which then lands a pause requested at that step after the loop's epoch-end work, as
for ``ResumableDataLoader``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import nvidia.dali as _dali
import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from ...checks import loader_state as keys
from ...distributed import world
from ...errors import (
    LoaderStateError,
    ResumeError,
    ResumeStateMismatchError,
    UnsupportedResumeConfigurationError,
)
from ...state import DALI_ITERATOR_FORMAT, DALIIteratorState, DALIPipelineDescription
from .pipelines import build_pipelines, check_pipeline, check_same_pipelines, describe

__all__ = ["ResumableDALIIterator"]

# Key names of DALIIteratorState (trainer_resume.state documents them).
DALI_VERSION = "dali_version"
EPOCH = "epoch"
DELIVERED = "delivered_batches"
PENDING_RESET = "pending_reset"
CHECKPOINTS = "checkpoints"
PIPELINES = "pipelines"
SETTINGS = "settings"
WORLD_SIZE = "world_size"
RANK = "rank"
_KEYS = (
    keys.FORMAT,
    DALI_VERSION,
    EPOCH,
    DELIVERED,
    PENDING_RESET,
    CHECKPOINTS,
    PIPELINES,
    SETTINGS,
    WORLD_SIZE,
    RANK,
)
_AUTO_RESET = {False: False, None: False, "no": False, True: True, "yes": True}


class ResumableDALIIterator:
    """Iterate DALI pipelines like ``DALIGenericIterator`` and resume at the first undelivered batch.

    Each pipeline is ``pipeline_fn(**pipeline_kwargs)`` (a ``@pipeline_def`` function
    and its arguments: graph arguments and ``Pipeline`` options such as ``batch_size``,
    ``device_id``, ``enable_checkpointing=True``); a restore calls it again with
    ``checkpoint=``. Batches, ``len()``, ``last_batch_policy``, ``reader_name`` and
    ``size`` are DALI's own. Each ``iter(iterator)`` after an epoch's end starts the
    next epoch (DALI's ``reset()``); :attr:`epoch` is the epoch the next pass reads,
    so an epoch loop continues with ``for epoch in range(it.epoch, epochs)``;
    :attr:`epoch_ended` lets the trainer mixin land a pause requested at an epoch's
    last batch after the loop's epoch-end work.

    Args:
        pipeline_fn: A ``@pipeline_def`` function, or one per pipeline.
        output_map: Names of the pipeline outputs, as for ``DALIGenericIterator``.
        pipeline_kwargs: Keyword arguments of ``pipeline_fn`` (a dict, or one dict per
            pipeline, e.g. ``shard_id`` / ``device_id`` per GPU).
        **iterator_kwargs: ``DALIGenericIterator``'s other arguments (``reader_name``,
            ``size``, ``last_batch_policy``, ``last_batch_padded``,
            ``prepare_first_batch``, ``auto_reset``). With ``auto_reset`` the
            ``StopIteration`` that ends an epoch starts the next one, as in DALI;
            without it, ``iter()`` or ``reset()`` does.

    Raises:
        UnsupportedResumeConfigurationError: a pipeline without
            ``enable_checkpointing=True``, or an ``fn.external_source`` whose source DALI
            cannot restore (only a callable of one argument is restored).
        TypeError, ValueError: arguments DALI or this class refuse.
    """

    def __init__(
        self,
        pipeline_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
        output_map: Sequence[str],
        *,
        pipeline_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        **iterator_kwargs: Any,
    ) -> None:
        self._factories, self._arguments = _factories(pipeline_fn, pipeline_kwargs)
        auto_reset = iterator_kwargs.pop("auto_reset", False)
        if not isinstance(auto_reset, (bool, str, type(None))) or auto_reset not in _AUTO_RESET:
            raise ValueError(f"Unsupported value for `auto_reset` {auto_reset!r}")
        self._auto_reset = _AUTO_RESET[auto_reset]
        self._output_map = list(output_map)
        self._iterator_kwargs = dict(iterator_kwargs)
        self._settings = _settings(self._output_map, self._iterator_kwargs)
        pipelines = self._checked_pipelines(None)
        self._descriptions: list[DALIPipelineDescription] = [describe(p) for p in pipelines]
        self._pipelines = pipelines
        self._dali = self._dali_iterator(pipelines, pending_reset=False)
        self._epoch = 0
        self._delivered = 0  # batches delivered in this epoch
        self._pending_reset = False  # the epoch ended; DALI's reset() is still due
        self._ended = False  # this iterator delivered the epoch's last batch; no pass since
        self._held: Any = None  # the batch read ahead, delivered by the next next()
        self._failure: BaseException | None = None  # a read-ahead failure, raised by next()
        self._snapshot: DALIIteratorState | None = None  # the state after the last delivery
        self._prepared: tuple[list[torch.Tensor], list[Any], DALIGenericIterator] | None = None

    # --- iteration ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (one more once an epoch's last batch was delivered)."""
        self._settle()
        return self._epoch

    @property
    def epoch_ended(self) -> bool:
        """True from the delivery of an epoch's last batch until the next pass starts.

        As ``ResumableDataLoader.epoch_ended``: the loop is about to run its epoch-end
        work (a per-epoch ``scheduler.step()``, validation), so the trainer mixin lands
        a pause requested at this step after that work. The next pass starts at the
        next ``iter()``, ``reset()`` or, with ``auto_reset``, the ``StopIteration`` that
        ends the epoch. False before the first batch and after :meth:`load_state_dict`.
        """
        self._settle()
        return self._ended

    @property
    def pipelines(self) -> list[Any]:
        """The DALI pipelines now iterated (rebuilt by :meth:`load_state_dict`)."""
        return list(self._pipelines)

    def __len__(self) -> int:
        return len(self._dali)

    def __iter__(self) -> ResumableDALIIterator:
        # As DALI's iterator: iter() after an epoch's end starts the next one; in the
        # middle of an epoch it continues it.
        self._settle()
        if self._pending_reset:
            self._reset_pipelines()
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._held is not None:
            batch, self._held = self._held, None
            return self._delivered_now(batch)
        if self._pending_reset:
            # The epoch's end, found by a read-ahead: the StopIteration DALI would raise
            # now (resetting first with auto_reset, as DALI does).
            if self._auto_reset:
                self._reset_pipelines()
            raise StopIteration
        try:
            batch = next(self._dali)
        except StopIteration:
            self._end_epoch()
            if self._auto_reset:
                self._reset_pipelines()
            raise
        return self._delivered_now(batch)

    def next(self) -> list[dict[str, torch.Tensor]]:
        """The next batch (as DALI's ``next()``)."""
        return self.__next__()

    def reset(self) -> None:
        """Start the next epoch once this one has ended; in the middle of an epoch, do nothing
        (DALI's iterator ignores such a reset too)."""
        self._settle()
        if self._pending_reset:
            self._reset_pipelines()
        elif self._delivered:
            warnings.warn(
                "ResumableDALIIterator.reset() in the middle of an epoch is ignored, as by DALI's "
                "iterator",
                stacklevel=2,
            )

    def _delivered_now(self, batch: Any) -> Any:
        self._delivered += 1
        self._snapshot = None
        return batch

    def _end_epoch(self) -> None:
        # The position after the epoch's last batch: the next epoch, once DALI resets.
        if self._snapshot is None:
            self._snapshot = self._take_snapshot()
        self._epoch += 1
        self._delivered = 0
        self._pending_reset = True
        self._ended = True
        self._snapshot.update({EPOCH: self._epoch, DELIVERED: 0, PENDING_RESET: True})

    def _reset_pipelines(self) -> None:
        # The snapshot keeps pending_reset=True until the next delivery: a DALI iterator
        # restored from a checkpoint reports its restored checkpoints until it delivers.
        self._dali.reset()
        self._pending_reset = False
        self._ended = False

    def _settle(self) -> None:
        """Take the snapshot of the delivered position, then read ahead to learn whether the
        epoch has ended (only once the epoch delivered a batch: an epoch's start is known)."""
        if self._snapshot is None:
            self._snapshot = self._take_snapshot()
        if self._held is not None or self._failure is not None or self._pending_reset:
            return
        if not self._delivered:
            return
        try:
            self._held = next(self._dali)
        except StopIteration:
            self._end_epoch()
        except Exception as error:  # noqa: BLE001 - the batch's own failure, raised by next()
            # A pause must not fail on a batch the loop has not asked for yet.
            self._failure = error

    def _take_snapshot(self, checkpoints: list[torch.Tensor] | None = None) -> DALIIteratorState:
        if checkpoints is None:
            checkpoints = [_as_tensor(checkpoint) for checkpoint in self._dali.checkpoints()]
        world_size, rank = world()
        return {
            keys.FORMAT: DALI_ITERATOR_FORMAT,
            DALI_VERSION: _dali.__version__,
            EPOCH: self._epoch,
            DELIVERED: self._delivered,
            PENDING_RESET: self._pending_reset,
            CHECKPOINTS: checkpoints,
            PIPELINES: self._descriptions,
            SETTINGS: self._settings,
            WORLD_SIZE: world_size,
            RANK: rank,
        }  # type: ignore[return-value]

    # --- state (public guards; the hooks below do the work) -----------------------
    # load_state_dict validates the whole state, DALI's reading of the checkpoints
    # included, before the running pipelines are replaced; an override that skipped
    # the validation could leave a half-restored iterator, so override the hooks.

    def state_dict(self) -> DALIIteratorState:
        """The position after the last delivered batch (never a batch read ahead).

        Returns:
            A :class:`~trainer_resume.state.DALIIteratorState`: the DALI checkpoints as
            uint8 tensors, the rest ints, bools, str, lists and dicts.
        """
        self._settle()
        assert self._snapshot is not None  # _settle takes it
        return self._collect_state(self._snapshot)

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely against this iterator; the running pipelines are untouched.

        The pipelines are rebuilt from the state's checkpoints here (DALI reads them),
        and kept for :meth:`load_state_dict`.

        Raises:
            LoaderStateError: the state is malformed, or DALI cannot read a checkpoint (333).
            ResumeStateMismatchError: the state was saved from other pipelines, iterator
                arguments or DALI version (330).
            UnsupportedResumeConfigurationError: the state was saved under another
                ``torch.distributed`` world size (332).
        """
        what = "DALI iterator state"
        keys.check_mapping(state, what, _KEYS)
        keys.check_format(state, what, DALI_ITERATOR_FORMAT)
        keys.check_count(state, what, EPOCH)
        delivered = keys.check_count(state, what, DELIVERED)
        if not isinstance(state[PENDING_RESET], bool):
            raise LoaderStateError(f"{what}[{PENDING_RESET!r}] must be a bool")
        if state[PENDING_RESET] and delivered:
            raise LoaderStateError(
                f"{what} has a pending reset after {delivered} delivered batches: a reset comes "
                "before the epoch's first batch"
            )
        checkpoints = state[CHECKPOINTS]
        if not isinstance(checkpoints, list) or not all(_is_bytes_tensor(c) for c in checkpoints):
            raise LoaderStateError(f"{what}[{CHECKPOINTS!r}] must be a list of 1-D uint8 tensors")
        if not isinstance(state[PIPELINES], list) or not all(
            _is_description(d) for d in state[PIPELINES]
        ):
            raise LoaderStateError(f"{what}[{PIPELINES!r}] must be a list of pipeline descriptions")
        if len(checkpoints) != len(state[PIPELINES]):
            raise LoaderStateError(
                f"{what} has {len(checkpoints)} checkpoint(s) for {len(state[PIPELINES])} pipeline(s)"
            )
        _check_world(state, what)
        _check_matches(state, what, self._descriptions, self._settings)
        self._prepare(state, what)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` completely, then continue from it with the pipelines rebuilt
        from its checkpoints (``pipeline_fn(**pipeline_kwargs, checkpoint=...)``).

        Raises:
            Same as :meth:`validate_state_dict`; when it raises, the iterator and its
            pipelines are untouched.
        """
        self.validate_state_dict(state)
        self._apply_state(state)

    def _collect_state(self, snapshot: DALIIteratorState) -> DALIIteratorState:
        """Hook: the state returned by :meth:`state_dict` (a copy of the snapshot)."""
        state = dict(snapshot)
        state[CHECKPOINTS] = list(snapshot[CHECKPOINTS])
        return state  # type: ignore[return-value]

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state (validation rebuilt its pipelines)."""
        assert self._prepared is not None
        checkpoints, pipelines, dali = self._prepared
        self._prepared = None
        self._pipelines, self._dali = pipelines, dali
        self._epoch = state[EPOCH]
        self._delivered = state[DELIVERED]
        self._pending_reset = state[PENDING_RESET]
        self._ended = False
        self._held = None
        self._failure = None
        # Until the next delivery the position is the loaded one (DALI's restored
        # iterator reports its restored checkpoints too, but not across a reset).
        self._snapshot = self._take_snapshot(checkpoints)

    # --- building -----------------------------------------------------------------

    def _checked_pipelines(self, checkpoints: Sequence[bytes] | None) -> list[Any]:
        pipelines = build_pipelines(self._factories, self._arguments, checkpoints)
        for index, (pipeline, factory) in enumerate(zip(pipelines, self._factories)):
            check_pipeline(pipeline, index, factory)
        return pipelines

    def _prepare(self, state: Mapping[str, Any], what: str) -> None:
        """Rebuild the pipelines and DALI's iterator from the state (kept for load_state_dict)."""
        self._prepared = None
        checkpoints = [c.detach().clone() for c in state[CHECKPOINTS]]
        try:
            pipelines = self._checked_pipelines([c.numpy().tobytes() for c in checkpoints])
            dali = self._dali_iterator(pipelines, pending_reset=state[PENDING_RESET])
            if state[PENDING_RESET]:
                # DALI learns that an epoch ended only from the StopIteration of the call
                # after its last batch, and resets only then: make that call again.
                next(dali)
                raise LoaderStateError(
                    f"{what} says its epoch ended, but the pipelines restored from its "
                    "checkpoints deliver another batch"
                )
        except StopIteration:
            pass
        except (ResumeError, TypeError):
            raise
        except Exception as error:
            reason = (str(error).strip().splitlines() or [""])[0]
            raise LoaderStateError(
                f"{what}: DALI could not restore the pipelines from the saved checkpoints "
                f"({type(error).__name__}: {reason})"
            ) from error
        self._prepared = (checkpoints, pipelines, dali)

    def _dali_iterator(self, pipelines: list[Any], *, pending_reset: bool) -> DALIGenericIterator:
        kwargs = dict(self._iterator_kwargs)
        if pending_reset:
            # A restored epoch end has no first batch to prepare before its reset (DALI
            # would report an empty pipeline).
            kwargs["prepare_first_batch"] = False
        return DALIGenericIterator(pipelines, self._output_map, auto_reset=False, **kwargs)


# ---------------------------------------------------------------------- helpers


def _factories(
    pipeline_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
    pipeline_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> tuple[list[Callable[..., Any]], list[dict[str, Any]]]:
    factories = list(pipeline_fn) if isinstance(pipeline_fn, (list, tuple)) else [pipeline_fn]
    if pipeline_kwargs is None:
        arguments: list[dict[str, Any]] = [{} for _ in factories]
    elif isinstance(pipeline_kwargs, Mapping):
        arguments = [dict(pipeline_kwargs) for _ in factories]
    else:
        arguments = [dict(kwargs) for kwargs in pipeline_kwargs]
    if len(factories) == 1 and len(arguments) > 1:
        factories = factories * len(arguments)
    if len(arguments) == 1 and len(factories) > 1:
        arguments = arguments * len(factories)
    if not factories or len(factories) != len(arguments):
        raise ValueError(
            f"{len(factories)} pipeline function(s) and {len(arguments)} pipeline_kwargs: give "
            "one function or one per pipeline, and one dict or one per pipeline"
        )
    if not all(callable(factory) for factory in factories):
        raise TypeError("pipeline_fn must be a @pipeline_def function (or a list of them)")
    for kwargs in arguments:
        if "checkpoint" in kwargs:
            raise ValueError(
                "pipeline_kwargs must not hold 'checkpoint': load_state_dict() restores the "
                "pipelines from the saved checkpoints"
            )
    return factories, arguments


def _settings(output_map: list[str], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The iterator arguments that decide which batches come out (plain data)."""
    policy = kwargs.get("last_batch_policy", LastBatchPolicy.FILL)
    fill = kwargs.get("fill_last_batch")
    if fill is not None:  # DALI's deprecated spelling of the policy
        policy = LastBatchPolicy.FILL if fill else LastBatchPolicy.PARTIAL
    return {
        "output_map": list(output_map),
        "reader_name": kwargs.get("reader_name"),
        "size": int(kwargs.get("size", -1)),
        "last_batch_policy": getattr(policy, "name", str(policy)),
        "last_batch_padded": bool(kwargs.get("last_batch_padded", False)),
    }


def _as_tensor(checkpoint: bytes | str) -> torch.Tensor:
    data = checkpoint.encode() if isinstance(checkpoint, str) else bytes(checkpoint)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _is_bytes_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1


def _is_description(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and keys.is_int(value.get("batch_size"))
        and isinstance(value.get("operators"), list)
        and all(
            isinstance(op, Mapping)
            and isinstance(op.get("name"), str)
            and isinstance(op.get("spec"), list)
            and all(isinstance(line, str) for line in op["spec"])
            for op in value["operators"]
        )
    )


def _check_world(state: Mapping[str, Any], what: str) -> None:
    saved_world = state[WORLD_SIZE]
    saved_rank = state[RANK]
    if not keys.is_int(saved_world) or saved_world < 1:
        raise LoaderStateError(f"{what}[{WORLD_SIZE!r}] must be an int >= 1, got {saved_world!r}")
    if not keys.is_int(saved_rank) or not 0 <= saved_rank < saved_world:
        raise LoaderStateError(f"{what}[{RANK!r}] = {saved_rank!r} is not a rank of {saved_world}")
    world_size, rank = world()
    if saved_world != world_size:
        raise UnsupportedResumeConfigurationError(
            f"{what} was saved by rank {saved_rank} of {saved_world} and this process is rank {rank} "
            f"of {world_size}: each rank's DALI readers continue their own shard (shard_id, "
            f"num_shards), which another world size would split differently; resume with "
            f"{saved_world} rank(s)"
        )
    if saved_rank != rank:
        raise ResumeStateMismatchError(
            f"{what} was saved by rank {saved_rank} and is loaded on rank {rank}: each rank "
            "restores its own pipelines' state"
        )


def _check_matches(
    state: Mapping[str, Any],
    what: str,
    descriptions: list[DALIPipelineDescription],
    settings: Mapping[str, Any],
) -> None:
    if state[DALI_VERSION] != _dali.__version__:
        raise ResumeStateMismatchError(
            f"{what} was saved with DALI {state[DALI_VERSION]!r} and this process has DALI "
            f"{_dali.__version__!r}; DALI restores the checkpoints of its own version: install that one"
        )
    saved_settings = state[SETTINGS]
    if not isinstance(saved_settings, Mapping):
        raise LoaderStateError(f"{what}[{SETTINGS!r}] must be a dict")
    for name, value in settings.items():
        if saved_settings.get(name) != value:
            raise ResumeStateMismatchError(
                f"{what} was saved by an iterator with {name}={saved_settings.get(name)!r}, this one "
                f"has {name}={value!r}; build it with the paused run's arguments"
            )
    check_same_pipelines(state[PIPELINES], descriptions, what)
