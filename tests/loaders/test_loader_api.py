"""ResumableDataLoader: signature, plain mode, configuration checks, shared stream, state."""

from __future__ import annotations

import inspect
import re
import typing

import pytest
import torch
from support import loader_streams as streams
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from trainer_resume.errors import (
    LoaderStateError,
    ResumableModeRequiredError,
    ResumableSamplerGeneratorError,
    UnsupportedResumeConfigurationError,
)
from trainer_resume.loaders import (
    InfiniteRandomSampler,
    ResumableDataLoader,
    build_batch_sampler,
)


def test_signature_is_dataloaders_plus_keyword_only_resumable_options():
    ours = inspect.signature(ResumableDataLoader.__init__).parameters
    torchs = inspect.signature(DataLoader.__init__).parameters
    assert list(ours) == [
        *torchs,
        "resumable",
        "augmentation_seeding",
        "allow_inexact_shuffle_buffer",
    ]
    assert ours["augmentation_seeding"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["augmentation_seeding"].default is None
    assert ours["allow_inexact_shuffle_buffer"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["allow_inexact_shuffle_buffer"].default is False
    for name, parameter in torchs.items():
        assert (ours[name].kind, ours[name].default) == (parameter.kind, parameter.default), name
    assert ours["resumable"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["resumable"].default is False
    hints = typing.get_type_hints(ResumableDataLoader.__init__)
    assert hints["resumable"] is bool
    assert set(hints) >= {"dataset", "batch_size", "sampler", "batch_sampler", "in_order"}


def test_plain_mode_is_torch_dataloader():
    dataset = streams.AugmentedDataset()

    def make(cls):
        generator = torch.Generator()
        generator.manual_seed(3)
        return cls(dataset, batch_size=3, shuffle=True, generator=generator, drop_last=True)

    ours, theirs = make(ResumableDataLoader), make(DataLoader)
    assert isinstance(ours, DataLoader) and not ours.resumable
    assert len(ours) == len(theirs) == 3
    assert type(iter(ours)) is type(iter(theirs))
    torch.manual_seed(0)
    expected = [batch[:, 0] for batch in theirs]
    torch.manual_seed(0)
    got = [batch[:, 0] for batch in ours]
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(expected, got))
    with pytest.raises(ResumableModeRequiredError):
        ours.state_dict()
    with pytest.raises(ResumableModeRequiredError):
        ours.load_state_dict({})
    ours.collate_fn = streams.noisy_collate  # allowed, as on DataLoader


def test_plain_mode_accepts_a_plain_infinite_sampler():
    dataset = streams.AugmentedDataset()
    loader = ResumableDataLoader(dataset, batch_size=4, sampler=InfiniteRandomSampler(dataset))
    assert next(iter(loader)).shape == (4, 4)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(
            lambda ds: {"sampler": InfiniteRandomSampler(ds, resumable=True)},
            id="resumable-sampler",
        ),
        pytest.param(
            lambda ds: {
                "batch_sampler": build_batch_sampler(
                    "naive", ds, 2, repeat=True, shuffle=True, drop_last=False, resumable=True
                )
            },
            id="resumable-batch-sampler",
        ),
    ],
)
def test_a_resumable_sampler_in_a_plain_loader_raises_resumable_mode_required(arguments):
    dataset = streams.AugmentedDataset()
    with pytest.raises(ResumableModeRequiredError):
        ResumableDataLoader(dataset, **arguments(dataset))


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(lambda ds: {"sampler": InfiniteRandomSampler(ds)}, id="plain-sampler"),
        pytest.param(
            lambda ds: {
                "batch_sampler": build_batch_sampler(
                    "naive", ds, 2, repeat=True, shuffle=True, drop_last=False
                )
            },
            id="plain-batch-sampler",
        ),
    ],
)
def test_a_resumable_loader_with_a_plain_sampler_of_this_package_raises_resumable_mode_required(
    arguments,
):
    dataset = streams.AugmentedDataset()
    with pytest.raises(ResumableModeRequiredError) as caught:
        ResumableDataLoader(dataset, resumable=True, **arguments(dataset))
    assert caught.value.code == 331 and "build it with resumable=True" in str(caught.value)


class _Stream(IterableDataset):
    def __iter__(self):  # a generator: no state_dict() anywhere
        yield from range(3)


class _SamplerSubclass(InfiniteRandomSampler):
    pass


class _RandomSubclass(RandomSampler):
    pass


class _BatchSubclass(BatchSampler):
    pass


class _Unordered(torch.utils.data.Sampler):
    def __iter__(self):
        return iter(range(10))

    def __len__(self):
        return 10


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(lambda ds: {"dataset": _Stream()}, id="iterable-dataset"),
        pytest.param(
            lambda ds: {"sampler": _SamplerSubclass(ds, resumable=True)}, id="sampler-subclass"
        ),
        pytest.param(lambda ds: {"sampler": _RandomSubclass(ds)}, id="torch-sampler-subclass"),
        pytest.param(lambda ds: {"sampler": _Unordered()}, id="custom-sampler"),
        pytest.param(
            lambda ds: {"batch_sampler": _BatchSubclass(SequentialSampler(ds), 2, False)},
            id="batch-sampler-subclass",
        ),
        pytest.param(
            lambda ds: {"batch_sampler": BatchSampler(_Unordered(), 2, False)},
            id="batch-sampler-over-custom",
        ),
        pytest.param(
            lambda ds: {
                "sampler": InfiniteRandomSampler(ds, resumable=True),
                "in_order": False,
                "num_workers": 2,
            },
            id="in-order-false-with-workers",
        ),
    ],
)
def test_configurations_that_cannot_resume_exactly_are_refused_with_the_fix_named(arguments):
    dataset = streams.AugmentedDataset()
    options = {"dataset": dataset, **arguments(dataset)}
    with pytest.raises(UnsupportedResumeConfigurationError) as caught:
        ResumableDataLoader(resumable=True, **options)
    assert caught.value.code == 332
    assert re.search(
        r"give it state_dict|use a map-style|leave in_order=True|itself", str(caught.value)
    )


def test_in_order_false_without_workers_is_taken_and_resumes_exactly():
    # Without workers batches come in order whatever in_order says: nothing to refuse.
    def loader() -> ResumableDataLoader:
        torch.manual_seed(0)
        return ResumableDataLoader(
            streams.AugmentedDataset(), batch_size=2, shuffle=True, in_order=False, resumable=True
        )

    expected = list(loader())
    first = loader()
    batches = iter(first)
    head = [next(batches) for _ in range(3)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    got = head + list(resumed)
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_a_sampler_built_for_another_dataset_size_is_an_argument_error():
    sampler = InfiniteRandomSampler(range(11), resumable=True)
    with pytest.raises(ValueError, match="11"):
        ResumableDataLoader(streams.AugmentedDataset(), sampler=sampler, resumable=True)


def test_replacing_collate_fn_or_in_order_on_a_resumable_loader_is_refused():
    loader = streams.make_loader("sampler")
    with pytest.raises(UnsupportedResumeConfigurationError):
        loader.collate_fn = streams.noisy_collate
    with pytest.raises(UnsupportedResumeConfigurationError):
        loader.in_order = False
    assert loader.collate_fn is streams.noisy_collate and loader.in_order is True


def test_every_iter_continues_one_shared_stream():
    torch.manual_seed(0)
    reference = streams.make_loader("naive")
    expected = [batch for _, batch in zip(range(6), reference)]
    torch.manual_seed(0)
    loader = streams.make_loader("naive")
    assert iter(loader) is iter(loader)
    got = [next(iter(loader))]
    for batch in loader:
        got.append(batch)
        break
    got.append(next(iter(loader)))
    for _, batch in zip(range(3), loader):
        got.append(batch)
    assert len(got) == 6 and all(torch.equal(a, b) for a, b in zip(expected, got))
    assert loader.state_dict()["delivered_batches"] == 6


def test_without_repeat_each_loop_is_one_cycle_and_the_next_loop_the_next_cycle():
    torch.manual_seed(0)
    endless = streams.make_loader("naive")
    expected = [batch for _, batch in zip(range(6), endless)]
    torch.manual_seed(0)
    loader = streams.make_loader("naive", repeat=False)
    first = list(loader)
    assert loader.state_dict()["sampler"]["cycle"] == 1
    second = list(loader)
    got = first + second
    assert len(first) == len(second) == 3
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


@pytest.mark.parametrize("target", streams.TARGETS)
def test_loader_state_round_trips_through_weights_only_torch_load_and_json(target):
    loader = streams.make_loader(target)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = loader.state_dict()
    streams.assert_plain_data(state)
    assert state["delivered_batches"] == 5


def _corrupt(target="sampler", drop=(), **changes):
    loader = streams.make_loader(target)
    next(iter(loader))
    state = loader.state_dict()
    sampler_changes = changes.pop("sampler", {})
    state.update(changes)
    state["sampler"] = {**state["sampler"], **sampler_changes}
    for key in drop:
        del state[key]
    return state


@pytest.mark.parametrize(
    ("make_state", "error"),
    [
        pytest.param(
            lambda: _corrupt(format="trainer_resume.loader/2"), LoaderStateError, id="format"
        ),
        pytest.param(lambda: _corrupt(batch_size=3), LoaderStateError, id="batch-size"),
        pytest.param(
            lambda: _corrupt(delivered_batches=2), LoaderStateError, id="delivered-vs-sampler"
        ),
        pytest.param(
            lambda: _corrupt(augmentation_seed=-1), LoaderStateError, id="augmentation-seed"
        ),
        pytest.param(lambda: _corrupt(drop=("sampler",)), LoaderStateError, id="missing-sampler"),
        pytest.param(
            lambda: _corrupt(sampler={"consumed": 5}), LoaderStateError, id="sampler-cursor"
        ),
        pytest.param(
            lambda: _corrupt(sampler={"seed": "x"}),
            ResumableSamplerGeneratorError,
            id="sampler-seed",
        ),
        pytest.param(
            lambda: _corrupt("naive", batch_size=4),
            LoaderStateError,
            id="batch-state-into-sampler-mode",
        ),
        pytest.param(lambda: [], LoaderStateError, id="not-a-dict"),
    ],
)
def test_validate_state_dict_raises_and_changes_nothing(make_state, error):
    loader = streams.make_loader("sampler")
    iterator = iter(loader)
    next(iterator)
    before = loader.state_dict()
    state = make_state()
    with pytest.raises(error):
        loader.validate_state_dict(state)
    with pytest.raises(error):
        loader.load_state_dict(state)
    assert loader.state_dict() == before
    next(iterator)  # the running iterator is untouched
    assert loader.state_dict()["delivered_batches"] == 2


def test_a_sampler_state_cannot_be_loaded_into_a_batch_sampler_loader():
    loader = streams.make_loader("naive")
    state = streams.make_loader("sampler").state_dict()
    state["batch_size"] = None
    with pytest.raises(LoaderStateError, match="format"):
        loader.load_state_dict(state)


def test_a_subclass_that_skips_init_gets_a_clear_error():
    class Forgetful(ResumableDataLoader):
        def __init__(self):
            pass

    with pytest.raises(RuntimeError, match="__init__"):
        Forgetful().state_dict()
