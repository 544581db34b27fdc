"""NVIDIA DALI integration (install the ``dali`` extra).

:class:`ResumableDALIIterator` iterates DALI pipelines like DALI's
``DALIGenericIterator`` and is returned from ``_resume_loaders()`` like any
resumable loader: the pause file holds DALI's checkpoint of every pipeline, and
``resume()`` rebuilds the pipelines from them. See ``docs/dali.md``.

Requires NVIDIA DALI 2.4 or later (``nvidia-dali-cuda120`` or another CUDA build; tested
with 2.4.0, :data:`RELEASES`). The integration reads DALI internals, every one named in
:data:`INTERNALS` and checked when it is imported: a release without one of them (or with
another shape of it) is refused with ``FrameworkReleaseError`` (352) naming it; a newer
release than the tested one warns once (``UntestedReleaseWarning``) and works. A pause
file is resumed with the DALI release that wrote it (DALI restores its own checkpoints
only), checked when it is loaded.
"""

from __future__ import annotations

from .._release import DALI, Attribute, Function, Name, check_release

RELEASES = DALI
_PIPELINE = "nvidia.dali.pipeline:Pipeline"
_ITERATOR = "nvidia.dali.plugin.pytorch:DALIGenericIterator"
_OPERATOR = "nvidia.dali.ops:_OperatorInstance"
_SOURCE = "nvidia.dali._utils.external_source_impl"

# Everything of DALI the integration's modules read, call or set.
INTERNALS = (
    # iterator.py: DALI's PyTorch iterator, its checkpoints and its reset.
    Function(_ITERATOR, positional=2, keywords=("auto_reset", "prepare_first_batch")),
    Function(f"{_ITERATOR}.checkpoints", positional=0),
    Function(f"{_ITERATOR}.reset", positional=0),
    Function(f"{_ITERATOR}.__next__", positional=0),
    Function(f"{_ITERATOR}.__len__", positional=0),
    Name("nvidia.dali.plugin.pytorch:LastBatchPolicy.FILL"),
    Name("nvidia.dali.plugin.pytorch:LastBatchPolicy.PARTIAL"),
    # pipelines.py: building a pipeline from a checkpoint, and what is checked of it.
    Function(_PIPELINE, keywords=("enable_checkpointing", "checkpoint")),
    Function(f"{_PIPELINE}.build", positional=0),
    Attribute(f"{_PIPELINE}.max_batch_size"),
    Attribute(f"{_PIPELINE}._enable_checkpointing"),
    Attribute(f"{_PIPELINE}._ops"),
    Attribute(f"{_OPERATOR}.name"),
    Attribute(f"{_OPERATOR}.spec"),
    Attribute(f"{_OPERATOR}._op"),
    Attribute(
        f"{_OPERATOR}._callback", set_by="nvidia.dali.external_source:ExternalSource.__call__"
    ),
    Name("nvidia.dali.external_source:ExternalSource"),
    Attribute(f"{_PIPELINE}._input_callbacks"),
    Attribute("nvidia.dali.external_source:_ExternalSourceGroup.source_desc"),
    Attribute("nvidia.dali.external_source:_ExternalSourceGroup.instances"),
    Attribute(f"{_SOURCE}:SourceDescription.kind"),
    Attribute(f"{_SOURCE}:SourceDescription.has_inputs"),
    Name(f"{_SOURCE}:SourceKind.CALLABLE"),
    Name(f"{_SOURCE}:SourceKind.ITERABLE"),
    Name(f"{_SOURCE}:SourceKind.GENERATOR_FUNC"),
    # _fork.py: the live pipelines, detached from their backends in a forked child.
    Attribute(f"{_PIPELINE}._pipes"),
    Attribute(f"{_PIPELINE}._pipe", settable=True),
)

check_release(DALI, adapter="dali", extra="dali", internals=INTERNALS)

from . import _fork  # noqa: E402, F401 - forked children never shut a pipeline down
from .iterator import ResumableDALIIterator  # noqa: E402

__all__ = ["INTERNALS", "RELEASES", "ResumableDALIIterator"]
