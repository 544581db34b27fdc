"""ResumableDALIIterator in one process: DALI's batches, states at every batch, and each refusal.

The pipelines are CPU-only (``device_id=None``), so these run without a GPU.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import time

import numpy as np
import pytest
import torch

pytest.importorskip(
    "nvidia.dali.plugin.pytorch",
    reason="NVIDIA DALI cannot be imported here (pip install 'trainer-resume[dali]')",
)

import nvidia.dali  # noqa: E402
import nvidia.dali.fn as fn  # noqa: E402
from nvidia.dali import pipeline_def  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: E402
from support import dali_runs  # noqa: E402

from trainer_resume.adapters.dali import ResumableDALIIterator  # noqa: E402
from trainer_resume.errors import (  # noqa: E402
    LoaderStateError,
    ResumeStateMismatchError,
    UnsupportedResumeConfigurationError,
)

KINDS = [
    ("file", "PARTIAL"),
    ("file", "FILL"),
    ("file", "DROP"),
    ("external", "FILL"),
    ("shuffle_after_epoch", "PARTIAL"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return dali_runs.write_images(tmp_path_factory.mktemp("images"))


def _epochs(iterator, epochs: int = dali_runs.EPOCHS, states: list | None = None) -> list:
    """The epoch loop from the iterator's own epoch: (epoch, batch) pairs."""
    seen = []
    for epoch in range(iterator.epoch, epochs):
        for batch in iterator:
            seen.append((epoch, batch[0]))
            if states is not None:
                states.append(iterator.state_dict())
    return seen


def _assert_same(expected: list, got: list, what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches instead of {len(expected)}"
    for number, ((epoch_a, a), (epoch_b, b)) in enumerate(zip(expected, got)):
        assert epoch_a == epoch_b, f"{what}: batch {number} in epoch {epoch_b}, not {epoch_a}"
        for name in a:
            assert torch.equal(a[name], b[name]), f"{what}: batch {number} {name}"


def _dali_reference(kind: str, root: str, policy: str) -> tuple[list, list[int]]:
    """The same pipeline under DALI's own iterator: its batches and len() per epoch."""
    wrapper = dali_runs.make_iterator(kind, root, policy)  # only for its arguments
    pipelines = [f(**a) for f, a in zip(wrapper._factories, wrapper._arguments)]
    dali = DALIGenericIterator(pipelines, dali_runs.OUTPUTS, **wrapper._iterator_kwargs)
    seen, lengths = [], []
    for epoch in range(dali_runs.EPOCHS):
        lengths.append(len(dali))
        seen.extend((epoch, batch[0]) for batch in dali)  # iter() resets after the epoch
    return seen, lengths


def test_a_forked_child_that_frees_a_pipeline_exits_instead_of_waiting_for_its_threads(root):
    # A DataLoader worker forked beside a DALI iterator: freeing the pipeline there (the
    # child's garbage collector, or its last reference dropped) shut its backend down,
    # which waits forever for threads that only the parent has, or crashes.
    iterator = dali_runs.make_iterator("file", root, "PARTIAL")
    next(iter(iterator))
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            del iterator
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert done[0] == child, "the child hung"
    assert os.waitstatus_to_exitcode(done[1]) == 0  # not killed by a signal (a crash)
    assert len(next(iterator)[0]["images"]) > 0  # the parent's pipeline still runs


@pytest.mark.parametrize(("kind", "policy"), KINDS)
def test_batches_and_len_are_those_of_dali_generic_iterator(root, kind, policy):
    expected, lengths = _dali_reference(kind, root, policy)
    iterator = dali_runs.make_iterator(kind, root, policy)
    got, got_lengths = [], []
    for epoch in range(dali_runs.EPOCHS):
        got_lengths.append(len(iterator))
        got.extend((epoch, batch[0]) for batch in iterator)
    _assert_same(expected, got, f"{kind} {policy}")
    assert got_lengths == lengths


@pytest.mark.parametrize(("kind", "policy"), KINDS)
def test_a_state_taken_after_any_batch_resumes_the_epoch_loop_in_a_fresh_iterator(
    root, kind, policy
):
    iterator = dali_runs.make_iterator(kind, root, policy)
    states = [iterator.state_dict()]
    seen = _epochs(iterator, states=states)
    for k, state in enumerate(states[:-1]):
        resumed = dali_runs.make_iterator(kind, root, policy)
        resumed.load_state_dict(state)
        # After an epoch's last batch that is the next epoch: its pass is not empty.
        assert resumed.epoch == seen[k][0], f"{kind} {policy} after {k} batches"
        _assert_same(seen[k:], _epochs(resumed), f"{kind} {policy} after {k} batches")


@pytest.mark.parametrize(("kind", "policy"), KINDS)
def test_after_an_epochs_last_batch_the_state_names_the_next_epoch(root, kind, policy):
    iterator = dali_runs.make_iterator(kind, root, policy)
    seen = _epochs(iterator, epochs=1)
    state = iterator.state_dict()  # after the loop, which saw DALI's StopIteration itself
    assert (state["epoch"], state["delivered_batches"], state["pending_reset"]) == (1, 0, True)
    rest = _epochs(iterator)
    resumed = dali_runs.make_iterator(kind, root, policy)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    _assert_same(rest, _epochs(resumed), f"{kind} {policy} after epoch 0")
    assert rest[0][0] == 1 and len(seen) > 0


@pytest.mark.parametrize(("kind", "policy"), KINDS)
def test_epoch_ended_is_true_from_an_epochs_last_batch_until_the_next_pass(root, kind, policy):
    expected, _ = _dali_reference(kind, root, policy)
    last_batches = [
        index == len(expected) - 1 or expected[index + 1][0] != epoch
        for index, (epoch, _) in enumerate(expected)
    ]
    iterator = dali_runs.make_iterator(kind, root, policy)
    assert iterator.epoch_ended is False  # before the first batch
    flags, at_pass_start, after_pass = [], [], []
    for _ in range(dali_runs.EPOCHS):
        passing = iter(iterator)
        at_pass_start.append(iterator.epoch_ended)
        for _ in passing:
            flags.append(iterator.epoch_ended)
        after_pass.append(iterator.epoch_ended)  # the loop saw the epoch's StopIteration
    assert flags == last_batches, f"{kind} {policy}"
    assert at_pass_start == [False] * dali_runs.EPOCHS
    assert after_pass == [True] * dali_runs.EPOCHS


def test_epoch_ended_is_false_after_loading_a_state_taken_at_an_epochs_end(root):
    iterator = dali_runs.make_iterator("file", root)
    _epochs(iterator, epochs=1)
    assert iterator.epoch_ended is True
    resumed = dali_runs.make_iterator("file", root)
    resumed.load_state_dict(iterator.state_dict())
    assert (resumed.epoch, resumed.epoch_ended) == (1, False)


def _auto_reset_epochs(iterator, take_states: bool, most: int) -> tuple[list, list[bool]]:
    """Three passes of ``for batch in iterator`` (no reset between them), ``most`` batches
    at most (a pass that did not end would run on); after each pass, whether
    ``epoch_ended`` still says the epoch ended."""
    seen, ended = [], []
    for epoch in range(dali_runs.EPOCHS):
        for batch in iterator:
            seen.append((epoch, batch[0]))
            if len(seen) > most:
                return seen, ended
            if take_states:
                iterator.state_dict()  # reads one batch ahead, as the mixin's boundary does
        ended.append(iterator.epoch_ended)
    return seen, ended


@pytest.mark.parametrize("take_states", [False, True])
def test_with_auto_reset_each_pass_ends_at_its_epochs_end_as_in_dali(root, take_states):
    kwargs = {"root": root, "enable_checkpointing": True}
    dali = DALIGenericIterator(
        [dali_runs.file_pipeline(**kwargs)],
        dali_runs.OUTPUTS,
        reader_name="Reader",
        auto_reset=True,
    )
    expected = [(e, batch[0]) for e in range(dali_runs.EPOCHS) for batch in dali]
    iterator = ResumableDALIIterator(
        dali_runs.file_pipeline,
        dali_runs.OUTPUTS,
        pipeline_kwargs=kwargs,
        reader_name="Reader",
        auto_reset=True,
    )
    seen, ended = _auto_reset_epochs(iterator, take_states, most=len(expected))
    _assert_same(expected, seen, f"auto_reset, states taken: {take_states}")
    # The StopIteration that ended each pass started the next one (DALI's reset).
    assert ended == [False] * dali_runs.EPOCHS


def test_the_state_is_plain_data_that_a_weights_only_load_reads(root):
    iterator = dali_runs.make_iterator("file", root)
    for _ in range(3):
        next(iterator)
    buffer = io.BytesIO()
    torch.save(iterator.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert [c.dtype for c in state["checkpoints"]] == [torch.uint8]
    expected = _epochs(iterator)
    resumed = dali_runs.make_iterator("file", root)
    resumed.load_state_dict(state)
    _assert_same(expected, _epochs(resumed), "after a weights-only load")


# ------------------------------------------------------------------------ refusals

NOT_RESTORED = (
    "DALI checkpoints an external source only when its source is a callable taking one "
    "argument (SampleInfo, or BatchInfo with batch=True), which it calls again from the saved "
    "epoch and iteration; a generator, an iterable or a callable without arguments would start "
    "over"
)


def _samples():
    yield np.zeros((2,), dtype=np.float32)


def _no_argument():
    return np.zeros((2,), dtype=np.float32)


@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def source_pipeline(source):
    return fn.external_source(source=source, batch=False, name="Numbers")


@pipeline_def(batch_size=2, num_threads=1, device_id=None)
def fed_pipeline():
    return fn.external_source(name="Fed")


def test_a_pipeline_without_checkpointing_is_refused(root):
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDALIIterator(
            dali_runs.file_pipeline, dali_runs.OUTPUTS, pipeline_kwargs={"root": root}
        )
    assert caught.value.code == 332
    assert str(caught.value) == (
        "[332] configuration cannot be resumed exactly: DALI pipeline 0 (file_pipeline) was "
        "built without enable_checkpointing=True, so DALI keeps no state of "
        "its readers and random operators to save; pass enable_checkpointing=True to "
        "@pipeline_def or in pipeline_kwargs"
    )


@pytest.mark.parametrize(
    ("source", "described"),
    [
        (_samples, "a generator function"),
        ([np.zeros((2,), dtype=np.float32)] * 4, "an iterable"),
        (_no_argument, "a callable without arguments"),
    ],
)
def test_an_external_source_dali_cannot_restore_is_refused(source, described):
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDALIIterator(
            source_pipeline,
            ["numbers"],
            pipeline_kwargs={"source": source, "enable_checkpointing": True},
        )
    assert str(caught.value) == (
        f"[332] {UnsupportedResumeConfigurationError.message}: fn.external_source 'Numbers' in "
        f"DALI pipeline 0 (source_pipeline) has {described} as its source: {NOT_RESTORED}; give "
        "it a callable of one argument"
    )


def test_an_external_source_without_a_source_is_refused():
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDALIIterator(
            fed_pipeline, ["numbers"], pipeline_kwargs={"enable_checkpointing": True}, size=4
        )
    assert str(caught.value) == (
        f"[332] {UnsupportedResumeConfigurationError.message}: fn.external_source 'Fed' in DALI "
        "pipeline 0 (fed_pipeline) has no source (its data would come from feed_input, which a "
        f"checkpoint does not hold): {NOT_RESTORED}"
    )


def _paused_state(root):
    iterator = dali_runs.make_iterator("file", root)
    for _ in range(2):
        next(iterator)
    return iterator.state_dict()


def _assert_refused_and_untouched(root, state, error, text):
    """The refusal's code and text; the running iterator goes on as if it had not been asked."""
    running = dali_runs.make_iterator("file", root)
    reference = dali_runs.make_iterator("file", root)
    next(running), next(reference)
    with pytest.raises(error) as caught:
        running.load_state_dict(state)
    assert str(caught.value) == f"[{error.code}] {error.message}: {text}"
    _assert_same(_epochs(reference), _epochs(running), "after the refused state")


def test_a_state_of_a_changed_pipeline_is_refused_naming_the_difference(root):
    state = _paused_state(root)
    running = ResumableDALIIterator(
        dali_runs.file_pipeline,
        dali_runs.OUTPUTS,
        pipeline_kwargs={"root": root, "std": 128.0, "enable_checkpointing": True},
        reader_name="Reader",
        last_batch_policy=dali_runs.POLICIES["PARTIAL"],
    )
    with pytest.raises(ResumeStateMismatchError) as caught:
        running.load_state_dict(state)
    assert caught.value.code == 330
    assert str(caught.value) == (
        f"[330] {ResumeStateMismatchError.message}: DALI iterator state was saved from other DALI "
        "pipelines: pipeline 0: operator 3 (__CropMirrorNormalize_2) has 'std: [128.000000, ]' where "
        "the paused one had 'std: [255.000000, ]'; build the pipelines as in the paused run (a "
        "changed external_source callable cannot be detected: keep it too)"
    )


def test_a_state_of_other_iterator_arguments_is_refused_and_changes_nothing(root):
    state = _paused_state(root)
    state["settings"] = dict(state["settings"], last_batch_policy="DROP")
    _assert_refused_and_untouched(
        root,
        state,
        ResumeStateMismatchError,
        "DALI iterator state was saved by an iterator with last_batch_policy='DROP', this one has "
        "last_batch_policy='PARTIAL'; build it with the paused run's arguments",
    )


def test_a_state_of_another_dali_version_is_refused_and_changes_nothing(root):
    state = dict(_paused_state(root), dali_version="1.0.0")
    _assert_refused_and_untouched(
        root,
        state,
        ResumeStateMismatchError,
        f"DALI iterator state was saved with DALI '1.0.0' and this process has DALI "
        f"'{nvidia.dali.__version__}'; DALI restores the checkpoints of its own version: install "
        "that one",
    )


def test_a_state_of_another_world_size_is_refused_and_changes_nothing(root):
    state = dict(_paused_state(root), world_size=2, rank=1)
    _assert_refused_and_untouched(
        root,
        state,
        UnsupportedResumeConfigurationError,
        "DALI iterator state was saved by rank 1 of 2 and this process is rank 0 of 1: each "
        "rank's DALI readers continue their own shard (shard_id, num_shards), which another world "
        "size would split differently; resume with 2 rank(s)",
    )


def test_a_malformed_state_is_refused_and_changes_nothing(root):
    state = _paused_state(root)
    del state["pending_reset"]
    _assert_refused_and_untouched(
        root, state, LoaderStateError, "DALI iterator state lacks key(s) ['pending_reset']"
    )


def test_a_checkpoint_dali_cannot_read_is_refused_and_changes_nothing(root):
    state = _paused_state(root)
    state["checkpoints"] = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    running = dali_runs.make_iterator("file", root)
    reference = dali_runs.make_iterator("file", root)
    next(running), next(reference)
    with pytest.raises(LoaderStateError) as caught:
        running.load_state_dict(state)
    prefix = (
        f"[333] {LoaderStateError.message}: DALI iterator state: DALI could not restore the "
        "pipelines from the saved checkpoints (RuntimeError: "
    )
    assert str(caught.value).startswith(prefix) and str(caught.value).endswith(")")
    assert isinstance(caught.value.__cause__, RuntimeError)
    _assert_same(_epochs(reference), _epochs(running), "after the refused state")


def test_a_state_with_a_reset_due_after_delivered_batches_is_refused(root):
    state = dict(_paused_state(root), pending_reset=True)
    _assert_refused_and_untouched(
        root,
        state,
        LoaderStateError,
        "DALI iterator state has a pending reset after 2 delivered batches: a reset comes before "
        "the epoch's first batch",
    )
