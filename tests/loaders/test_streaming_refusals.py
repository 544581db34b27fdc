"""Datasets a resumable loader cannot drive are refused when the loader is built, and a
position that cannot be taken is not reported as a fetch a retry would fix."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import IterableDataset

from trainer_resume.errors import LoaderFetchFailedError, UnsupportedResumeConfigurationError
from trainer_resume.loaders import ResumableDataLoader


class CountedStream(IterableDataset):
    """Keeps its position for a loader of another library, which passes the counts in."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        return iter(range(self.position, 20))

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        return {"position": num_samples}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class BrokenStateStream(IterableDataset):
    """Its own iterator; its ``state_dict()`` fails every time, as no retry can fix."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        self.position = 0
        return self

    def __next__(self) -> torch.Tensor:
        if self.position == 20:
            raise StopIteration
        self.position += 1
        return torch.tensor(self.position)

    def state_dict(self) -> dict:
        raise RuntimeError("the position lives elsewhere")

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_whose_state_dict_needs_arguments_is_refused_when_the_loader_is_built(
    workers: int,
) -> None:
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(CountedStream(), batch_size=4, num_workers=workers, resumable=True)
    assert caught.value.code == 332
    assert caught.value.detail == (
        "CountedStream is an IterableDataset whose state_dict() needs arguments (num_samples, "
        "from_beginning): its position is passed in by another library's loader, which a "
        "ResumableDataLoader cannot drive; give the dataset a state_dict() without arguments and "
        "load_state_dict() (torchdata's Stateful protocol), use a dataset a ResumableDataLoader "
        "drives (litdata's or MosaicML's StreamingDataset), or keep the library's own loader and "
        "return it from _resume_loaders(), declared with "
        "trainer_resume.declare_no_random_draws(loader) if its samples draw no random numbers "
        "(docs/streaming.md)"
    )


def test_the_same_dataset_is_taken_without_resumable_mode() -> None:
    loader = ResumableDataLoader(CountedStream(), batch_size=4)
    assert [batch.tolist() for batch in loader][0] == [0, 1, 2, 3]


_STATE_FAILED = (
    "BrokenStateStream.state_dict() failed (RuntimeError: the position lives elsewhere), so the "
    "delivered position cannot be recorded (a retry would fail the same way); give the dataset "
    "a state_dict() that takes no arguments and returns its position as plain data (torchdata's "
    "Stateful protocol)"
)


def test_a_state_dict_that_fails_is_refused_when_the_loader_without_workers_is_built() -> None:
    # With 0 workers the dataset's state (where a pass starts) is taken at construction.
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(BrokenStateStream(), batch_size=4, resumable=True)
    assert caught.value.detail == _STATE_FAILED


def test_a_state_dict_that_fails_in_a_worker_is_refused_not_offered_a_retry() -> None:
    loader = ResumableDataLoader(BrokenStateStream(), batch_size=4, num_workers=2, resumable=True)
    for _ in range(2):  # close() then iter(), as 335 would advise, is refused the same way
        with pytest.raises(UnsupportedResumeConfigurationError) as caught:
            next(iter(loader))
        assert not isinstance(caught.value, LoaderFetchFailedError)
        assert caught.value.detail == _STATE_FAILED
        loader.close()
