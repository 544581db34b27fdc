"""prepare_loader does what accelerator.prepare does for a data loader, and stays resumable."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.data_loader import BatchSamplerShard
from support.accelerate_loop import NoisyDataset, fresh_accelerate_state
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from trainer_resume.adapters.accelerate import PreparedLoader, prepare_loader
from trainer_resume.errors import ResumableModeRequiredError, UnsupportedResumeConfigurationError
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    ShardedBatchSampler,
)

BATCH = 4  # NoisyDataset has 40 samples: 10 batches per epoch


@pytest.fixture(autouse=True)
def _fresh_accelerate():
    fresh_accelerate_state()
    yield
    fresh_accelerate_state()


def _resumable(seed: int = 11, **options) -> ResumableDataLoader:
    return ResumableDataLoader(
        NoisyDataset(),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        resumable=True,
        **options,
    )


def _loop(accelerator: Accelerator, loader, epochs: int) -> list[dict]:
    """What an Accelerate loop sees per micro-step: batch, sync decision, end of data, remainder."""
    model = torch.nn.Linear(6, 1)
    seen = []
    for _ in range(epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                seen.append(
                    {
                        "ids": batch[2].tolist(),
                        "sync": accelerator.sync_gradients,
                        "end": accelerator.gradient_state.end_of_dataloader,
                        "remainder": accelerator.gradient_state.remainder,
                        "gathered": accelerator.gather_for_metrics(batch[2]).tolist(),
                    }
                )
        seen.append({"in_dataloader": accelerator.gradient_state.in_dataloader})
    return seen


def test_with_one_process_the_prepared_loader_reads_exactly_what_the_loader_reads():
    accelerator = Accelerator(cpu=True)
    unprepared = _resumable()
    expected = [list(unprepared) for _ in range(2)]
    prepared = prepare_loader(accelerator, _resumable(num_workers=2))
    assert isinstance(prepared, PreparedLoader)
    assert len(prepared) == 10
    for epoch in range(2):
        got = list(prepared)
        assert len(got) == len(expected[epoch])
        for a, b in zip(expected[epoch], got):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            assert all(part.device == accelerator.device for part in b)


def test_accumulation_windows_and_the_end_of_data_follow_accelerates_own_prepared_loader():
    # The same loop over Accelerate's DataLoaderShard (a plain DataLoader through prepare)
    # and over the prepared resumable loader: each micro-step syncs at the same place
    # (every 4th, and at the end of each 10-batch epoch), the end of the data and the
    # remainder are reported alike, and the loader is unregistered after each epoch.
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    plain = accelerator.prepare(DataLoader(NoisyDataset(), batch_size=BATCH))
    theirs = _loop(accelerator, plain, 2)
    fresh_accelerate_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    ours = _loop(
        accelerator,
        prepare_loader(accelerator, ResumableDataLoader(NoisyDataset(), BATCH, resumable=True)),
        2,
    )
    assert ours == theirs
    assert [step["sync"] for step in ours[:10]] == [False, False, False, True] * 2 + [False, True]
    assert ours[10] == {"in_dataloader": False}


def test_a_pause_mid_epoch_resumes_the_rest_of_the_epoch_and_the_end_of_data_with_it():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    expected = _loop(accelerator, prepare_loader(accelerator, _resumable()), 2)
    fresh_accelerate_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    first = prepare_loader(accelerator, _resumable())
    iterator = iter(first)
    for _ in range(7):
        next(iterator)
    state = first.state_dict()
    del iterator
    fresh_accelerate_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    accelerator.step = 7  # what accelerator_state restores with the loader
    resumed = prepare_loader(accelerator, _resumable(seed=99))
    resumed.load_state_dict(state)
    assert _loop(accelerator, resumed, 2)[:4] == expected[7:11]


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_shard_of_each_process_is_accelerates_batch_sampler_shard(replicas, drop_last):
    for size in range(1, 30):
        for batch_size in (1, 3, 4):
            batches = BatchSampler(SequentialSampler(range(size)), batch_size, drop_last)
            for rank in range(replicas):
                ours = ShardedBatchSampler(batches, num_replicas=replicas, rank=rank)
                theirs = BatchSamplerShard(batches, replicas, rank, False, True)
                assert list(ours) == list(theirs), (size, batch_size, rank)
                assert len(ours) == len(theirs) == len(list(theirs)), (size, batch_size, rank)


@pytest.mark.parametrize(
    ("config", "detail"),
    [
        (
            {"split_batches": True},
            "prepare_loader does not reproduce Accelerator DataLoaderConfiguration(split_batches)=True: "
            "prepare_loader shares whole batches among the processes, as with the default; leave "
            "split_batches=False (the default)",
        ),
        (
            {"dispatch_batches": True},
            "prepare_loader does not reproduce Accelerator DataLoaderConfiguration(dispatch_batches)=True: "
            "every process reads its own batches from its own loader; batches dispatched from the main "
            "process are not reproduced; leave dispatch_batches=None (the default)",
        ),
        (
            {"use_seedable_sampler": True},
            "prepare_loader does not reproduce Accelerator DataLoaderConfiguration(use_seedable_sampler)=True: "
            "the prepared loader records its sampler's order exactly, so a SeedableRandomSampler is not "
            "needed, and its order would differ; leave use_seedable_sampler=False (the default)",
        ),
        (
            {"use_stateful_dataloader": True},
            "prepare_loader does not reproduce Accelerator DataLoaderConfiguration(use_stateful_dataloader)=True: "
            "the prepared loader saves its own delivered position; a StatefulDataLoader's state is not used; "
            "leave use_stateful_dataloader=False (the default)",
        ),
    ],
)
def test_dataloader_configuration_options_that_are_not_reproduced_are_refused(config, detail):
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        prepare_loader(accelerator, _resumable())
    assert caught.value.code == 332
    assert caught.value.detail == detail


def test_honoured_options_are_taken_and_even_batches_has_no_effect_in_one_process():
    accelerator = Accelerator(
        cpu=True,
        device_placement=False,
        dataloader_config=DataLoaderConfiguration(even_batches=False, non_blocking=True),
    )
    prepared = prepare_loader(accelerator, _resumable())
    assert prepared.device is None and prepared.non_blocking is True
    assert len(list(prepared)) == 10


def test_only_a_resumable_loader_that_has_not_delivered_is_prepared():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError) as caught:
        prepare_loader(accelerator, DataLoader(NoisyDataset()))  # type: ignore[arg-type]
    assert str(caught.value) == (
        "prepare_loader takes a ResumableDataLoader(..., resumable=True), got DataLoader; a plain "
        "DataLoader goes through accelerator.prepare"
    )
    with pytest.raises(ResumableModeRequiredError) as refused:
        prepare_loader(accelerator, ResumableDataLoader(NoisyDataset(), BATCH))
    assert refused.value.code == 331
    assert (
        refused.value.detail
        == "prepare_loader needs a ResumableDataLoader built with resumable=True"
    )
    started = _resumable()
    next(iter(started))
    with pytest.raises(ValueError) as delivered:
        prepare_loader(accelerator, started)
    assert str(delivered.value) == (
        "the loader has delivered 1 batch(es) already; prepare it before iterating it, and load "
        "saved states into the prepared loader"
    )


def test_a_loader_sharded_for_another_world_is_refused():
    accelerator = Accelerator(cpu=True)
    dataset = NoisyDataset()
    sampler = InfiniteRandomSampler(dataset, num_replicas=2, rank=1, resumable=True)
    loader = ResumableDataLoader(dataset, batch_size=BATCH, sampler=sampler, resumable=True)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        prepare_loader(accelerator, loader)
    assert caught.value.detail == (
        "the loader's InfiniteRandomSampler is sharded for rank 1 of 2, but this is process 0 of 1; "
        "build it after the Accelerator (it then shards by the Accelerator's process group) or pass "
        "num_replicas=1, rank=0"
    )


def test_a_loader_sharded_by_itself_is_kept_as_it_is():
    accelerator = Accelerator(cpu=True)
    dataset = NoisyDataset()
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    loader = ResumableDataLoader(dataset, batch_size=BATCH, sampler=sampler, resumable=True)
    assert prepare_loader(accelerator, loader).loader is loader


def test_the_prepared_loader_says_when_its_epoch_ended():
    # What the trainer reads to land a pause requested on an epoch's last batch after
    # the loop's epoch-end work.
    prepared = prepare_loader(Accelerator(cpu=True), _resumable())
    assert [prepared.epoch_ended for _ in prepared] == [False] * 9 + [True]
