from __future__ import annotations

import os
import pickle
import random
from collections import Counter

import numpy as np
import pytest
import torch
from support import reuse_child as helpers

from trainer_resume.loaders.reuse import ReuseDataLoader, ReuseDataset, ReusePolicy
from trainer_resume.rng import derive_seed

SIZE = 24


def brute_force_generation(index: int, epoch: int, lifetime: int) -> int:
    """Generation of ``index`` in ``epoch``, stepping epoch by epoch from the rules in words."""
    generation, remaining = 0, lifetime - index % lifetime
    for _ in range(epoch):
        remaining -= 1
        if remaining == 0:
            generation, remaining = generation + 1, lifetime
    return generation


def make_dataset(directory, lifetime=3, seed=7, scale=1.0, **kwargs):
    build = kwargs.pop("build", None) or helpers.RandomBuild(scale=scale)
    return ReuseDataset(build, SIZE, directory, ReusePolicy(lifetime, seed), **kwargs)


def serve_epochs(dataset, epochs, start=0):
    """{(epoch, index): sample} for every index of each epoch."""
    served = {}
    for epoch in range(start, start + epochs):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            served[epoch, index] = dataset[index]
    return served


def assert_samples_equal(first, second):
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_lifetime_one_leaves_the_directory_empty(tmp_path):
    dataset = make_dataset(tmp_path, lifetime=1)
    serve_epochs(dataset, 3)
    assert os.listdir(tmp_path) == []
    assert len(dataset.build.calls) == 3 * SIZE


@pytest.mark.parametrize("lifetime", [2, 3])
@pytest.mark.parametrize("size", [24, 25])
def test_build_calls_per_epoch_follow_the_staggered_expiry(tmp_path, size, lifetime):
    build = helpers.RandomBuild()
    dataset = ReuseDataset(build, size, tmp_path, ReusePolicy(lifetime, 3))
    epochs = 9
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for index in range(size):
            dataset[index]
    per_epoch = Counter(epoch for epoch, _ in build.calls)
    expected = [
        sum(
            1
            for index in range(size)
            if epoch == 0
            or brute_force_generation(index, epoch, lifetime)
            != brute_force_generation(index, epoch - 1, lifetime)
        )
        for epoch in range(epochs)
    ]
    assert [per_epoch[epoch] for epoch in range(epochs)] == expected
    assert expected[0] == size
    assert all(abs(count - size / lifetime) <= 1 for count in expected[1:])


def test_a_sample_is_the_same_throughout_its_generation_and_new_after_it(tmp_path):
    lifetime = 3
    served = serve_epochs(make_dataset(tmp_path, lifetime=lifetime), 8)
    for index in range(SIZE):
        for first, second in ((e, e + 1) for e in range(7)):
            same = brute_force_generation(index, first, lifetime) == brute_force_generation(
                index, second, lifetime
            )
            equal = torch.equal(served[first, index]["x"], served[second, index]["x"])
            assert equal == same, (index, first)


def test_loaded_samples_equal_rebuilt_ones(tmp_path):
    cached = serve_epochs(make_dataset(tmp_path / "cached"), 7)
    dataset = make_dataset(tmp_path / "rebuilt")
    rebuilt = {}
    for epoch in range(7):
        for path in (tmp_path / "rebuilt").iterdir():
            path.unlink()
        rebuilt.update(serve_epochs(dataset, 1, start=epoch))
    assert len(dataset.build.calls) == 7 * SIZE
    for where, sample in cached.items():
        assert_samples_equal(sample, rebuilt[where])


def test_build_is_reproducible_whatever_the_callers_random_state_and_leaves_it_alone(tmp_path):
    first = make_dataset(tmp_path / "a")
    second = make_dataset(tmp_path / "b")
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    one = first[5]
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    expected_next = torch.rand(1)
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    two = second[5]
    assert torch.equal(torch.rand(1), expected_next)
    assert_samples_equal(one, two)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"seed": 7}, {"seed": 8}),
        ({"lifetime": 3}, {"lifetime": 2}),
        ({"fingerprint": "v1"}, {"fingerprint": "v2", "scale": 2.0}),
        ({"fingerprint": None}, {"fingerprint": 1, "scale": 2.0}),
    ],
)
def test_changed_settings_over_the_same_directory_never_serve_an_old_sample(
    tmp_path, first, second
):
    serve_epochs(make_dataset(tmp_path / "shared", **first), 2)
    assert any((tmp_path / "shared").iterdir())
    changed = make_dataset(tmp_path / "shared", **second)
    reference = make_dataset(tmp_path / "fresh", **second)
    changed.set_epoch(1)
    reference.set_epoch(1)
    for index in range(SIZE):
        assert_samples_equal(changed[index], reference[index])
    assert sorted(changed.build.calls) == [(1, index) for index in range(SIZE)]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_sample_file_is_rebuilt_with_the_same_result(tmp_path, damage):
    dataset = make_dataset(tmp_path, lifetime=3)
    original = dataset[3]  # phase 0: stored at epoch 0, served again at epochs 1 and 2
    path = dataset.path(3)
    content = path.read_bytes()
    damaged = {
        "truncate": content[: len(content) // 2],
        "garbage": bytes(range(256)) * 8,
        "empty": b"",
    }[damage]
    path.write_bytes(damaged)
    dataset.set_epoch(1)
    with pytest.warns(RuntimeWarning, match="00000003.pt"):
        again = dataset[3]
    assert_samples_equal(again, original)
    assert dataset.build.calls == [(0, 3), (1, 3)]
    assert torch.load(path, weights_only=True)["generation"] == 0
    dataset.set_epoch(2)
    assert_samples_equal(dataset[3], original)
    assert len(dataset.build.calls) == 2


def test_stale_temp_files_are_removed_at_start_and_nothing_else(tmp_path):
    (tmp_path / "00000003.pt.4242.abcd1234.tmp").write_bytes(b"partial")
    (tmp_path / "other.tmp").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("kept")
    make_dataset(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_stored_file_holds_the_sample_and_its_key_readable_weights_only(tmp_path):
    dataset = make_dataset(tmp_path, lifetime=3, seed=7, fingerprint="data-v2")
    sample = dataset[6]
    record = torch.load(dataset.path(6), weights_only=True)
    assert dataset.path(6).name == "00000006.pt"
    assert {k: v for k, v in record.items() if k not in ("format", "sample")} == {
        "index": 6,
        "generation": 0,
        "seed": derive_seed(7, 6, 0),
        "lifetime": 3,
        "fingerprint": "data-v2",
    }
    assert_samples_equal(record["sample"], sample)


def test_files_are_replaced_in_place_so_their_count_never_exceeds_the_size(tmp_path):
    dataset = make_dataset(tmp_path, lifetime=2)
    names = {f"{index:08d}.pt" for index in range(SIZE)}
    for epoch in range(6):
        serve_epochs(dataset, 1, start=epoch)
        assert set(os.listdir(tmp_path)) <= names
    assert set(os.listdir(tmp_path)) == names


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp_file(tmp_path):
    serve_epochs(make_dataset(tmp_path, lifetime=2), 1)  # index 0 (phase 0) stored as generation 0

    def failing_save(record, path):
        with open(path, "wb") as file:
            file.write(b"half a sample")
        raise OSError("disk full")

    dataset = make_dataset(tmp_path, lifetime=2, save=failing_save)
    dataset.set_epoch(2)  # index 0 starts generation 1 and would be stored
    with pytest.raises(OSError, match="disk full"):
        dataset[0]
    assert torch.load(dataset.path(0), weights_only=True)["generation"] == 0
    assert not list(tmp_path.glob("*.tmp"))


def test_custom_save_and_load_are_used_for_samples_outside_the_safe_set(tmp_path):
    saved, loaded = [], []

    def save(record, path):
        saved.append(path)
        torch.save(record, path)

    def load(path):
        loaded.append(path)
        return torch.load(path, weights_only=False)  # trusted: this test wrote it

    def build(key):
        return helpers.Point(float(key.index), float(key.seed % 1000))

    dataset = ReuseDataset(build, 4, tmp_path, ReusePolicy(2, 1), save=save, load=load)
    first = dataset[0]
    dataset.set_epoch(1)
    again = dataset[0]
    assert len(saved) == 1 and saved[0].endswith(".tmp")
    assert len(loaded) == 2  # a miss at epoch 0, the hit at epoch 1
    assert again == first and again is not first


@pytest.mark.parametrize(
    ("sample", "named"),
    [
        (object(), "builtins.object"),
        (
            {"image": np.zeros(2)},
            r"sample\['image'\] is a numpy.ndarray \(convert with torch.from_numpy\)",
        ),
        ([torch.zeros(1), helpers.Point(0.0, 1.0)], r"sample\[1\] is a .*Point"),
    ],
)
def test_a_sample_the_default_save_cannot_store_is_refused_naming_it(tmp_path, sample, named):
    dataset = ReuseDataset(lambda key: sample, 4, tmp_path, ReusePolicy(2, 1))
    with pytest.raises(TypeError, match="index 0") as error:
        dataset[0]
    assert error.match(named)
    assert os.listdir(tmp_path) == []


def test_a_custom_save_that_fails_on_the_sample_is_reported_naming_it(tmp_path):
    def save(record, path):
        pickle.dumps(record)  # a lambda cannot be pickled

    dataset = ReuseDataset(lambda key: {"f": lambda: 0}, 4, tmp_path, ReusePolicy(2, 1), save=save)
    with pytest.raises(TypeError, match="index 0 .*builtins.dict"):
        dataset[0]
    assert os.listdir(tmp_path) == []


def test_unstored_samples_need_no_storable_type(tmp_path):
    dataset = ReuseDataset(lambda key: object(), 4, tmp_path, ReusePolicy(1, 1))
    assert type(dataset[0]) is object


def test_a_path_that_is_not_a_directory_is_refused_naming_it(tmp_path):
    path = tmp_path / "file.pt"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="file.pt.*not a directory"):
        make_dataset(path)


@pytest.mark.parametrize(("size", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_a_bad_size_is_refused_naming_it(tmp_path, size, error):
    with pytest.raises(error, match=f"size .*{size}"):
        ReuseDataset(helpers.RandomBuild(), size, tmp_path, ReusePolicy(2, 1))
    with pytest.raises(error, match=f"size .*{size}"):
        ReuseDataLoader(helpers.RandomBuild(), size, tmp_path, lifetime=2, seed=1)


@pytest.mark.parametrize("lifetime", [0, -2])
def test_a_bad_lifetime_is_refused_naming_it(tmp_path, lifetime):
    with pytest.raises(ValueError, match=f"lifetime must be at least 1, got {lifetime}"):
        ReuseDataLoader(helpers.RandomBuild(), SIZE, tmp_path / "d", lifetime=lifetime, seed=1)
    assert not (tmp_path / "d").exists()


def test_bad_index_and_epoch_are_refused(tmp_path):
    dataset = make_dataset(tmp_path)
    for index in (-1, SIZE):
        with pytest.raises(IndexError, match=str(index)):
            dataset[index]
    with pytest.raises(ValueError, match="-1"):
        dataset.set_epoch(-1)
    assert dataset.build.calls == []


def test_a_subclass_that_skips_init_gets_a_clear_error():
    class Forgetful(ReuseDataset):
        def __init__(self):
            pass

    with pytest.raises(RuntimeError, match="must call ReuseDataset.__init__"):
        Forgetful()[0]


def test_the_epoch_lives_in_shared_memory_and_survives_pickling(tmp_path):
    dataset = make_dataset(tmp_path)
    dataset.set_epoch(4)
    assert dataset._epochs.is_shared()
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.epoch == 4


def counting_load(loads):
    def load(path):
        loads.append(os.path.basename(path))
        return torch.load(path, weights_only=True)

    return load


def test_a_generations_first_epoch_does_not_read_the_previous_generations_file(tmp_path):
    loads = []
    dataset = make_dataset(tmp_path, lifetime=2, load=counting_load(loads))
    serve_epochs(dataset, 2)
    loads.clear()
    dataset.set_epoch(2)
    dataset[0]  # phase 0: generation 1 starts at epoch 2; its file holds generation 0
    dataset[1]  # phase 1: generation 1 started at epoch 1 and was stored then
    assert loads == ["00000001.pt"]
    assert torch.load(dataset.path(0), weights_only=True)["generation"] == 1


def test_a_restart_in_a_generations_first_epoch_reuses_what_the_interrupted_run_stored(tmp_path):
    interrupted = make_dataset(tmp_path, lifetime=2)
    serve_epochs(interrupted, 2)
    interrupted.set_epoch(2)
    stored = interrupted[0]  # generation 1 of index 0, built and stored in epoch 2
    restarted = make_dataset(tmp_path, lifetime=2)
    restarted.set_epoch(2)
    assert_samples_equal(restarted[0], stored)
    assert restarted.build.calls == []
    restarted.set_epoch(4)  # a later first epoch of a generation: built, not read
    restarted[0]
    assert restarted.build.calls == [(4, 0)]
