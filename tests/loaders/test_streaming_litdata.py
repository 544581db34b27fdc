"""litdata's ``StreamingDataset`` through ``ResumableDataLoader``, with the real library:
shuffled, randomly augmented, 0 and 2 workers, interrupted after 3 batches and at an
epoch's end, resumed in a new process, every batch equal to the uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import pytest
from litdata import CombinedStreamingDataset
from support import litdata_runs
from support.streaming_runs import check_resumes_in_new_process

from trainer_resume.errors import UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader


@pytest.mark.slow
def test_litdata_stream_resumes_exactly_in_a_new_process(tmp_path: Path) -> None:
    folder = str(tmp_path / "data")
    litdata_runs.write_dataset(folder)
    check_resumes_in_new_process(litdata_runs, folder, tmp_path)


def test_litdata_combined_dataset_is_refused_naming_its_loader(tmp_path: Path) -> None:
    folder = str(tmp_path / "data")
    litdata_runs.write_dataset(folder)
    combined = CombinedStreamingDataset([litdata_runs.AugmentedStream(folder)])
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
