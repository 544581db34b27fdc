"""CPU snapshots of nested state and the schemas of everything trainer-resume saves.

Every saved state is plain data (tensors, ints, floats, bools, str, None, lists,
tuples, dicts) so ``torch.load(weights_only=True)`` reads it. The TypedDicts below
document the keys so an editor shows what a checkpoint holds. Also here, for every
module: ``is_int`` (the check of a saved integer) and ``StrPath`` (a path argument).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch

if TYPE_CHECKING:  # typing.NotRequired needs Python 3.11; annotations are not evaluated
    from typing_extensions import NotRequired

__all__ = [
    "Deferred",
    "built",
    "cpu_state",
    "deferred_revision",
    "now",
    "revise_deferred",
    "map_tensors",
    "PythonRandomState",
    "NumpyRandomState",
    "RandomState",
    "SamplerState",
    "BatchSamplerState",
    "EpochSamplerSettings",
    "EpochSamplerState",
    "StatefulSamplerState",
    "IterableDatasetSettings",
    "IterableWorkerState",
    "IterableDatasetState",
    "LoaderState",
    "RankPauseState",
    "DistributedPauseState",
    "ModuleModes",
    "PauseCheckpoint",
    "SampleRecord",
    "LightningPauseState",
    "AcceleratorStepSettings",
    "AcceleratorStepState",
    "FinishedMarker",
    "PAUSE_FORMAT",
    "GRADIENTS_KEY",
    "DDP_WINDOW_KEY",
    "DDPWindowState",
    "SHARDED_WINDOW_KEY",
    "RANK_CONFIG_KEY",
    "RankConfig",
    "SAMPLER_FORMAT",
    "BATCH_SAMPLER_FORMAT",
    "EPOCH_SAMPLER_FORMAT",
    "LOADER_FORMAT",
    "STATEFUL_SAMPLER_FORMAT",
    "ITERABLE_DATASET_FORMAT",
    "DALI_ITERATOR_FORMAT",
    "DALIPipelineDescription",
    "DALIIteratorState",
    "SHARDED_FORMAT",
    "ShardedFileEntry",
    "ShardedManifest",
]

PAUSE_FORMAT = "trainer_resume.pause/1"
# The pause-file entry of the gradients carried between steps (see mixin/_gradients.py).
GRADIENTS_KEY = "gradients"
# The pause-file entry of DistributedDataParallel's open accumulation windows (see
# mixin/_ddp_window.py).
DDP_WINDOW_KEY = "ddp_window"
# The pause-file entry of each rank's own buffers of its sharded models (see
# sharded/buffers.py).
RANK_BUFFERS_KEY = "rank_buffers"
# The pause-file entry saying a sharded model's gradients were an open accumulation
# window's partial sums (see mixin/_sharded_window.py).
SHARDED_WINDOW_KEY = "sharded_window"
# A rank's own signed config, beside its state, where the ranks' configs differ (a value
# per rank, as a device); see distributed.combined_pause.
RANK_CONFIG_KEY = "signed_config"
SHARDED_FORMAT = "trainer_resume.sharded/1"
# The "format" entries of the loader states below.
SAMPLER_FORMAT = "trainer_resume.sampler/1"
BATCH_SAMPLER_FORMAT = "trainer_resume.batch_sampler/1"
EPOCH_SAMPLER_FORMAT = "trainer_resume.epoch_sampler/1"
LOADER_FORMAT = "trainer_resume.loader/1"
STATEFUL_SAMPLER_FORMAT = "trainer_resume.stateful_sampler/1"
ITERABLE_DATASET_FORMAT = "trainer_resume.iterable_dataset/2"
DALI_ITERATOR_FORMAT = "trainer_resume.dali_iterator/1"


# What every path argument of the package accepts (``os.fspath`` reads it).
StrPath = str | os.PathLike[str]


# A state recorded now and built later: ``(build, *arguments)``, built by
# ``build(*arguments)`` (:func:`built`); a function alone is ``(function,)``. A trainer
# records one per loader after every step, where a tuple costs a fraction of a closure
# or a ``functools.partial``.
Deferred = tuple[Any, ...]


def built(deferred: Deferred) -> Any:
    """The state ``deferred`` describes: its function called with its arguments."""
    return deferred[0](*deferred[1:])


def deferred_revision() -> int:
    """A count, for the process, of the times a recorded :data:`Deferred` came to build
    another state (:func:`revise_deferred`): states built at an earlier count may be stale."""
    return _REVISION[0]


def revise_deferred() -> None:
    """Record that a recorded :data:`Deferred` now builds another state than before (a
    loader's epoch left part-way: the next epoch's start, not the middle of the epoch)."""
    _REVISION[0] += 1


_REVISION = [0]  # a list: plain stores from any thread, no global statement


def now(state: Any) -> Deferred:
    """``state``, taken now, as a :data:`Deferred` that builds it as it is."""
    return (_itself, state)


def _itself(value: Any) -> Any:
    return value


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``: what a saved count, seed or position is."""
    return isinstance(value, int) and not isinstance(value, bool)


def cpu_state(value: Any) -> Any:
    """Return an independent CPU copy of nested tensor state.

    Tensors are detached and copied to CPU (also when already on CPU), so later
    in-place changes to the source never reach the copy. ``dict``, ``OrderedDict``
    (with its ``_metadata``, which ``Module.load_state_dict`` uses for version
    handling), ``list``, ``tuple`` and named tuples are rebuilt; other values (str,
    numbers, None, ...) are returned as they are. Tensors that are the same view of
    the same storage (tied weights: ``state_dict()`` returns a separate tensor object
    for each name) become one shared tensor in the copy, as ``torch.save`` would
    keep them.

    Args:
        value: A state dict or any nesting of the containers above.

    Returns:
        The copy, with the same container types and key order.
    """
    return map_tensors(value, _independent_cpu_copy, {})


def _alias_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        pointer = 0
    if (
        pointer == 0
    ):  # no storage to alias (empty or storage-less): only the same object is the same tensor
        return ("object", id(tensor))
    return (
        tensor.device,
        pointer,
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def map_tensors(
    value: Any,
    convert: Callable[[torch.Tensor], torch.Tensor],
    memo: dict[Any, tuple[torch.Tensor, torch.Tensor]],
) -> Any:
    """Rebuild nested state with ``convert`` applied to every tensor.

    ``dict``, ``OrderedDict`` (with its ``_metadata``), ``list``, ``tuple`` and named
    tuples are rebuilt with the same types and key order; other values are returned
    as they are. ``memo`` maps views of the same storage to one converted tensor, so
    aliases (tied weights, shared entries) stay aliases; pass the same ``memo`` to
    several calls to keep them shared across calls. The memo keeps each source
    tensor alive, so a freed tensor's address can never be taken for an alias.
    """
    if isinstance(value, torch.Tensor):
        key = _alias_key(value)
        entry = memo.get(key)
        if entry is None:
            entry = memo[key] = (value, convert(value))
        return entry[1]
    if isinstance(value, OrderedDict):
        result: Any = OrderedDict(
            (key, map_tensors(item, convert, memo)) for key, item in value.items()
        )
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            result._metadata = map_tensors(metadata, convert, memo)
        return result
    if isinstance(value, dict):
        return {key: map_tensors(item, convert, memo) for key, item in value.items()}
    if isinstance(value, list):
        return [map_tensors(item, convert, memo) for item in value]
    if isinstance(value, tuple):
        items = [map_tensors(item, convert, memo) for item in value]
        return type(value)._make(items) if hasattr(value, "_fields") else tuple(items)
    return value


def _independent_cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


class PythonRandomState(TypedDict):
    version: int
    internal: torch.Tensor  # int64, 625 values (Mersenne Twister words + position)
    gauss_next: float | None


class NumpyRandomState(TypedDict):
    kind: str
    keys: torch.Tensor  # int64, 624 values
    pos: int
    has_gauss: int
    cached_gaussian: float


class RandomState(TypedDict):
    format: str
    python: PythonRandomState
    numpy: NumpyRandomState
    torch: torch.Tensor  # uint8, torch.get_rng_state()
    cuda: torch.Tensor | None  # uint8, torch.cuda.get_rng_state(cuda_device)
    cuda_device: int | None


class SamplerState(TypedDict):
    """State of a resumable :class:`~trainer_resume.loaders.InfiniteRandomSampler`.

    Cycle ``c`` of the stream is the permutation keyed by ``derive_seed(seed, c)``;
    the cursor counts delivered samples and satisfies
    ``consumed == cycle * dataset_size + offset`` with ``0 <= offset < dataset_size``.
    """

    format: str  # "trainer_resume.sampler/1"
    dataset_size: int
    seed: int  # in [0, 2**63)
    consumed: int  # samples delivered since the start of the stream
    cycle: int  # consumed // dataset_size
    offset: int  # consumed % dataset_size


class BatchSamplerSettings(TypedDict):
    """Readable copy of the settings a batch sampler's ``settings_digest`` covers."""

    target: str  # "naive", "class_balance" or "balance"
    batch_size: int
    shuffle: bool
    drop_last: bool
    dataset_size: int
    cycle_samples: int  # samples per cycle after drop_last


class _BatchSamplerStateOptional(TypedDict, total=False):
    settings: BatchSamplerSettings  # readable; absent from states that only carry the digest


class BatchSamplerState(_BatchSamplerStateOptional):
    """State of a resumable batch sampler from ``build_batch_sampler``.

    The cycle's batches are regenerated from ``(seed, cycle)``; they are not stored.
    ``consumed == cycle * cycle_samples + offset * batch_size`` and ``offset`` is
    below the number of batches per cycle.
    """

    format: str  # "trainer_resume.batch_sampler/1"
    settings_digest: (
        str  # sha256 of target, batch size, shuffle, drop_last, sizes, labels/groups/counts
    )
    seed: int  # in [0, 2**63)
    cycle: int
    offset: int  # batches delivered within ``cycle``
    consumed: int  # samples delivered since the start of the stream


class EpochSamplerSettings(TypedDict):
    """Settings of a torch sampler read one epoch per ``iter(loader)``; a state loads only
    into a loader with the same ones."""

    sampler: str  # the sampler's class name, e.g. "RandomSampler"
    batch_sampler: str | None  # "BatchSampler" or "ShardedBatchSampler"; None with batch_size=None
    batch_size: int | None
    drop_last: bool
    dataset_size: int
    sampler_length: int  # len(sampler): indices per epoch
    replacement: bool
    num_replicas: int  # DistributedSampler's world size, else 1
    generator: bool  # the sampler has a generator of its own


class EpochSamplerState(TypedDict):
    """Position of a loader over a torch sampler: batch ``offset`` of epoch ``epoch``.

    ``0 <= offset < batches per epoch``: after the last batch of an epoch the position
    is ``(epoch + 1, 0)``. The epoch's order is recomputed from ``generator`` (the
    sampler generator's state at the start of the epoch), ``sampler_epoch`` or, for a
    random sampler without a generator, the loader's ``augmentation_seed``.
    """

    format: str  # "trainer_resume.epoch_sampler/1"
    settings: EpochSamplerSettings
    epoch: int  # epochs begun before the current one (each iter(loader) is one)
    offset: int  # batches delivered within ``epoch`` (global batches under a ShardedBatchSampler)
    delivered: int  # batches delivered since the start, over all epochs (global ones too)
    generator: torch.Tensor | None  # uint8 generator state, None without a generator
    sampler_epoch: int | None  # DistributedSampler.epoch the epoch was ordered with
    # The generator's state at the position, within an epoch begun before it: the
    # generator is set to it and the epoch's order recomputed on a copy, so draws made
    # from it since the epoch began (another loader's, the loop's) are kept.
    generator_now: NotRequired[torch.Tensor]


class StatefulSamplerState(TypedDict):
    """Position of a loader over a sampler with its own ``state_dict()`` (torchdata's
    ``Stateful`` protocol): the sampler's state after the last delivered batch."""

    format: str  # "trainer_resume.stateful_sampler/1"
    epoch: int  # passes over the sampler ended before the current one
    offset: int  # batches delivered within the current pass
    samples: int  # samples in those batches (seeds follow sample positions)
    delivered: int  # batches delivered since the start
    sampler_state: Any  # the sampler's state_dict() after the last delivered batch


class _StreamingSetting(TypedDict, total=False):
    # Only over a streaming dataset its library's state API positions (litdata's or
    # MosaicML's): the library's name ("litdata", "mosaicml").
    streaming: str


class IterableDatasetSettings(_StreamingSetting):
    """Settings of a loader over an ``IterableDataset``; a state loads only into a loader
    with the same ones. Over a streaming dataset that a driver positions (``streaming``),
    a worker's ``dataset_state`` is ``{"samples": n}``, the samples it delivered in the
    pass, and its ``iterator_state`` is None."""

    num_workers: int
    persistent_workers: bool
    drop_last: bool


class IterableWorkerState(TypedDict):
    """What was delivered from one worker's copy of an ``IterableDataset`` (the only
    copy with 0 workers) in the current pass."""

    # dataset.state_dict() after the worker's last delivered batch, or after its part of
    # the pass ended; None: the dataset has no state_dict(), or (non-persistent workers)
    # the copy comes fresh from the main-process dataset as the pass starts.
    dataset_state: Any
    # The pass iterator's state_dict() after that batch; None before the worker's first
    # batch of the pass (a new iter(dataset) starts it) or when the iterator has none.
    iterator_state: Any
    # The copy's global generators (Python, NumPy, torch CPU; no CUDA) after that batch,
    # which its next batch reads on from; None where the pass's seed starts them (no batch
    # of the pass delivered yet, or its part of the pass has ended).
    generators: RandomState | None
    batches: int  # batches delivered from this worker in the current pass
    ended: bool  # its part of the pass has ended (it yields nothing more in this pass)


class IterableDatasetState(TypedDict):
    """Position of a loader over a stateful ``IterableDataset``: batch ``offset`` of pass
    ``epoch``, one record per worker.

    ``offset == sum(worker["batches"])``. Batches come round-robin from the workers, as
    with ``DataLoader``; ``next_worker`` follows the worker of the last delivered batch
    (or ended part). After the last batch of a pass the position is ``(epoch + 1, 0)``:
    the records then keep each copy's dataset state (persistent workers, 0 workers) or
    are cleared (non-persistent workers copy the main-process dataset for every pass).
    """

    format: str  # "trainer_resume.iterable_dataset/2" (/1 had no generator states)
    settings: IterableDatasetSettings
    epoch: int  # passes ended before the current one (each iter(loader) is one)
    offset: int  # batches delivered in the current pass
    delivered: int  # batches delivered since the start, over all passes
    next_worker: int  # the worker whose turn is next in the round-robin
    workers: list[IterableWorkerState]  # by worker id (one entry with 0 workers)


class _LoaderStateOptional(TypedDict, total=False):
    augmentation_seeding: (
        str  # "batch" or "sample"; absent in older states, which seeded per sample
    )


class LoaderState(_LoaderStateOptional):
    """State of a resumable :class:`~trainer_resume.loaders.ResumableDataLoader`.

    Counts only batches delivered to the caller, never prefetched ones.
    """

    format: str  # "trainer_resume.loader/1"
    augmentation_seed: int  # sample seed = derive_seed(augmentation_seed, stream position)
    batch_size: int | None  # the loader's batch_size (None with a batch sampler)
    delivered_batches: int
    # The sampler's position, or for an IterableDataset the position of its workers.
    sampler: (
        SamplerState
        | BatchSamplerState
        | EpochSamplerState
        | StatefulSamplerState
        | IterableDatasetState
    )


class DALIPipelineDescription(TypedDict):
    """What a resumed DALI pipeline is compared with: its batch size and its operators.

    Each operator is DALI's own description of it (schema, inputs, outputs, arguments),
    one line per entry, without where in the source it was defined; a line longer than
    a few dozen characters (a list of files) is kept as its length and digest.
    """

    batch_size: int
    operators: list[dict[str, Any]]  # {"name": str, "spec": list[str]}


class DALIIteratorState(TypedDict):
    """Position of a :class:`~trainer_resume.adapters.dali.ResumableDALIIterator`.

    ``checkpoints[i]`` is DALI's own checkpoint of pipeline ``i`` (every reader's
    position, every random operator's state, the DALI iterator's counters) after the
    last delivered batch, as bytes in a uint8 tensor. After an epoch's last batch the
    position names the next epoch (``epoch + 1``, ``delivered_batches == 0``) and
    ``pending_reset`` says the pipelines still need DALI's ``reset()`` before it.
    """

    format: str  # "trainer_resume.dali_iterator/1"
    dali_version: str  # DALI reads back the checkpoints of its own version
    epoch: int  # the epoch the next pass reads
    delivered_batches: int  # batches delivered in that epoch
    pending_reset: bool
    checkpoints: list[torch.Tensor]  # one uint8 tensor per pipeline
    pipelines: list[DALIPipelineDescription]
    settings: dict[str, Any]  # the iterator's arguments that decide its batches
    world_size: int  # torch.distributed ranks when paused (1 without a process group)
    rank: int


class DDPWindowState(TypedDict):
    """A DistributedDataParallel accumulation window open at a pause (one module's share)."""

    static_graph: bool  # the wrapper's static_graph (torch keeps no per-window record then)
    # Canonical names of the parameters the reducer found used in the window so far, in
    # the module's parameter order (find_unused_parameters=True; empty with static_graph).
    used: list[str]


class RankConfig(TypedDict):
    """A rank's signed config, as the top level of a pause file records rank 0's."""

    config_signature: str
    config: Any
    config_ignore: list[Any]


class RankPauseState(TypedDict):
    """What differs between ranks at a pause."""

    loaders: dict[str, LoaderState]  # the same global cursor on every rank
    extra: dict[str, Any]
    rng: RandomState
    # This rank's gradients when one the next step may read was set (mixin/_gradients.py).
    gradients: NotRequired[dict[str, Any]]
    # This rank's DDP accumulation windows when one was open (mixin/_ddp_window.py).
    ddp_window: NotRequired[dict[str, DDPWindowState]]
    # This rank's buffers of its sharded models (sharded/buffers.py).
    rank_buffers: NotRequired[dict[str, dict[str, Any]]]
    # This rank's signed config, where the ranks' configs differ (RANK_CONFIG_KEY).
    signed_config: NotRequired[RankConfig]


class DistributedPauseState(TypedDict):
    """The ``"distributed"`` entry of a pause file written by several ranks.

    The top-level ``loaders`` / ``extra`` / ``rng`` of the file are rank 0's, so the
    file also reads as a single-process pause file.
    """

    format: str  # trainer_resume.distributed.DISTRIBUTED_FORMAT
    world_size: int
    rng_base_seed: int  # base of the per-rank RNG re-derived for another world size
    ranks: list[RankPauseState]  # by rank


class ModuleModes(TypedDict):
    """What a module's ``state_dict()`` leaves out (canonical names, sorted)."""

    eval: list[str]  # submodules whose training flag is False ("" is the module itself)
    frozen: list[str]  # parameters whose requires_grad is False
    # Normalization layers (BatchNorm, InstanceNorm) whose track_running_stats is False
    # (absent in earlier releases' files: left as they are).
    untracked: NotRequired[list[str]]


class PauseCheckpoint(TypedDict):
    """Layout of a pause file written by ``TrainingResumeMixin.pause``.

    ``config``, ``regular`` and ``shared_keys`` are optional when reading: files
    without them still load (no named config difference on a mismatch; no sharing).
    ``distributed`` is present only in files written by several ranks.
    """

    format: str  # PAUSE_FORMAT
    module_version: str
    config_signature: str  # config_signature(config), "load" and config_ignore excluded
    config: NotRequired[Any]  # the canonical form: names the differing paths on a mismatch
    config_ignore: NotRequired[list[str]]  # the paths left out (absent in older files: none)
    completed_steps: int
    regular: NotRequired[dict[str, Any] | None]  # CPU snapshot of _regular_checkpoint(), or None
    shared_keys: NotRequired[list[str]]  # resume objects whose state is regular[name]
    # name -> state_dict; for a shared key the very object regular[name] (stored once),
    # and a reader takes regular[name] when the entry is absent.
    objects: dict[str, Any]
    loaders: dict[str, LoaderState]
    extra: dict[str, Any]
    rng: RandomState
    # object name -> the .grad of its parameters (module: {name: tensor or None};
    # optimizer: [[tensor or None] per group]); present only when one the next step may
    # read was set (see mixin/_gradients.py).
    gradients: NotRequired[dict[str, Any]]
    # object name -> the DDP accumulation window its parameters were in, when one was
    # open (see mixin/_ddp_window.py).
    ddp_window: NotRequired[dict[str, DDPWindowState]]
    # module object name -> its submodules in eval mode and frozen parameters, and
    # optimizer / LR scheduler object name -> its class (absent in older files: not
    # restored, not checked; see module_modes.py and mixin/_object_setup.py).
    module_modes: NotRequired[dict[str, ModuleModes]]
    object_classes: NotRequired[dict[str, str]]
    # sharded model name -> this rank's persistent plain buffers (canonical names): FSDP2
    # leaves buffers unsharded, one per rank (see sharded/buffers.py).
    rank_buffers: NotRequired[dict[str, dict[str, Any]]]
    # True when a sharded model's gradients were an open window's partial sums (absent
    # otherwise; see mixin/_sharded_window.py): refused on another number of ranks.
    sharded_window: NotRequired[bool]
    distributed: NotRequired[DistributedPauseState]


class SampleRecord(TypedDict):
    """What one sample file of a ``ReuseDataset`` holds."""

    format: str  # trainer_resume.loaders.reuse.store.RECORD_FORMAT
    index: int
    generation: int
    seed: int
    lifetime: int
    fingerprint: str | int | None
    sample: Any


class LightningPauseState(TypedDict):
    """What a pause file adds to Lightning's checkpoint, under the key ``"trainer_resume"``."""

    format: str  # trainer_resume.checkpoint_files.lightning.LIGHTNING_PAUSE_FORMAT
    global_step: int
    world_size: int
    config_signature: str | None
    config: Any  # canonical form of the config (plain data), or None
    config_ignore: NotRequired[list[str]]  # the paths left out (absent in older files: none)
    rng: list[RandomState]  # main-process RNG of each global rank, by rank
    # Left to the resumed fit: the validation due after the paused batch, and the
    # epoch end when the paused batch is its epoch's last (absent: neither).
    pending_validation: NotRequired[bool]
    pending_epoch_end: NotRequired[bool]
    # Last logged (callback, logged, progress_bar), by rank (earlier releases: rank 0's alone).
    metrics: NotRequired[list[dict[str, dict[str, Any]]] | dict[str, dict[str, Any]]]
    epoch_metrics_in_progress: NotRequired[list[str]]  # on_epoch training metrics not carried over
    # The on_epoch training metrics' accumulations that are carried, by rank (absent in
    # earlier releases' files: none carried).
    epoch_results: NotRequired[list[list[dict[str, Any]]]]
    # The LightningModule's modes, under "module" (absent in earlier releases' files).
    module_modes: NotRequired[dict[str, ModuleModes]]
    accumulate_grad_batches: NotRequired[int]  # trainer's at the pause (absent: earlier files)
    # Manual optimization: the gradients each rank's parameters held, by canonical name
    # (a window the loop accumulates by hand may be in progress); absent otherwise.
    gradients: NotRequired[list[dict[str, Any]]]
    # trainer.should_stop set by another callback while min_epochs/min_steps were not met
    # (absent: not set).
    stop_requested: NotRequired[bool]


class AcceleratorStepSettings(TypedDict):
    """The gradient-accumulation settings of an ``accelerate.Accelerator``; a state loads
    only into an Accelerator with the same ones."""

    num_steps: int  # gradient_accumulation_steps
    adjust_scheduler: bool
    sync_with_dataloader: bool
    sync_each_batch: bool


class AcceleratorStepState(TypedDict):
    """What an ``accelerate.Accelerator`` carries from one micro-step to the next
    (``trainer_resume.adapters.accelerate.accelerator_state``)."""

    format: str  # trainer_resume.adapters.accelerate.ACCELERATOR_FORMAT
    step: int  # Accelerator.step: micro-steps since the epoch's start (the window's count)
    sync_gradients: bool  # GradientState.sync_gradients after the last micro-step
    settings: AcceleratorStepSettings


class FinishedMarker(TypedDict):
    """The finished marker that ``finish()`` / ``mark_finished`` write (see ``trainer_resume.finished``)."""

    format: str  # trainer_resume.finished.FINISHED_FORMAT
    completed_steps: int
    finished_at: float  # time.time() when the marker was written


class ShardedFileEntry(TypedDict):
    """Size and BLAKE3 digest (hex) of one file of a sharded pause's generation."""

    size: int
    blake3: str


class ShardedManifest(TypedDict):
    """The commit record of a sharded pause directory (``manifest.ckpt``).

    Each ``rank-<r>.ckpt`` it names is a :class:`PauseCheckpoint` whose sharded
    objects' entries only mark them as written through DCP.
    """

    format: str  # SHARDED_FORMAT
    generation: str  # directory name of the committed generation
    world_size: int  # ranks that paused
    completed_steps: int
    models: dict[str, list[str]]  # sharded model name -> its optimizers written through DCP
    files: dict[str, ShardedFileEntry]  # path relative to the generation -> size, digest
