"""Hugging Face ``datasets`` streaming datasets through the resumable loader, with the real
library: exact resumes with and without ``set_epoch``, and the shuffle buffer refused."""

from __future__ import annotations

import random
import warnings

import datasets
import numpy as np
import pytest
import torch
from datasets import iterable_dataset

from trainer_resume.errors import UncheckedResumeWarning, UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:Loading a state dict of a shuffle buffer")

ROWS, SHARDS, EPOCHS = 40, 4, 2


def _noisy(example: dict) -> dict:
    # Augmentation inside the stream, drawn from the global generators the loader seeds.
    return {"noise": float(torch.rand(())) + random.random() + float(np.random.rand())}


def _stream(shuffled: bool = False):
    stream = datasets.Dataset.from_dict({"id": list(range(ROWS))}).to_iterable_dataset(
        num_shards=SHARDS
    )
    if shuffled:
        stream = stream.shuffle(seed=3, buffer_size=8)
    return stream.map(_noisy)


def _loader(workers: int = 0, persistent: bool = False, **options) -> ResumableDataLoader:
    return ResumableDataLoader(
        _stream(),
        batch_size=3,
        num_workers=workers,
        persistent_workers=persistent,
        resumable=True,
        **options,
    )


def _run(loader: ResumableDataLoader, state=None, set_epoch: bool = True):
    """The epoch loop Hugging Face documents (``set_epoch`` first): every batch, and the
    state after each."""
    if state is not None:
        loader.load_state_dict(state)
    batches, states = [], []
    for epoch in range(loader.epoch, EPOCHS):
        if set_epoch:
            loader.dataset.set_epoch(epoch)
        for batch in loader:
            batches.append(torch.stack([batch["id"].double(), batch["noise"].double()]))
            states.append(loader.state_dict())
    loader.close()
    return batches, states


def _check_resumes(workers: int, persistent: bool, set_epoch: bool) -> None:
    torch.manual_seed(0)
    batches, states = _run(_loader(workers, persistent), set_epoch=set_epoch)
    per_epoch = len(batches) // EPOCHS
    assert per_epoch == 14  # 40 rows in batches of 3 (13 + 1, or twice 6 + 1 with two workers)
    for k in (1, 5, per_epoch, per_epoch + 2):
        torch.manual_seed(k)  # unlike the uninterrupted run: the state must fix everything
        got, _ = _run(_loader(workers, persistent), states[k - 1], set_epoch=set_epoch)
        assert len(got) == len(batches) - k, f"after {k}"
        for number, (a, b) in enumerate(zip(batches[k:], got)):
            assert torch.equal(a, b), f"resumed after {k}: batch {number} differs"


@pytest.mark.parametrize("set_epoch", [True, False])
def test_a_streaming_dataset_resumes_exactly_without_workers(set_epoch):
    _check_resumes(0, False, set_epoch)


@pytest.mark.slow
@pytest.mark.parametrize(("persistent", "set_epoch"), [(False, True), (True, True), (True, False)])
def test_a_streaming_dataset_resumes_exactly_with_two_workers(persistent, set_epoch):
    _check_resumes(2, persistent, set_epoch)


def test_a_streaming_dataset_shuffled_with_a_buffer_is_refused_before_the_loader_exists():
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(_stream(shuffled=True), batch_size=3, resumable=True)
    assert caught.value.code == 332
    assert caught.value.detail == (
        "the Hugging Face streaming dataset is shuffled with a buffer (.shuffle(buffer_size="
        "...)), whose examples its state_dict() does not hold: a loaded state refills the "
        "buffer with other examples, so no loader can resume it exactly; shuffle without a "
        "buffer instead (use a map-style datasets.Dataset, e.g. load_dataset(...) without "
        "streaming=True, with ResumableDataLoader(shuffle=True), or stream the data files in "
        "an order you shuffle yourself), or pass allow_inexact_shuffle_buffer=True to accept "
        "a resume that refills the buffer"
    )


def test_the_shuffle_buffer_is_accepted_when_the_user_opts_out_and_is_not_checked_otherwise():
    loader = ResumableDataLoader(
        _stream(shuffled=True), batch_size=3, resumable=True, allow_inexact_shuffle_buffer=True
    )
    assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(ROWS))
    # Not resumable: not checked, as DataLoader.
    ResumableDataLoader(_stream(shuffled=True), batch_size=3)


def test_the_accepted_shuffle_buffer_is_refused_with_workers_which_cannot_load_its_state():
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(
            _stream(shuffled=True),
            batch_size=3,
            num_workers=2,
            resumable=True,
            allow_inexact_shuffle_buffer=True,
        )
    assert caught.value.code == 332
    assert "with num_workers=2 a worker's copy fails to load its state" in caught.value.detail
    assert "use num_workers=0 with the buffer" in caught.value.detail


def test_the_accepted_shuffle_buffer_resumes_without_workers_and_delivers_every_row():
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            _stream(shuffled=True), batch_size=3, resumable=True, allow_inexact_shuffle_buffer=True
        )

    first = loader()
    batches = iter(first)
    delivered = [int(i) for _ in range(4) for i in next(batches)["id"]]
    state = first.state_dict()
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [int(i) for batch in resumed for i in batch["id"]]
    # Inexact (the buffer is refilled), but it loads and reads on to the pass's end.
    assert len(delivered) == 12 and rest and set(rest) <= set(range(ROWS))


class _Unknown(iterable_dataset.ExamplesIterable):
    """An examples iterable of a class the check does not know (a newer datasets, say)."""


def test_a_pipeline_the_check_does_not_know_is_warned_about_not_refused():
    def rows(shard):
        yield from ({"id": i} for i in shard)

    unknown = _Unknown(rows, {"shard": [0, 1, 2]})
    stream = datasets.IterableDataset(unknown)
    with pytest.warns(UncheckedResumeWarning) as caught:
        ResumableDataLoader(stream, batch_size=2, resumable=True)
    assert str(caught[0].message) == (
        "could not check whether the Hugging Face streaming dataset is shuffled with a buffer "
        f"(datasets {datasets.__version__}; the check was tested with datasets 5.2.0): its "
        "pipeline holds a _Unknown, unknown to this check. A shuffle buffer (.shuffle("
        "buffer_size=...)) would make a resume differ from the uninterrupted run"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ResumableDataLoader(_stream(), batch_size=2, resumable=True)  # a known pipeline: quiet


def test_a_resumed_pass_in_another_epoch_than_its_state_is_refused_naming_the_fix():
    torch.manual_seed(0)
    _, states = _run(_loader())
    loader = _loader()
    loader.load_state_dict(states[3])
    loader.dataset.set_epoch(1)  # the saved run was in epoch 0 there
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        next(iter(loader))
    assert caught.value.code == 332
    assert caught.value.detail == (
        "the Hugging Face streaming dataset is in epoch 1 but the pass being resumed was saved "
        "in epoch 0: it would start the pass over instead of resuming it; call "
        "dataset.set_epoch(0) before the resumed pass, as the saved run did"
    )
