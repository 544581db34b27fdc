"""The 2**63-sample cursor limit holds on every path that moves a cursor, not only advance()."""

from __future__ import annotations

import pytest

from trainer_resume.errors import LoaderCommitFailedError
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    build_batch_sampler,
)

LIMIT = 2**63
SIZE = 10
BATCH = 4


def _sampler_near_limit(distance: int) -> InfiniteRandomSampler:
    sampler = InfiniteRandomSampler(list(range(SIZE)), resumable=True)
    state = sampler.state_dict()
    consumed = LIMIT - distance
    state.update(consumed=consumed, cycle=consumed // SIZE, offset=consumed % SIZE)
    sampler.load_state_dict(state)
    return sampler


def test_loader_commit_that_would_reach_the_limit_fails_and_leaves_a_loadable_state():
    # One full batch still fits below the limit; the next one would end at 2**63 + 2.
    sampler = _sampler_near_limit(BATCH + 2)
    loader = ResumableDataLoader(
        list(range(SIZE)), batch_size=BATCH, sampler=sampler, resumable=True
    )
    iterator = iter(loader)
    next(iterator)
    saved = loader.state_dict()
    assert saved["sampler"]["consumed"] == LIMIT - 2
    with pytest.raises(LoaderCommitFailedError) as caught:
        next(iterator)
    assert "2**63" in str(caught.value)
    # The cursor did not move past the limit: the last recorded state still loads.
    assert sampler.state_dict()["consumed"] == LIMIT - 2
    fresh = _sampler_near_limit(BATCH + 2)
    fresh.load_state_dict(sampler.state_dict())
    loader.load_state_dict(saved)  # the documented recovery after a failed commit


@pytest.mark.parametrize("position", [LIMIT, LIMIT + 5])
def test_sampler_commit_at_or_past_the_limit_is_refused_and_changes_nothing(position):
    sampler = _sampler_near_limit(3)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="2\\*\\*63"):
        sampler.commit(position)
    assert sampler.state_dict() == before
    sampler.commit(LIMIT - 1)
    assert sampler.state_dict()["consumed"] == LIMIT - 1


def test_batch_sampler_commit_past_the_limit_is_refused_and_changes_nothing():
    batch_sampler = build_batch_sampler(
        "naive",
        list(range(SIZE)),
        BATCH,
        repeat=True,
        shuffle=True,
        drop_last=False,
        resumable=True,
    )
    per_cycle = batch_sampler.batches_per_cycle
    samples_per_cycle = batch_sampler.consumed_at(1, 0)
    cycle = LIMIT // samples_per_cycle + 1
    before = batch_sampler.state_dict()
    with pytest.raises(ValueError, match="2\\*\\*63"):
        batch_sampler.commit(cycle, 0)
    assert batch_sampler.state_dict() == before
    batch_sampler.commit(1, per_cycle - 1)
    assert batch_sampler.state_dict()["offset"] == per_cycle - 1
