"""ResumableDataLoader over torch's samplers: each iter(loader) is one epoch, resumed exactly."""

from __future__ import annotations

import io

import pytest
import torch
from support import epoch_streams as epochs
from support import loader_streams as streams
from torch.utils.data import DataLoader, DistributedSampler

from trainer_resume.errors import (
    IteratorInvalidatedError,
    LoaderStateError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    build_batch_sampler,
)
from trainer_resume.testing import first_difference


def _assert_same(expected: list, got: list, what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches instead of {len(expected)}"
    for number, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"{what}: batch {number} differs"


def _uninterrupted(kind: str, batch_size: int | None, **options):
    torch.manual_seed(0)
    loader = epochs.make_loader(kind, batch_size, **options)
    before = loader.state_dict()
    after_loops: list = []
    batches, states = epochs.run_epochs(loader, after=after_loops)
    loader.close()
    return batches, [before, *states], after_loops


def _pause_points(batches_per_epoch: int, total: int) -> list[int]:
    """0, 1, 10 batches and the end of the first epoch (all below the total)."""
    return sorted({k for k in (0, 1, 10, batches_per_epoch) if k < total})


def _resume(kind: str, batch_size: int | None, state: dict, seed: int = 1234, **options) -> list:
    torch.manual_seed(seed)  # unlike the uninterrupted run: the state must fix every order
    loader = epochs.make_loader(kind, batch_size, **options)
    loader.load_state_dict(state)
    batches, _ = epochs.run_epochs(loader)
    loader.close()
    return batches


@pytest.mark.parametrize("batch_size", [7, None])
@pytest.mark.parametrize("kind", epochs.KINDS)
def test_resume_in_a_fresh_loader_continues_the_uninterrupted_epoch_loop(kind, batch_size):
    if kind in epochs.BATCH_SAMPLER_KINDS and batch_size is None:
        pytest.skip("a batch sampler fixes its own batch size")
    batches, states, _ = _uninterrupted(kind, batch_size)
    per_epoch = len(epochs.make_loader(kind, batch_size))
    assert len(batches) == epochs.EPOCHS * per_epoch
    for k in _pause_points(per_epoch, len(batches)):
        _assert_same(
            batches[k:],
            _resume(kind, batch_size, states[k]),
            f"{kind} paused after {k}",
        )


@pytest.mark.parametrize("kind", ["shuffle", "random-generator", "weighted", "distributed"])
def test_a_state_taken_after_an_epoch_loop_resumes_at_the_first_batch_of_the_next_epoch(
    kind,
):
    batches, states, after_loops = _uninterrupted(kind, 7)
    per_epoch = len(batches) // epochs.EPOCHS
    assert (
        first_difference(states[per_epoch], after_loops[0]) is None
    )  # after the loop == after its last batch
    assert after_loops[0]["sampler"]["epoch"] == 1 and after_loops[0]["sampler"]["offset"] == 0
    _assert_same(batches[per_epoch:], _resume(kind, 7, after_loops[0]), kind)


def test_the_epoch_orders_do_not_depend_on_the_global_seed_after_a_resume():
    # shuffle=True without a generator: every later epoch's order comes from the state.
    batches, states, _ = _uninterrupted("shuffle", 7)
    first = _resume("shuffle", 7, states[1], seed=1)
    second = _resume("shuffle", 7, states[1], seed=2)
    _assert_same(batches[1:], first, "seed 1")
    _assert_same(batches[1:], second, "seed 2")


@pytest.mark.parametrize("kind", ["shuffle", "random-generator", "batch-sampler"])
def test_every_epoch_of_an_uninterrupted_run_is_a_new_order(kind):
    batches, _, _ = _uninterrupted(kind, 7)
    per_epoch = len(batches) // epochs.EPOCHS
    orders = [
        torch.cat([b[:-1, 0] for b in batches[e * per_epoch : (e + 1) * per_epoch]])
        for e in range(3)
    ]
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])


@pytest.mark.parametrize("kind", ["shuffle", "sequential", "distributed"])
def test_a_consumer_that_stops_after_len_batches_gets_full_epochs(kind):
    torch.manual_seed(0)
    reference = epochs.make_loader(kind)
    expected, _ = epochs.run_epochs(reference)
    torch.manual_seed(0)
    loader = epochs.make_loader(kind)
    got = []
    for epoch in range(epochs.EPOCHS):
        if kind == "distributed":
            loader.sampler.set_epoch(epoch)
        iterator = iter(loader)
        got.extend(next(iterator) for _ in range(len(loader)))  # never asks for the end
    _assert_same(expected, got, kind)


def test_a_batch_sampler_without_repeat_gives_full_cycles_to_a_consumer_that_stops_after_len_batches():
    torch.manual_seed(0)
    loader = streams.make_loader("naive", repeat=False)
    full = [list(loader) for _ in range(2)]
    torch.manual_seed(0)
    loader = streams.make_loader("naive", repeat=False)
    counted = []
    for _ in range(2):
        iterator = iter(loader)
        counted.append([next(iterator) for _ in range(len(loader))])
    assert len(full[1]) == len(counted[1]) == len(loader) == 3
    _assert_same(full[0] + full[1], counted[0] + counted[1], "naive")


def test_an_iterator_replaced_before_its_first_batch_keeps_the_loaded_position():
    batches, states, _ = _uninterrupted("shuffle", 7)
    torch.manual_seed(5)
    loader = epochs.make_loader("shuffle")
    loader.load_state_dict(states[2])
    first = iter(loader)
    second = iter(loader)  # a trainer rebuilding its iterator after the resume
    with pytest.raises(IteratorInvalidatedError):
        next(first)
    got = list(second)
    _assert_same(batches[2:4], got, "rest of the resumed epoch")
    assert loader.epoch == 1


def test_an_iterator_replaced_after_delivering_ends_its_epoch_as_with_dataloader():
    batches, _, _ = _uninterrupted("shuffle", 7)
    torch.manual_seed(0)
    loader = epochs.make_loader("shuffle")
    first = next(iter(loader))  # leave the first epoch after one batch
    assert torch.equal(first, batches[0])
    assert (loader.epoch, loader.state_dict()["sampler"]["offset"]) == (
        0,
        1,
    )  # a pause here resumes epoch 0
    second_epoch = list(loader)
    _assert_same(batches[4:8], second_epoch, "second epoch")
    assert loader.epoch == 2


def test_distributed_sampler_state_records_its_epoch_and_a_set_epoch_after_loading_is_honoured():
    batches, states, _ = _uninterrupted("distributed", 7)
    per_epoch = len(batches) // epochs.EPOCHS
    state = states[per_epoch + 1]  # one batch into epoch 1
    assert state["sampler"]["sampler_epoch"] == 1
    loader = epochs.make_loader("distributed")
    loader.load_state_dict(state)
    assert loader.sampler.epoch == 1  # restored, so a loop without set_epoch is right too
    loader.sampler.set_epoch(1)  # the usual call at the top of the resumed epoch
    _assert_same(batches[per_epoch + 1 : 2 * per_epoch], list(loader), "rest of epoch 1")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_made_before_set_epoch_at_an_epoch_start_leaves_the_next_iter_to_the_new_epoch(
    workers,
):
    # A resumed Lightning fit's order at a pause after an epoch's last batch: the state is
    # loaded, the train iterator made (FitLoop.setup_data), then set_epoch(next) and iter().
    batches, states, _ = _uninterrupted("distributed", 7)
    per_epoch = len(batches) // epochs.EPOCHS
    state = states[per_epoch]  # after epoch 0's last batch: epoch 1's start
    assert (state["sampler"]["epoch"], state["sampler"]["offset"]) == (1, 0)
    loader = epochs.make_loader("distributed", num_workers=workers)
    loader.load_state_dict(state)
    iter(loader)  # before the loop sets the epoch
    loader.sampler.set_epoch(1)
    _assert_same(batches[per_epoch : 2 * per_epoch], list(loader), "epoch 1")
    loader.sampler.set_epoch(2)
    _assert_same(batches[2 * per_epoch :], list(loader), "epoch 2")
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_between_iter_and_the_first_batch_orders_the_epoch_as_dataloader_does(workers):
    # DataLoader reads its sampler at the first batch without workers (the epoch set
    # after iter() counts), and as iter() starts its workers' prefetch with them.
    dataset = torch.utils.data.TensorDataset(torch.arange(16))

    def epochs_of(kind: type, **options) -> list[list[list[int]]]:
        sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
        loader = kind(dataset, batch_size=2, sampler=sampler, num_workers=workers, **options)
        read = []
        for epoch in range(3):
            batches = iter(loader)
            sampler.set_epoch(epoch)
            read.append([batch[0].tolist() for batch in batches])
        return read

    expected = epochs_of(DataLoader)
    assert expected[0] != expected[2]  # the epochs are ordered apart
    assert epochs_of(ResumableDataLoader, resumable=True) == expected


def test_a_set_epoch_to_another_epoch_before_a_mid_epoch_resume_is_refused_naming_the_fix():
    _, states, _ = _uninterrupted("distributed", 7)
    loader = epochs.make_loader("distributed")
    loader.load_state_dict(states[1])
    loader.sampler.set_epoch(4)
    with pytest.raises(LoaderStateError) as caught:
        iter(loader)
    assert caught.value.code == 333 and "call set_epoch(0)" in str(caught.value)


def test_len_is_the_batches_of_one_epoch():
    for kind, expected in [
        ("shuffle", 4),
        ("random-replacement", 3),
        ("subset", 3),
        ("batch-sampler", 3),
    ]:
        loader = epochs.make_loader(kind)
        assert len(loader) == expected == len(epochs.run_epochs(loader, 1)[0]), kind


@pytest.mark.parametrize("kind", ["shuffle", "random-generator", "distributed"])
def test_epoch_state_round_trips_through_weights_only_torch_load(kind):
    _, states, _ = _uninterrupted(kind, 7)
    state = states[5]
    if state["sampler"]["generator"] is None:
        streams.assert_plain_data(state)
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        assert first_difference(state, torch.load(buffer, weights_only=True)) is None


@pytest.mark.parametrize(
    ("source", "target", "match"),
    [
        pytest.param("shuffle", "sequential", "setting 'sampler'", id="other-sampler"),
        pytest.param("shuffle", "shuffle-generator", "setting 'generator'", id="generator-added"),
        pytest.param("random-generator", "random-replacement", "setting", id="replacement"),
    ],
)
def test_a_state_of_another_sampler_configuration_is_refused_and_changes_nothing(
    source, target, match
):
    _, states, _ = _uninterrupted(source, 7)
    loader = epochs.make_loader(target)
    before = loader.state_dict()
    with pytest.raises(LoaderStateError, match=match):
        loader.load_state_dict(states[2])
    assert first_difference(before, loader.state_dict()) is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param({"offset": 4}, "offset", id="offset-past-the-epoch"),
        pytest.param(
            {"generator": torch.zeros(3, dtype=torch.uint8)},
            "generator",
            id="generator-state",
        ),
        pytest.param({"generator": None}, "generator", id="missing-generator-state"),
        pytest.param({"epoch": -1}, "epoch", id="negative-epoch"),
    ],
)
def test_a_malformed_epoch_state_is_refused_before_anything_changes(change, match):
    _, states, _ = _uninterrupted("random-generator", 7)
    state = {**states[2], "sampler": {**states[2]["sampler"], **change}}
    loader = epochs.make_loader("random-generator")
    generator_before = loader.sampler.generator.get_state()
    with pytest.raises(LoaderStateError, match=match):
        loader.load_state_dict(state)
    assert torch.equal(loader.sampler.generator.get_state(), generator_before)


def test_a_batch_sampler_over_an_infinite_sampler_is_refused():
    dataset = streams.AugmentedDataset()
    inner = InfiniteRandomSampler(dataset, resumable=True)
    with pytest.raises(UnsupportedResumeConfigurationError, match="give it state_dict"):
        ResumableDataLoader(
            dataset,
            batch_sampler=torch.utils.data.BatchSampler(inner, 2, False),
            resumable=True,
        )


def test_endless_batch_samplers_keep_one_shared_stream():
    loader = streams.make_loader("naive")
    assert iter(loader) is iter(loader)
    loader = epochs.make_loader("shuffle")
    assert iter(loader) is not iter(loader)
    _ = build_batch_sampler  # the endless form stays available next to the epoch form
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    assert not isinstance(loader.sampler, DistributedSampler)


@pytest.mark.slow
def test_resume_in_a_new_process_continues_the_uninterrupted_epoch_loop(tmp_path):
    jobs, expected = [], []
    for kind, batch_size in [
        ("shuffle", 7),
        ("random-generator", None),
        ("distributed", 7),
        ("weighted", 7),
        ("stateful-batch-sampler", None),
    ]:
        batches, states, _ = _uninterrupted(kind, batch_size)
        per_epoch = len(batches) // epochs.EPOCHS
        for k in (1, per_epoch):
            jobs.append((kind, batch_size, states[k]))
            expected.append((f"{kind}/{k}", batches[k:]))
    results = streams.run_spawned(epochs.resume_epoch_jobs, jobs, out=tmp_path / "resumed.pt")[
        "results"
    ]
    for (what, batches), got in zip(expected, results):
        _assert_same(batches, got, what)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["shuffle", "distributed", "stateful"])
def test_three_workers_give_the_single_process_epochs_and_resume_exactly(kind, persistent):
    single, _, _ = _uninterrupted(kind, 7)
    options = {"persistent_workers": persistent, "prefetch_factor": 3}
    batches, states, _ = _uninterrupted(kind, 7, num_workers=3, **options)
    _assert_same(single, batches, "3 workers vs none")
    per_epoch = len(batches) // epochs.EPOCHS
    for k in (1, per_epoch):
        _assert_same(
            batches[k:],
            _resume(kind, 7, states[k], num_workers=3, **options),
            f"{kind} at {k}",
        )


@pytest.mark.parametrize("num_samples", [None, 30])
def test_a_random_sampler_with_a_generator_gives_dataloaders_order(num_samples):
    dataset = streams.AugmentedDataset(epochs.SIZE)

    def order(cls, **options):
        generator = torch.Generator()
        generator.manual_seed(21)
        sampler = torch.utils.data.RandomSampler(
            dataset, num_samples=num_samples, generator=generator
        )
        loader = cls(dataset, batch_size=5, sampler=sampler, **options)
        return [
            torch.cat([batch[:, 0] for batch in loader]) for _ in range(2)
        ], generator.get_state()

    (theirs, their_state), (ours, our_state) = (
        order(DataLoader),
        order(ResumableDataLoader, resumable=True),
    )
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours)) and torch.equal(
        their_state, our_state
    )


def test_a_state_its_stateful_sampler_refuses_is_a_loader_state_error_and_moves_nothing():
    _, states, _ = _uninterrupted("stateful", 7)
    state = {**states[2], "sampler": {**states[2]["sampler"], "sampler_state": {"passes": 0}}}
    loader = epochs.make_loader("stateful")
    before = loader.state_dict()
    with pytest.raises(LoaderStateError, match="ShuffleWithState.load_state_dict"):
        loader.load_state_dict(state)
    assert loader.state_dict() == before


def test_a_stateful_sampler_state_is_the_one_after_the_last_delivered_batch():
    # Prefetch draws ahead; the saved sampler state is the one after the last delivered batch.
    _, states, _ = _uninterrupted("stateful", 7, num_workers=0)
    assert [state["sampler"]["sampler_state"] for state in states[:6]] == [
        {"passes": 0, "yielded": 0},
        {"passes": 0, "yielded": 7},
        {"passes": 0, "yielded": 14},
        {"passes": 0, "yielded": 21},
        {"passes": 1, "yielded": 0},  # after the last batch of the pass: the pass has ended
        {"passes": 1, "yielded": 7},
    ]
