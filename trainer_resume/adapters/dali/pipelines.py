"""Building the user's DALI pipelines, refusing those DALI cannot checkpoint, and describing them.

A pipeline comes from the user's factory (a ``@pipeline_def`` function) and its
keyword arguments, once at construction and again, with ``checkpoint=``, for every
restore. Before any batch is read, each pipeline is checked:

- built with ``enable_checkpointing=True`` (else DALI records no state to save);
- every ``fn.external_source`` has a source DALI can restore: a callable taking one
  argument (``SampleInfo`` / ``BatchInfo``), which DALI calls again from the saved
  epoch and iteration. A generator, an iterable, a callable without arguments or a
  source fed by ``feed_input`` would start over, silently.

A description of each pipeline (its batch size and DALI's own text of each operator:
schema, inputs, outputs, arguments) is saved with the state; a restore into a
pipeline whose description differs is refused, naming the first difference. What the
description cannot see is the Python code behind an external source's callable.

DALI internals read here (tested with DALI 2.4): ``Pipeline._enable_checkpointing``,
``Pipeline._ops`` (each with ``name``, ``spec`` and ``_op``), ``Pipeline._input_callbacks``
(each group's ``source_desc.kind`` / ``has_inputs`` and ``instances``).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvidia.dali.external_source import ExternalSource
from nvidia.dali.pipeline import Pipeline

from ...difference import first_difference
from ...errors import ResumeStateMismatchError, UnsupportedResumeConfigurationError
from ...processes.parent_death import children_die_with_this_process
from ...state import DALIPipelineDescription

__all__ = [
    "build_pipelines",
    "check_pipeline",
    "check_same_pipelines",
    "describe",
    "pipeline_difference",
]

# Entries of DALI's operator text that say where the operator was defined, not what it does.
_SOURCE_LOCATION = "_origin_stack_"
_LONGEST_LINE = 120  # longer lines (a reader's list of files) are kept as length and digest
# DALI's rule, as its own warning states it (the warning is replaced by the refusal).
_EXTERNAL_SOURCE_WARNING = "Checkpointing enabled in a pipeline with external source operator"
_EXTERNAL_SOURCE_RULE = (
    "DALI checkpoints an external source only when its source is a callable taking one "
    "argument (SampleInfo, or BatchInfo with batch=True), which it calls again from the saved "
    "epoch and iteration; a generator, an iterable or a callable without arguments would start "
    "over"
)


def build_pipelines(
    factories: Sequence[Callable[..., Any]],
    arguments: Sequence[Mapping[str, Any]],
    checkpoints: Sequence[bytes] | None = None,
) -> list[Pipeline]:
    """Call each factory with its arguments (and ``checkpoint=`` when given) and build it."""
    pipelines = []
    for index, (factory, kwargs) in enumerate(zip(factories, arguments)):
        options = dict(kwargs)
        if checkpoints is not None:
            options["checkpoint"] = checkpoints[index]
        pipeline = factory(**options)
        if not isinstance(pipeline, Pipeline):
            raise TypeError(
                f"pipeline_fn must return a DALI Pipeline (a @pipeline_def function), "
                f"{_name(factory)} returned {type(pipeline).__name__}"
            )
        # build() starts the workers of parallel external sources (forked by default):
        # tied to this process, they never outlive it.
        with warnings.catch_warnings(), children_die_with_this_process():
            # check_pipeline refuses what this warning describes, naming the operator.
            warnings.filterwarnings("ignore", message=_EXTERNAL_SOURCE_WARNING)
            pipeline.build()
        pipelines.append(pipeline)
    return pipelines


def check_pipeline(pipeline: Pipeline, index: int, factory: Callable[..., Any]) -> None:
    """Refuse a pipeline whose state DALI cannot checkpoint and restore exactly.

    Raises:
        UnsupportedResumeConfigurationError: checkpointing is off, or an external
            source has a source DALI does not restore.
    """
    where = f"DALI pipeline {index} ({_name(factory)})"
    if not pipeline._enable_checkpointing:
        raise UnsupportedResumeConfigurationError(
            f"{where} was built without enable_checkpointing=True, so DALI keeps no state of its "
            "readers and random operators to save; pass enable_checkpointing=True to @pipeline_def "
            "or in pipeline_kwargs"
        )
    for group in pipeline._input_callbacks:
        description = group.source_desc
        if description.kind.name == "CALLABLE" and description.has_inputs:
            continue
        names = ", ".join(repr(instance.name) for instance in group.instances)
        raise UnsupportedResumeConfigurationError(
            f"fn.external_source {names} in {where} has {_source_kind(description)} as its "
            f"source: {_EXTERNAL_SOURCE_RULE}; give it a callable of one argument"
        )
    fed = [op.name for op in pipeline._ops if isinstance(op._op, ExternalSource) and _fed(op)]
    if fed:
        raise UnsupportedResumeConfigurationError(
            f"fn.external_source {', '.join(map(repr, fed))} in {where} has no source (its data "
            f"would come from feed_input, which a checkpoint does not hold): {_EXTERNAL_SOURCE_RULE}"
        )


def describe(pipeline: Pipeline) -> DALIPipelineDescription:
    """The batch size and DALI's own text of each operator, without source locations."""
    operators = []
    for op in pipeline._ops:
        lines = [line.strip() for line in str(op.spec).splitlines()]
        spec = [
            _shortened(line) for line in lines if line and not line.startswith(_SOURCE_LOCATION)
        ]
        operators.append({"name": str(op.name), "spec": spec})
    return {"batch_size": int(pipeline.max_batch_size), "operators": operators}


def pipeline_difference(
    saved: Sequence[Mapping[str, Any]], current: Sequence[DALIPipelineDescription]
) -> str | None:
    """Where the saved pipeline descriptions and the current ones first differ (None: same)."""
    if len(saved) != len(current):
        return f"the state has {len(saved)} pipeline(s), this iterator builds {len(current)}"
    found = first_difference(list(saved), list(current))
    if found is None:
        return None
    parts = found.path.split("/")
    index = int(parts[0])
    before, now = saved[index], current[index]
    if parts[1] == "batch_size":
        return f"pipeline {index} has batch_size {now['batch_size']}, the paused one had {before['batch_size']}"
    if len(parts) == 2:  # another number of operators
        return (
            f"pipeline {index} has {len(now['operators'])} operators, the paused one had "
            f"{len(before['operators'])}"
        )
    number = int(parts[2])
    old, new = before["operators"][number], now["operators"][number]
    where = f"pipeline {index}: operator {number} ({new['name']})"
    if len(parts) == 5:  # one line of the operator's description
        line = int(parts[4])
        return f"{where} has '{new['spec'][line]}' where the paused one had '{old['spec'][line]}'"
    added = [line for line in new["spec"] if line not in old["spec"]]
    removed = [line for line in old["spec"] if line not in new["spec"]]
    if added or removed:
        return f"{where} has {added} that the paused one had not, and lacks {removed}"
    return f"{where} differs: {found.detail}"


def check_same_pipelines(
    saved: Sequence[Mapping[str, Any]], current: Sequence[DALIPipelineDescription], what: str
) -> None:
    """Refuse a state saved from other pipelines, naming the first difference."""
    difference = pipeline_difference(saved, current)
    if difference is not None:
        raise ResumeStateMismatchError(
            f"{what} was saved from other DALI pipelines: {difference}; build the pipelines as "
            "in the paused run (a changed external_source callable cannot be detected: keep it too)"
        )


def _shortened(line: str) -> str:
    if len(line) <= _LONGEST_LINE:
        return line
    key = line.split(":", 1)[0]
    digest = hashlib.sha256(line.encode()).hexdigest()[:16]
    return f"{key}: <{len(line)} characters, sha256 {digest}>"


def _fed(op: Any) -> bool:
    return getattr(op, "_callback", None) is None


def _source_kind(description: Any) -> str:
    kind = description.kind.name
    if kind == "CALLABLE":
        return "a callable without arguments"
    return {"ITERABLE": "an iterable", "GENERATOR_FUNC": "a generator function"}.get(
        kind, f"a {kind.lower()}"
    )


def _name(factory: Callable[..., Any]) -> str:
    return getattr(factory, "__qualname__", None) or getattr(factory, "__name__", repr(factory))
