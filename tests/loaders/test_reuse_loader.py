from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch
from support import reuse_child as helpers
from torch.utils.data import SequentialSampler

from trainer_resume.loaders.reuse import ReuseDataLoader, ReusePolicy

SIZE = helpers.SIZE


def assert_epochs_equal(first, second):
    assert len(first) == len(second)
    for epoch, (batches, other) in enumerate(zip(first, second)):
        assert len(batches) == len(other), epoch
        for batch, other_batch in zip(batches, other):
            assert batch.keys() == other_batch.keys()
            for name in batch:
                assert torch.equal(batch[name], other_batch[name]), (epoch, name)


def indices(batches):
    return [index for batch in batches for index in batch["index"].tolist()]


def samples_by_index(batches):
    return {
        int(index): {name: batch[name][row] for name in batch}
        for batch in batches
        for row, index in enumerate(batch["index"])
    }


def test_each_iteration_starts_the_next_epoch_and_an_abandoned_epoch_counts(tmp_path):
    loader = helpers.make_loader(tmp_path / "a")
    abandoned = iter(loader)
    next(abandoned)
    assert (loader.epoch, loader.next_epoch) == (0, 1)
    after = helpers.run_epochs(loader, 2)
    assert (loader.epoch, loader.next_epoch) == (2, 3)
    resumed = helpers.make_loader(tmp_path / "b", start_epoch=1)
    assert_epochs_equal(after, helpers.run_epochs(resumed, 2))


def test_resuming_with_start_epoch_continues_an_uninterrupted_run(tmp_path):
    uninterrupted = helpers.run_epochs(helpers.make_loader(tmp_path / "a"), 7)
    first = helpers.run_epochs(helpers.make_loader(tmp_path / "b"), 3)
    rest = helpers.run_epochs(helpers.make_loader(tmp_path / "b", start_epoch=3), 4)
    assert_epochs_equal(uninterrupted, first + rest)


def test_shuffle_true_serves_each_epochs_closed_form_order(tmp_path):
    loader = helpers.make_loader(tmp_path, lifetime=2, seed=5)
    policy = ReusePolicy(2, 5)
    orders = [indices(batches) for batches in helpers.run_epochs(loader, 3)]
    assert orders == [[policy.order(p, epoch, SIZE) for p in range(SIZE)] for epoch in range(3)]
    assert len({tuple(order) for order in orders}) == 3


def test_without_shuffle_the_order_is_sequential(tmp_path):
    loader = helpers.make_loader(tmp_path, shuffle=False)
    assert [indices(batches) for batches in helpers.run_epochs(loader, 2)] == [
        list(range(SIZE))
    ] * 2


def test_a_user_sampler_is_respected_and_samples_do_not_depend_on_the_order(tmp_path):
    reverse = list(reversed(range(SIZE)))
    mine = helpers.run_epochs(
        helpers.make_loader(tmp_path / "a", shuffle=False, sampler=reverse), 4
    )
    shuffled = helpers.run_epochs(helpers.make_loader(tmp_path / "b"), 4)
    for epoch in range(4):
        assert indices(mine[epoch]) == reverse
        by_index, reference = samples_by_index(mine[epoch]), samples_by_index(shuffled[epoch])
        for index in range(SIZE):
            for name in reference[index]:
                assert torch.equal(by_index[index][name], reference[index][name]), (
                    epoch,
                    index,
                    name,
                )


def test_a_user_batch_sampler_is_respected(tmp_path):
    batch_sampler = [[3, 1], [0, 2]]
    loader = helpers.make_loader(tmp_path, shuffle=False, batch_size=1, batch_sampler=batch_sampler)
    assert [batch["index"].tolist() for batch in loader] == batch_sampler
    assert isinstance(helpers.make_loader(tmp_path, shuffle=False).sampler, SequentialSampler)


def test_dataloader_arguments_are_passed_through(tmp_path):
    def collate(samples):
        return {"index": torch.stack([s["index"] for s in samples]) * 10}

    loader = helpers.make_loader(
        tmp_path, batch_size=7, drop_last=True, collate_fn=collate, shuffle=False
    )
    batches = list(loader)
    assert len(loader) == len(batches) == SIZE // 7
    assert batches[0]["index"].tolist() == [0, 10, 20, 30, 40, 50, 60]


def test_an_iterator_refuses_to_continue_once_a_newer_epoch_started(tmp_path):
    loader = helpers.make_loader(tmp_path)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(RuntimeError, match="epoch 0.*epoch 1"):
        next(old)
    assert len(list(new)) == len(loader)


def _noisy_collate(samples):
    batch = torch.utils.data.default_collate(samples)
    batch["noise"] = torch.rand(len(samples))  # a draw in the collation, as a mixup's
    return batch


def _batches_from(loader, count):
    """The next ``count`` batches, starting the next epoch where one ends."""
    batches, iterator = [], iter(loader)
    while len(batches) < count:
        try:
            batches.append(next(iterator))
        except StopIteration:
            iterator = iter(loader)
    return batches


@pytest.mark.parametrize(
    ("workers", "options", "delivered"),
    [
        (0, {"shuffle": True}, 3),
        (2, {"shuffle": True}, 7),  # inside the second epoch
        (2, {"shuffle": False}, 4),  # the epoch's last batch: the state is the next's start
        (0, {"shuffle": True, "batch_size": None, "collate_fn": None}, 30),
        (2, {"shuffle": True, "batch_size": None, "collate_fn": None}, 30),
        (
            2,
            {"shuffle": False, "batch_size": None, "collate_fn": None, "persistent_workers": True},
            5,
        ),
    ],
)
def test_a_state_taken_inside_an_epoch_resumes_the_uninterrupted_batches(
    tmp_path, workers, options, delivered
):
    settings = {"num_workers": workers, "collate_fn": _noisy_collate, **options}
    per_epoch = len(helpers.make_loader(tmp_path / "n", **settings))
    uninterrupted = _batches_from(helpers.make_loader(tmp_path / "a", **settings), 3 * per_epoch)
    first = helpers.make_loader(tmp_path / "b", **settings)
    before = _batches_from(first, delivered)
    state = first.state_dict()
    epoch, batches = divmod(delivered, per_epoch)
    assert (state["epoch"], state["batches"]) == (epoch, batches)
    resumed = helpers.make_loader(tmp_path / "b", **settings)
    resumed.load_state_dict(state)
    after = _batches_from(resumed, 3 * per_epoch - delivered)
    assert len(uninterrupted) == len(before + after)
    for number, (batch, other) in enumerate(zip(uninterrupted, before + after)):
        assert batch.keys() == other.keys()
        for name in batch:
            assert torch.equal(batch[name], other[name]), (number, name)
    assert len(resumed) == per_epoch  # a resumed epoch's loader keeps its length


def test_a_state_of_other_settings_or_no_state_is_refused_and_changes_nothing(tmp_path):
    from trainer_resume.errors import LoaderStateError

    loader = helpers.make_loader(tmp_path / "a")
    next(iter(loader))
    state = loader.state_dict()
    other = helpers.make_loader(tmp_path / "b", batch_size=4)
    live = iter(other)
    first = next(live)
    for bad, message in (
        (state, r"batch_size: 5 in the state, 4 in this loader"),
        ({**state, "batch_size": 4, "epoch": -1}, r"epoch must be an int >= 0"),
        ({**state, "batch_size": 4, "batches": 6}, r"6 batches delivered, but an epoch has 6"),
        ({**state, "batch_size": 4, "seed": 1}, r"seed: 1 in the state"),
        ({"epoch": 0, "batches": 0}, r"missing keys"),
    ):
        with pytest.raises(LoaderStateError, match=message):
            other.load_state_dict(bad)
    assert other.state_dict()["batches"] == 1  # untouched: the live iterator goes on
    assert not torch.equal(next(live)["index"], first["index"])


def test_a_loader_over_the_callers_sampler_resumes_only_between_epochs(tmp_path):
    from trainer_resume.errors import UnsupportedResumeConfigurationError

    loader = helpers.make_loader(tmp_path / "a", shuffle=False, sampler=list(range(SIZE)))
    assert not loader.resumes_mid_epoch
    assert loader.state_dict()["batches"] == 0
    batches = iter(loader)
    next(batches)
    next(batches)
    with pytest.raises(
        UnsupportedResumeConfigurationError, match="2 batches into its epoch"
    ) as caught:
        helpers.make_loader(
            tmp_path / "b", shuffle=False, sampler=list(range(SIZE))
        ).load_state_dict(loader.state_dict())
    assert caught.value.code == 332
    for _ in batches:  # between epochs: resumed at the next one's start
        pass
    resumed = helpers.make_loader(tmp_path / "b", shuffle=False, sampler=list(range(SIZE)))
    resumed.load_state_dict(loader.state_dict())
    assert resumed.next_epoch == 1


def test_an_iterator_made_before_a_state_was_loaded_refuses_to_go_on(tmp_path):
    loader = helpers.make_loader(tmp_path)
    old = iter(loader)
    next(old)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match="replaced since it was made"):
        next(old)
    assert len(list(loader)) == len(loader) - 1  # the loaded position: one batch delivered


def test_a_dataset_argument_is_refused(tmp_path):
    with pytest.raises(TypeError, match="own dataset"):
        ReuseDataLoader(helpers.RandomBuild(), SIZE, tmp_path, lifetime=2, seed=1, dataset=[])


def test_lifetime_one_loader_writes_nothing(tmp_path):
    helpers.run_epochs(helpers.make_loader(tmp_path / "d", lifetime=1), 2)
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_inputs_are_identical_for_zero_and_four_workers(tmp_path, persistent_workers):
    single = helpers.run_epochs(helpers.make_loader(tmp_path / "w0", tmp_path / "log0"), 5)
    loader = helpers.make_loader(
        tmp_path / "w4",
        tmp_path / "log4",
        num_workers=4,
        persistent_workers=persistent_workers,
        timeout=60,
    )
    assert_epochs_equal(single, helpers.run_epochs(loader, 5))
    # The same samples were built in the same epochs, whichever process built them.
    assert sorted(helpers.logged_calls(tmp_path / "log4")) == sorted(
        helpers.logged_calls(tmp_path / "log0")
    )


@pytest.mark.slow
def test_spawned_persistent_workers_follow_the_epoch(tmp_path):
    single = helpers.run_epochs(helpers.make_loader(tmp_path / "w0"), 3)
    loader = helpers.make_loader(
        tmp_path / "w2",
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="spawn",
        timeout=120,
    )
    assert_epochs_equal(single, helpers.run_epochs(loader, 3))


@pytest.mark.slow
def test_restart_in_a_new_process_with_start_epoch_matches_an_uninterrupted_run(tmp_path):
    uninterrupted = helpers.run_epochs(
        helpers.make_loader(tmp_path / "ref", tmp_path / "log_ref"), 10
    )
    helpers.run_epochs(helpers.make_loader(tmp_path / "run", tmp_path / "log_first"), 5)
    out = tmp_path / "child.pt"
    subprocess.run(
        [
            sys.executable,
            helpers.__file__,
            str(tmp_path / "run"),
            str(out),
            str(tmp_path / "log_child"),
            "5",
            "10",
        ],
        check=True,
        timeout=120,
    )
    assert_epochs_equal(uninterrupted[5:], torch.load(out, weights_only=True))
    # The child reused the samples the first process stored: it built exactly what
    # the uninterrupted run built in epochs 5..9.
    child_calls = Counter(epoch for epoch, _ in helpers.logged_calls(tmp_path / "log_child"))
    reference_calls = Counter(
        epoch for epoch, _ in helpers.logged_calls(tmp_path / "log_ref") if epoch >= 5
    )
    assert child_calls == reference_calls
    assert 0 < child_calls[5] < SIZE


@pytest.mark.slow
def test_persistent_workers_serve_the_next_epoch_after_an_abandoned_one(tmp_path):
    loader = helpers.make_loader(
        tmp_path / "w2", num_workers=2, persistent_workers=True, prefetch_factor=4, timeout=60
    )
    abandoned = iter(loader)
    next(abandoned)
    after = helpers.run_epochs(loader, 2)
    reference = helpers.run_epochs(helpers.make_loader(tmp_path / "w0", start_epoch=1), 2)
    assert_epochs_equal(after, reference)


@pytest.mark.slow
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_workers_draw_nothing_from_the_global_generators_and_an_epoch_seeds_them_alike_at_any_start(
    tmp_path, persistent_workers
):
    # A collate function that draws in the worker shows its seed; the global generators
    # are the trainer's, which a resume restores: the loader must not draw from them.
    def drawing_collate(samples):
        batch = torch.utils.data.default_collate(samples)
        return {**batch, "draw": torch.rand(3)}

    options = {
        "num_workers": 2,
        "persistent_workers": persistent_workers,
        "collate_fn": drawing_collate,
        "timeout": 60,
    }
    torch.manual_seed(0)
    before = torch.get_rng_state()
    uninterrupted = helpers.run_epochs(helpers.make_loader(tmp_path / "a", **options), 3)
    assert torch.equal(torch.get_rng_state(), before)
    started_later = helpers.make_loader(tmp_path / "b", start_epoch=2, **options)
    later = helpers.run_epochs(started_later, 1)
    assert torch.equal(torch.get_rng_state(), before)
    if not persistent_workers:  # (persistent ones keep the seeds of the epoch they started in)
        # Each epoch's workers are seeded by the epoch, whichever epoch the loader started at.
        assert_epochs_equal(uninterrupted[2:], later)


@pytest.mark.parametrize("directory", ["s3://bucket/prepared", "s3:/bucket/prepared", "gs://b/p"])
def test_a_url_directory_is_refused_and_no_local_folder_is_made(tmp_path, monkeypatch, directory):
    from trainer_resume.errors import StorageURLError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageURLError) as caught:
        helpers.make_loader(directory)
    assert caught.value.code == 353 and "local directory" in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    assert helpers.make_loader(f"file://{tmp_path / 'local'}").dataset.directory == (
        tmp_path / "local"
    )


class _ReusingTrainer:
    """A trainer holding a ReuseDataLoader, with resume points or signal pauses or neither."""

    @staticmethod
    def make(tmp_path, *, points: bool, returned: bool = False, **loader_options):
        from trainer_resume import TrainingResumeMixin, serialized_training, training_step
        from trainer_resume.resume_points import ResumePoints

        class Reusing(TrainingResumeMixin):
            def __init__(self):
                self.model = torch.nn.Linear(1, 1)
                self.loader = helpers.make_loader(tmp_path / "prepared", **loader_options)
                self._initialize_training_resume(
                    {"reuse": 1},
                    version="1",
                    resume_points=ResumePoints(tmp_path / "points", every_steps=1)
                    if points
                    else None,
                    # Resumed by its start_epoch, unless returned.
                    excluded_attributes=[] if returned else ["loader"],
                )

            def _resume_objects(self):
                return {"model": self.model}

            def _resume_loaders(self):
                # Or it resumes by its start_epoch, from the extra state.
                return {"train": self.loader} if returned else {}

            def _resume_extra_state(self):
                return {"next_epoch": self.loader.next_epoch}

            def _load_resume_extra_state(self, state):
                pass

            @training_step
            def step(self, batch):
                return self.model(batch["index"].float()[:, None]).sum()

            @serialized_training
            def end_epoch(self):  # the epoch-end work: the next epoch's iterator
                self.batches = iter(self.loader)

        return Reusing()


def test_a_trainer_holding_a_reuse_loader_refuses_resume_points_and_signal_pauses_before_training(
    tmp_path,
):
    from trainer_resume.errors import UnsupportedResumeConfigurationError

    with_points = _ReusingTrainer.make(tmp_path / "a", points=True)
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        with_points.step(next(iter(with_points.loader)))
    assert caught.value.code == 332
    assert (
        "Reusing.loader (ReuseDataLoader) resumes only at an epoch's start, but resume points"
        in (str(caught.value))
    )
    assert with_points.model.weight.grad is None  # refused before the step ran

    armed = _ReusingTrainer.make(tmp_path / "b", points=False)
    armed.pause_on_signal(tmp_path / "b" / "pause.ckpt")
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"signals \(pause_on_signal"):
        armed.step(next(iter(armed.loader)))
    armed.restore_signal_handlers()

    # Pauses between epochs only: a pause inside an epoch is refused and nothing is
    # written; once the epoch ended it is taken; signals armed once training runs are refused.
    plain = _ReusingTrainer.make(tmp_path / "c", points=False)
    batches = iter(plain.loader)
    plain.step(next(batches))
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"is inside an epoch"):
        plain.pause(tmp_path / "c" / "pause.ckpt")
    assert not (tmp_path / "c" / "pause.ckpt").exists()
    for _ in range(len(plain.loader) - 1):
        plain.step(next(batches))
    plain.pause(tmp_path / "c" / "pause.ckpt")  # after the epoch's last batch, in its loop
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"signals \(pause_on_signal"):
        plain.pause_on_signal(tmp_path / "c" / "signal.ckpt")


def test_a_trainer_returning_a_reuse_loader_pauses_inside_its_own_order_but_not_the_callers(
    tmp_path,
):
    from trainer_resume.errors import UnsupportedResumeConfigurationError

    own = _ReusingTrainer.make(tmp_path / "a", points=False, returned=True)
    batches = iter(own.loader)
    own.step(next(batches))
    own.step(next(batches))
    own.pause(tmp_path / "a" / "pause.ckpt")
    assert own.paused
    resumed = _ReusingTrainer.make(tmp_path / "a", points=False, returned=True)
    resumed.resume(tmp_path / "a" / "pause.ckpt")
    assert resumed.loader.state_dict() == own.loader.state_dict()
    assert (resumed.loader.next_epoch, len(list(resumed.loader))) == (0, len(own.loader) - 2)

    # Between epochs, the next epoch's iterator made by the epoch-end work: its start.
    between = _ReusingTrainer.make(tmp_path / "c", points=False, returned=True)
    for batch in iter(between.loader):
        between.step(batch)
    between.end_epoch()
    between.pause(tmp_path / "c" / "pause.ckpt")
    again = _ReusingTrainer.make(tmp_path / "c", points=False, returned=True)
    again.resume(tmp_path / "c" / "pause.ckpt")
    assert again.loader.next_epoch == 1
    assert_epochs_equal([list(between.batches)], [list(again.loader)])

    callers = _ReusingTrainer.make(
        tmp_path / "b", points=True, returned=True, shuffle=False, sampler=list(range(SIZE))
    )
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        callers.step(next(iter(callers.loader)))
    assert caught.value.code == 332
    assert "resumes only at an epoch's start, but resume points" in str(caught.value)


def test_an_iterator_that_delivered_nothing_is_replaced_in_its_epoch_and_saved_as_its_start(
    tmp_path,
):
    # A trainer's rebuilt iterator, or the next epoch's made by the epoch-end work, and then
    # the loop's own iter(loader): the same epoch, from the same batch.
    uninterrupted = helpers.run_epochs(helpers.make_loader(tmp_path / "a"), 3)
    loader = helpers.make_loader(tmp_path / "b")
    first = list(loader)
    made = iter(loader)  # the next epoch's iterator, nothing read yet
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], loader.next_epoch) == (1, 0, 1)
    resumed = helpers.make_loader(tmp_path / "b")
    resumed.load_state_dict(state)
    iter(resumed)  # rebuilt after the resume, and left for the loop's own
    assert_epochs_equal(uninterrupted, [first, *helpers.run_epochs(resumed, 2)])
    iter(loader)  # replaces the one made, in its epoch
    assert loader.epoch == 1
    with pytest.raises(RuntimeError, match="replaced since it was made"):
        next(made)


def test_end_epoch_ends_an_epoch_a_loop_leaves_early_and_a_state_then_holds_the_next(tmp_path):
    def run(loader, epochs, limit):
        batches = []
        for _ in range(epochs):
            for number, batch in enumerate(loader):
                batches.append(batch)
                if number + 1 == limit:
                    break
            loader.end_epoch()
        return batches

    uninterrupted = run(helpers.make_loader(tmp_path / "a"), 3, 2)
    loader = helpers.make_loader(tmp_path / "b")
    before = run(loader, 1, 2)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    resumed = helpers.make_loader(tmp_path / "b")
    resumed.load_state_dict(state)
    after = run(resumed, 2, 2)
    for batch, other in zip(uninterrupted, before + after, strict=True):
        assert torch.equal(batch["index"], other["index"]) and torch.equal(batch["x"], other["x"])


def test_a_state_over_the_callers_sampler_is_refused_by_a_loader_of_its_own_order(tmp_path):
    from trainer_resume.errors import LoaderStateError

    callers = helpers.make_loader(tmp_path / "a", shuffle=False, sampler=list(range(SIZE)))
    own = helpers.make_loader(tmp_path / "b", shuffle=False)
    with pytest.raises(LoaderStateError, match="order: \"caller's\" in the state, 'sequential'"):
        own.load_state_dict(callers.state_dict())
