"""MosaicML's published state format, driven by ``ResumableDataLoader`` where the package
cannot be installed (CI): the states loaded are MosaicML's keys with the delivered
samples, a state at an epoch's end starts the next epoch instead of MosaicML's empty
one, and the configurations whose counts would not be the delivered samples are
refused. The real package is tested in test_streaming_mosaicml.py where it installs."""

from __future__ import annotations

import pytest
import torch
from support import mosaic_format
from support.streaming_runs import BATCH_SIZE, EPOCHS, read

from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader

KEYS = {"epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed", "initial_physical_nodes"}


def _loader(**options) -> ResumableDataLoader:
    return ResumableDataLoader(
        mosaic_format.StreamingDataset(batch_size=BATCH_SIZE, **options),
        batch_size=BATCH_SIZE,
        resumable=True,
        generator=torch.Generator().manual_seed(3),
    )


@pytest.mark.parametrize("stop", [3, 8], ids=["after-3-batches", "at-the-epoch-end"])
def test_states_loaded_are_mosaicml_keys_with_the_delivered_samples(
    monkeypatch: pytest.MonkeyPatch, stop: int
) -> None:
    mosaic_format.installed(monkeypatch)
    full = read(_loader())[0]
    assert len(full) == EPOCHS * 8
    head, state = read(_loader(), stop)
    resumed = _loader()
    resumed.load_state_dict(state)
    tail = read(resumed)[0]
    for got, want in zip(head + tail, full, strict=True):
        assert torch.equal(got["id"], want["id"]) and torch.equal(got["x"], want["x"])
    loaded = resumed.dataset.loaded[0]
    assert set(loaded) == KEYS
    if stop == 3:
        assert (loaded["epoch"], loaded["sample_in_epoch"]) == (0, 3 * BATCH_SIZE)
    else:  # the next epoch's start, not MosaicML's {'epoch': 0, 'sample_in_epoch': 64}
        assert (loaded["epoch"], loaded["sample_in_epoch"]) == (1, 0)


def test_mosaicmls_own_state_at_an_epoch_end_gives_an_empty_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the driven loader avoids: the state MosaicML's StreamingDataLoader saves there.
    mosaic_format.installed(monkeypatch)
    dataset = mosaic_format.StreamingDataset(batch_size=BATCH_SIZE)
    assert len(list(dataset)) == 64
    own = dataset.state_dict(64, False)
    assert (own["epoch"], own["sample_in_epoch"]) == (0, 64)
    fresh = mosaic_format.StreamingDataset(batch_size=BATCH_SIZE)
    fresh.load_state_dict(own)
    assert list(fresh) == []


def test_a_batch_size_other_than_the_datasets_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    mosaic_format.installed(monkeypatch)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(
            mosaic_format.StreamingDataset(batch_size=4), batch_size=BATCH_SIZE, resumable=True
        )
    assert caught.value.detail == (
        "StreamingDataset is MosaicML's StreamingDataset built with batch_size=4 but the loader's "
        "batch_size is 8: MosaicML deals its samples out over the workers by that batch size, so "
        "a resume could not name the delivered samples; build the dataset with the loader's "
        "batch_size"
    )


def test_replication_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    mosaic_format.installed(monkeypatch)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        _loader(replication=2)
    assert caught.value.detail == (
        "StreamingDataset is MosaicML's StreamingDataset with replication=2, whose resume counts "
        "are not the delivered samples; leave replication unset with a ResumableDataLoader"
    )
