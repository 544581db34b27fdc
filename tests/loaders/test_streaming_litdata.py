"""litdata's ``StreamingDataset`` through ``ResumableDataLoader``, with the real library:
shuffled, randomly augmented, 0 and 2 workers, interrupted after 3 batches and at an
epoch's end, resumed in a new process, every batch equal to the uninterrupted run's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import streaming_runs
from support.streaming_runs import EPOCHS, make_loader, read, write_dataset

from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader


@pytest.mark.slow
def test_litdata_stream_resumes_exactly_in_a_new_process(tmp_path: Path) -> None:
    folder = str(tmp_path / "data")
    write_dataset(folder)
    full: dict[int, list] = {}
    heads, states = {}, {}
    for workers in (0, 2):
        full[workers] = read(make_loader(folder, workers))[0]
        per_epoch = len(full[workers]) // EPOCHS
        for stop in (3, per_epoch):  # after 3 batches, and on the first epoch's last batch
            key = f"{workers}/{stop}"
            heads[key], states[key] = read(make_loader(folder, workers), stop)
    for batches in full.values():  # litdata's shuffled order, new in each epoch (as its loader's)
        first = [int(i) for batch in batches[: len(batches) // EPOCHS] for i in batch["id"]]
        second = [int(i) for batch in batches[len(batches) // EPOCHS :] for i in batch["id"]]
        assert sorted(first) == sorted(second) == list(range(streaming_runs.SAMPLES))
        assert first != second and first != sorted(first)
    torch.save(states, tmp_path / "states.pt")
    subprocess.run(
        [
            sys.executable,
            streaming_runs.__file__,
            folder,
            str(tmp_path / "states.pt"),
            str(tmp_path / "tails.pt"),
        ],
        check=True,
        timeout=240,
    )
    tails = torch.load(tmp_path / "tails.pt", weights_only=True)
    for key, head in heads.items():
        expected = full[int(key.split("/")[0])]
        resumed = head + tails[key]
        assert len(resumed) == len(expected), key
        for number, (got, want) in enumerate(zip(resumed, expected)):
            assert torch.equal(got["id"], want["id"]), (key, number)
            assert torch.equal(got["x"], want["x"]), (key, number)


def test_litdata_combined_dataset_is_refused_naming_its_loader(tmp_path: Path) -> None:
    from litdata import CombinedStreamingDataset

    folder = str(tmp_path / "data")
    write_dataset(folder)
    combined = CombinedStreamingDataset([streaming_runs.AugmentedStream(folder)])
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(combined, batch_size=4, resumable=True)
    assert caught.value.detail == (
        "CombinedStreamingDataset is litdata's CombinedStreamingDataset, whose position is kept "
        "by litdata's own StreamingDataLoader (its state_dict() takes that loader's counts), "
        "which a ResumableDataLoader cannot drive exactly; read each litdata.StreamingDataset "
        "through its own ResumableDataLoader, or keep the library's own loader and return it "
        "from _resume_loaders(), declared with trainer_resume.declare_no_random_draws(loader) if "
        "its samples draw no random numbers (docs/streaming.md)"
    )
