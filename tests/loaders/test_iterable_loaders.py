"""ResumableDataLoader over stateful IterableDatasets: each iter(loader) is one pass, resumed exactly."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest
import torch
from support import iterable_streams as iterables
from support import loader_streams as streams
from torch import nn
from torch.utils.data import DataLoader, get_worker_info

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.errors import (
    IteratorInvalidatedError,
    LoaderFetchFailedError,
    LoaderStateError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.testing import assert_training_resume, first_difference

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _pause_points(per_pass: int, total: int) -> list[int]:
    """0, 1, 10 batches and the end of the first pass (all below the total)."""
    return sorted({k for k in (0, 1, 10, per_pass) if k < total})


def _per_pass(batches: list) -> int:
    assert len(batches) % iterables.EPOCHS == 0
    return len(batches) // iterables.EPOCHS


@pytest.mark.parametrize("batch_size", [7, None])
@pytest.mark.parametrize("kind", ["dataset-state", "iterator-state"])
def test_resume_in_a_fresh_loader_continues_the_uninterrupted_pass_loop(kind, batch_size):
    batches, states, _ = iterables.uninterrupted(kind, batch_size)
    per_pass = _per_pass(batches)
    assert per_pass == (5 if batch_size else 35)
    for k in _pause_points(per_pass, len(batches)):
        iterables.assert_same_batches(
            batches[k:], iterables.resumed(kind, batch_size, 0, False, states[k]), f"{kind} at {k}"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "batch_size", "persistent"),
    [
        ("dataset-state", 7, False),
        ("dataset-state", 7, True),
        ("dataset-state", None, False),
        ("dataset-state", None, True),
        ("iterator-state", 7, True),
    ],
)
def test_three_workers_with_uneven_shares_resume_the_uninterrupted_passes(
    kind, batch_size, persistent
):
    batches, states, _ = iterables.uninterrupted(kind, batch_size, 3, persistent)
    per_pass = _per_pass(batches)
    assert per_pass == (6 if batch_size else 35)
    for k in _pause_points(per_pass, len(batches)):
        iterables.assert_same_batches(
            batches[k:],
            iterables.resumed(kind, batch_size, 3, persistent, states[k]),
            f"{kind}, persistent={persistent}, at {k}",
        )


@pytest.mark.slow
def test_the_prefetch_depth_changes_neither_the_batches_nor_the_resume():
    def run(prefetch_factor, state=None):
        torch.manual_seed(0)
        loader = iterables.make_loader("dataset-state", 7, 3, prefetch_factor=prefetch_factor)
        if state is not None:
            loader.load_state_dict(state)
        return iterables.run_passes(loader)

    shallow, _ = run(1)
    deep, states = run(4)
    iterables.assert_same_batches(shallow, deep, "prefetch 4 vs 1")
    for k in (1, 10):
        iterables.assert_same_batches(
            deep[k:], run(1, states[k - 1])[0], f"prefetch 4 resumed with 1 at {k}"
        )


@pytest.mark.parametrize(
    ("num_workers", "persistent"),
    [
        (0, False),
        pytest.param(3, False, marks=pytest.mark.slow),
        pytest.param(3, True, marks=pytest.mark.slow),
    ],
)
def test_kept_copies_carry_their_state_into_the_next_pass_and_fresh_worker_copies_do_not(
    num_workers, persistent
):
    batches, _, _ = iterables.uninterrupted("dataset-state", 7, num_workers, persistent)
    per_pass = _per_pass(batches)
    fresh_copies = num_workers > 0 and not persistent
    for number, batch in enumerate(batches):
        # Column 1 is the pass counter of the copy that read the row.
        expected = 0 if fresh_copies else number // per_pass
        assert batch[:, 1].eq(expected).all(), f"batch {number}"


@pytest.mark.parametrize("num_workers", [0, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("batch_size", [7, None])
def test_the_batches_are_dataloaders_in_dataloaders_order(num_workers, batch_size):
    def ids(cls, **options):
        loader = cls(
            iterables.CountingStream(),
            batch_size=batch_size,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            **options,
        )
        return [batch[..., :2].tolist() for _ in range(2) for batch in loader]

    assert ids(ResumableDataLoader, resumable=True) == ids(DataLoader)


def test_drop_last_drops_each_workers_partial_batch_as_dataloader_does():
    def ids(cls, **options):
        loader = cls(iterables.CountingStream(), batch_size=7, drop_last=True, **options)
        return [batch[:, 0].tolist() for batch in loader]

    got = ids(ResumableDataLoader, resumable=True)
    assert got == ids(DataLoader) and len(got) == 5
    loader = ResumableDataLoader(
        iterables.CountingStream(), batch_size=6, drop_last=True, resumable=True
    )
    torch.manual_seed(0)
    batches, states = iterables.run_passes(loader)
    resumed = ResumableDataLoader(
        iterables.CountingStream(), batch_size=6, drop_last=True, resumable=True
    )
    resumed.load_state_dict(states[6])
    iterables.assert_same_batches(
        batches[7:], iterables.run_passes(resumed)[0], "drop_last resumed"
    )


@pytest.mark.parametrize("num_workers", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_a_state_after_the_last_batch_of_a_pass_resumes_at_the_first_batch_of_the_next(
    num_workers,
):
    batches, states, after_loops = iterables.uninterrupted("dataset-state", 7, num_workers)
    per_pass = _per_pass(batches)
    inside = states[per_pass]  # taken in the loop, right after the pass's last batch
    assert first_difference(inside, after_loops[0]) is None
    assert (inside["sampler"]["epoch"], inside["sampler"]["offset"]) == (1, 0)
    iterables.assert_same_batches(
        batches[per_pass:],
        iterables.resumed("dataset-state", 7, num_workers, False, inside),
        "next",
    )


def test_the_epoch_counter_comes_back_with_the_state():
    batches, states, _ = iterables.uninterrupted("dataset-state", 7)
    loader = iterables.make_loader("dataset-state", 7)
    loader.load_state_dict(states[7])
    assert loader.epoch == 1
    loader.load_state_dict(states[5])  # after the last batch of pass 0
    assert loader.epoch == 1
    loader.load_state_dict(states[0])
    assert loader.epoch == 0


def test_the_state_counts_delivered_batches_not_the_batch_read_ahead():
    torch.manual_seed(0)
    loader = iterables.make_loader("dataset-state", 7)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()  # reads the second batch ahead to know the pass goes on
    assert state["delivered_batches"] == 1 and state["sampler"]["offset"] == 1
    assert state["sampler"]["workers"][0]["dataset_state"] == {"position": 7, "passes": 0}
    assert first_difference(loader.state_dict(), state) is None  # asking again reads nothing more
    second = next(iterator)
    assert second[0, 0] == 7 and loader.state_dict()["sampler"]["offset"] == 2


def test_a_consumer_that_stops_after_the_passs_last_batch_gets_full_passes():
    batches, _, _ = iterables.uninterrupted("dataset-state", 7)
    torch.manual_seed(0)
    loader = iterables.make_loader("dataset-state", 7)
    got = []
    for _ in range(iterables.EPOCHS):
        iterator = iter(loader)
        got.extend(next(iterator) for _ in range(5))  # never asks for the end
    iterables.assert_same_batches(batches, got, "passes read without their end")


def test_an_iterator_replaced_before_its_first_batch_keeps_the_loaded_position():
    batches, states, _ = iterables.uninterrupted("dataset-state", 7)
    loader = iterables.make_loader("dataset-state", 7)
    loader.load_state_dict(states[2])
    first = iter(loader)
    second = iter(loader)  # a trainer rebuilding its iterator after the resume
    with pytest.raises(IteratorInvalidatedError):
        next(first)
    iterables.assert_same_batches(batches[2:5], list(second), "rest of the resumed pass")
    assert loader.epoch == 1


def test_an_iterator_replaced_after_delivering_ends_its_pass_at_the_delivered_position():
    torch.manual_seed(0)
    loader = iterables.make_loader("dataset-state", 7)
    next(iter(loader))
    loader.state_dict()  # reads a batch ahead, which must not count
    got = iterables.run_passes(loader, 2)[0]  # two loops: the replacement starts pass 1
    assert loader.epoch == 3
    # The next pass starts from the copy as delivered: position 7 of pass 0.
    assert [int(row[0]) for row in got[0]] == list(range(7, 14))
    torch.manual_seed(0)
    without_look_ahead = iterables.make_loader("dataset-state", 7)
    next(iter(without_look_ahead))
    iterables.assert_same_batches(
        got, iterables.run_passes(without_look_ahead, 2)[0], "after a replaced iterator"
    )


@pytest.mark.parametrize("kind", ["dataset-state", "iterator-state"])
def test_iterable_state_round_trips_through_weights_only_torch_load_and_json(kind):
    _, states, _ = iterables.uninterrupted(kind, 7)
    for state in (states[0], states[3], states[5]):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        assert first_difference(torch.load(buffer, weights_only=True), state) is None
        # The copies' generator states are tensors; everything else is JSON as well.
        workers = [
            {key: value for key, value in record.items() if key != "generators"}
            for record in state["sampler"]["workers"]
        ]
        plain = {**state, "sampler": {**state["sampler"], "workers": workers}}
        assert json.loads(json.dumps(plain)) == plain
    assert states[3]["sampler"]["workers"][0]["generators"]["format"] == "trainer_resume.rng/1"


def test_augmentation_draws_leave_the_callers_generators_as_they_were_with_zero_workers():
    loader = iterables.make_loader("dataset-state", 7)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    batches = []
    for batch in loader:
        batches.append(batch)
        loader.state_dict()  # reads the next batch ahead, in the caller's process too
    got = (random.random(), float(np.random.rand()), float(torch.rand(())))
    assert got == expected and len(batches) == 5
    assert len({float(batch[0, 2]) for batch in batches}) == 5  # reseeded per batch


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param({"next_worker": 1}, "next_worker", id="worker-out-of-range"),
        pytest.param({"offset": 3}, "delivered 2 batch", id="offset-not-the-workers-sum"),
        pytest.param({"workers": []}, "workers", id="workers-missing"),
        pytest.param(
            {"format": "trainer_resume.iterable_dataset/1"},
            "saved by an earlier version, which seeded each batch of an IterableDataset",
            id="earlier-format",
        ),
        pytest.param(
            {"settings": {"num_workers": 3, "persistent_workers": False, "drop_last": False}},
            "num_workers=3",
            id="other-num-workers",
        ),
        pytest.param(
            {"settings": {"num_workers": 0, "persistent_workers": False, "drop_last": True}},
            "drop_last=True",
            id="other-drop-last",
        ),
    ],
)
def test_a_malformed_or_foreign_iterable_state_is_refused_and_changes_nothing(change, match):
    batches, states, _ = iterables.uninterrupted("dataset-state", 7)
    state = {**states[2], "sampler": {**states[2]["sampler"], **change}}
    torch.manual_seed(0)
    loader = iterables.make_loader("dataset-state", 7)
    iterator = iter(loader)
    next(iterator)
    before = loader.state_dict()
    with pytest.raises(LoaderStateError, match=match) as caught:
        loader.load_state_dict(state)
    assert caught.value.code == 333
    assert first_difference(before, loader.state_dict()) is None
    iterables.assert_same_batches(batches[1:5], list(iterator), "the running pass goes on")


def test_a_generator_iterable_without_state_is_refused_at_construction_naming_the_fix():
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(iterables.GeneratorStream(), resumable=True)
    assert caught.value.code == 332
    assert "GeneratorStream" in str(caught.value)
    assert "give the dataset (or the iterator its __iter__ returns) state_dict()" in str(
        caught.value
    )


def test_an_iterable_whose_iterator_has_no_state_is_refused_at_its_first_batch_naming_the_fix():
    loader = ResumableDataLoader(iterables.PlainStream(), batch_size=2, resumable=True)
    iterator = iter(loader)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        next(iterator)
    assert caught.value.code == 332
    assert "list_iterator" in str(caught.value)
    assert "give the dataset (or its iterator) state_dict() and load_state_dict()" in str(
        caught.value
    )
    assert loader.state_dict()["delivered_batches"] == 0


def test_in_order_false_with_an_iterable_dataset_is_refused_naming_the_fix():
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(
            iterables.CountingStream(), num_workers=2, in_order=False, resumable=True
        )
    assert caught.value.code == 332 and "leave in_order=True" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"shuffle": True}, id="shuffle"),
        pytest.param({"sampler": range(3)}, id="sampler"),
        pytest.param({"batch_sampler": [[0, 1]], "batch_size": 1}, id="batch-sampler"),
    ],
)
def test_what_dataloader_refuses_with_an_iterable_dataset_stays_refused_by_dataloader(options):
    with pytest.raises(ValueError, match="IterableDataset") as ours:
        ResumableDataLoader(iterables.CountingStream(), resumable=True, **options)
    with pytest.raises(ValueError) as theirs:
        DataLoader(iterables.CountingStream(), **options)
    assert str(ours.value) == str(theirs.value)


def test_per_sample_seeding_is_refused_for_an_iterable_dataset_naming_the_fix():
    with pytest.raises(ValueError, match="leave it unset"):
        ResumableDataLoader(
            iterables.CountingStream(), augmentation_seeding="sample", resumable=True
        )


def test_a_failed_read_resumes_at_the_last_delivered_batch_after_close():
    torch.manual_seed(0)
    reference = ResumableDataLoader(iterables.CountingStream(), batch_size=7, resumable=True)
    expected = list(reference)
    dataset = iterables.FailingStream(bad=16)
    torch.manual_seed(0)
    loader = ResumableDataLoader(dataset, batch_size=7, resumable=True)
    iterator = iter(loader)
    got = [next(iterator), next(iterator)]
    with pytest.raises(LoaderFetchFailedError, match="cannot decode item 16") as caught:
        next(iterator)
    assert caught.value.code == 335
    dataset.fail = False
    loader.close()
    got.extend(loader)
    iterables.assert_same_batches(expected, got, "after the failure")


@pytest.mark.slow
def test_worker_init_fn_configures_the_workers_dataset_copy_as_with_dataloader():
    def ids(cls, **options):
        loader = cls(
            iterables.CountingStream(),
            batch_size=4,
            num_workers=2,
            worker_init_fn=_mark_copy,
            **options,
        )
        return [batch[:, 0].tolist() for batch in loader]

    assert ids(ResumableDataLoader, resumable=True) == ids(DataLoader)


def _mark_copy(worker_id: int) -> None:
    dataset = get_worker_info().dataset
    dataset.position = 3 * (worker_id + 1)  # torch's recipe: configure the copy here


@pytest.mark.slow
def test_resume_in_a_new_process_continues_the_uninterrupted_pass_loop(tmp_path):
    jobs, expected = [], []
    for kind, batch_size, num_workers, persistent in [
        ("dataset-state", 7, 0, False),
        ("iterator-state", None, 0, False),
        ("dataset-state", 7, 3, True),
    ]:
        batches, states, _ = iterables.uninterrupted(kind, batch_size, num_workers, persistent)
        per_pass = _per_pass(batches)
        for k in (1, per_pass):
            jobs.append((kind, batch_size, num_workers, persistent, states[k]))
            expected.append((f"{kind}/{num_workers}/{k}", batches[k:]))
    results = streams.run_spawned(
        iterables.resume_iterable_jobs, jobs, out=tmp_path / "resumed.pt"
    )["results"]
    for (what, batches), got in zip(expected, results):
        iterables.assert_same_batches(batches, got, what)


def _with_refused_record(state: dict) -> dict:
    sampler = state["sampler"]
    workers = [dict(record) for record in sampler["workers"]]
    workers[0]["dataset_state"] = {"position": 14}  # CountingStream refuses it
    return {**state, "sampler": {**sampler, "workers": workers}}


def test_a_dataset_state_the_main_process_dataset_refuses_is_a_loader_state_error():
    batches, states, _ = iterables.uninterrupted("dataset-state", 7)
    torch.manual_seed(0)
    loader = iterables.make_loader("dataset-state", 7)
    iterator = iter(loader)
    next(iterator)
    before = loader.state_dict()
    with pytest.raises(LoaderStateError, match="not a CountingStream state") as caught:
        loader.load_state_dict(_with_refused_record(states[2]))
    assert caught.value.code == 333 and "CountingStream.load_state_dict()" in str(caught.value)
    assert first_difference(before, loader.state_dict()) is None
    iterables.assert_same_batches(
        batches[1:5], list(loader), "the pass resumes at the delivered position"
    )


@pytest.mark.slow
def test_a_dataset_state_a_worker_copy_refuses_is_reported_by_the_first_next():
    _, states, _ = iterables.uninterrupted("dataset-state", 7, 3)
    loader = iterables.make_loader("dataset-state", 7, 3)
    loader.load_state_dict(_with_refused_record(states[2]))  # workers load when they start
    with pytest.raises(LoaderFetchFailedError, match="not a CountingStream state") as caught:
        next(iter(loader))
    assert caught.value.code == 335
    assert loader.state_dict()["delivered_batches"] == 2


def test_changes_to_the_dataset_between_load_state_dict_and_the_next_pass_apply_as_in_the_saved_run():
    def passes(state=None):
        torch.manual_seed(0)
        loader = ResumableDataLoader(iterables.EpochStream(), batch_size=7, resumable=True)
        if state is not None:
            loader.load_state_dict(state)
        batches, states = [], []
        for epoch in range(loader.epoch, 3):
            loader.dataset.set_epoch(epoch)  # the usual call at the top of each epoch
            for batch in loader:
                batches.append(batch)
                states.append(loader.state_dict())
        return batches, states

    batches, states = passes()
    assert [int(batch[0, 1]) for batch in batches[::5]] == [0, 101, 202]
    for k in (3, 5):  # mid-pass, and after the last batch of pass 0
        iterables.assert_same_batches(batches[k:], passes(states[k - 1])[0], f"resumed after {k}")


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_a_pass_left_early_starts_the_next_from_what_was_delivered_not_what_was_read_ahead(
    persistent,
):
    def run(prefetch_factor):
        torch.manual_seed(0)
        loader = iterables.make_loader(
            "dataset-state", 7, 3, persistent, prefetch_factor=prefetch_factor
        )
        iterator = iter(loader)
        first = [next(iterator) for _ in range(3)]  # worker 0 twice, worker 2 once
        loader.state_dict()
        rest, _ = iterables.run_passes(loader)  # its first iter() leaves pass 0
        loader.close()
        return first + rest

    shallow, deep = run(1), run(6)
    iterables.assert_same_batches(shallow, deep, "prefetch 6 vs 1")
    next_pass = [int(row[0]) for row in shallow[3]]
    # Persistent copies go on from worker 0's delivered position (item 14); fresh ones
    # copy the main-process dataset and start over.
    assert next_pass == (list(range(14, 21)) if persistent else list(range(7)))


class _PassTrainer(TrainingResumeMixin):
    """Trains on an iterable loader pass after pass, starting a new pass when one ends."""

    def __init__(self, workers: int) -> None:
        torch.manual_seed(5)
        random.seed(5)
        np.random.seed(5)
        self.model = nn.Linear(5, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        self.loader = iterables.make_loader("dataset-state", 7, workers, workers > 0)
        self.batches = iter(self.loader)
        self._initialize_training_resume({"workers": workers}, version="1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {"train": self.loader}

    def _rebuild_resume_iterators(self):
        self.batches = iter(self.loader)

    @training_step
    def step(self):
        batch = next(self.batches, None)
        if batch is None:  # the pass has ended: the next one
            self.batches = iter(self.loader)
            batch = next(self.batches)
        loss = self.model(batch.float()).pow(2).mean() * (1 + random.random())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


@pytest.mark.parametrize(
    ("workers", "pause_after"),
    [(0, 5), (0, 7), pytest.param(3, 6, marks=pytest.mark.slow)],
)
def test_a_trainer_over_an_iterable_loader_pauses_and_resumes_bit_identically(
    tmp_path, workers, pause_after
):
    # Passes of 5 batches with 0 workers, 6 with 3: the pause after 5 (or 6) is at the end
    # of the first pass, the one after 7 in the middle of the second.
    assert_training_resume(
        lambda: _PassTrainer(workers),
        lambda trainer: trainer.step(),
        tmp_path / "pause.ckpt",
        pause_after,
        13,
        lambda trainer: dict(trainer.model.state_dict()),
    )
