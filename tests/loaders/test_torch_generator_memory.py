"""A torch CPU generator's state copied in place: the same ``get_state()`` and draws as
through torch's accessors, cached normal sample included, and refused where the layout
does not hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_resume.loaders import _global_generators as generators
from trainer_resume.loaders import _torch_generator_memory as memory


def _with_cached_normal(generator: torch.Generator, seed: int) -> None:
    generator.manual_seed(seed)
    torch.rand(5, generator=generator)
    torch.randn(1, dtype=torch.float64, generator=generator)  # a pair drawn, one kept


def _draws(generator: torch.Generator | None = None) -> list[torch.Tensor]:
    return [
        torch.randn(1, dtype=torch.float64, generator=generator),
        torch.rand(7, generator=generator),
        torch.randn(5, generator=generator),
        torch.randint(0, 1 << 30, (4,), generator=generator),
    ]


def _equal(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def _proven(count: int = 2) -> list[tuple[torch.Generator, memoryview]]:
    states = memory.private_states(count)
    assert states is not None
    return states


def test_this_torch_has_the_layout_so_the_in_place_path_is_what_the_tests_exercise():
    (private, view), _ = _proven()
    assert memory.default_state_view(private, view) is not None
    place = generators.layout()
    assert place.torch_state is not None and place.torch_default is not None
    assert place.converter is not None


@pytest.mark.parametrize("cached", [True, False], ids=["cached-normal", "no-cached-normal"])
def test_a_state_copied_in_place_gives_the_target_the_sources_state_and_draws(cached):
    (source, source_view), (target, target_view) = _proven()
    if cached:
        _with_cached_normal(source, 11)
        target.manual_seed(3)
    else:
        source.manual_seed(11)
        _with_cached_normal(target, 3)
    target_view[:] = source_view
    assert torch.equal(target.get_state(), source.get_state())
    assert _equal(_draws(target), _draws(source))


@pytest.mark.parametrize("way", ["put", "put_taken"])
def test_the_callers_torch_state_put_back_in_place_is_its_state_with_its_cached_normal(way):
    get, put, put_taken = generators.torch_accessors()
    assert type(get()) is bytes  # the in-place form, not get_state's tensor
    reference = torch.Generator()
    _with_cached_normal(reference, 5)
    torch.set_rng_state(reference.get_state())
    saved = get()
    generators.seed_global(123)
    _draws()
    (put if way == "put" else put_taken)(saved)
    assert torch.equal(torch.get_rng_state(), reference.get_state())
    assert _equal(_draws(), _draws(reference))


def test_the_words_are_numpys_legacy_seeding_and_the_fields_before_them_the_seed():
    ((generator, view),) = _proven(1)
    generator.manual_seed(0x1234_5678_9ABC_DEF0)
    seed, left, seeded, position = memory._fields(view)
    assert (seed, left, seeded, position) == (0x1234_5678_9ABC_DEF0, 1, 1, 0)
    words = np.frombuffer(bytes(view[memory.STATE_WORDS]), dtype=np.uint32)
    assert np.array_equal(words, np.random.RandomState(0x9ABC_DEF0).get_state()[1])


@pytest.mark.parametrize(
    ("name", "wrong"),
    [("_DOUBLE_FLAG", 19), ("_DOUBLE_VALUE", 4), ("_FIELDS", memory.struct.Struct("=QiBxI"))],
    ids=["flag-one-byte-early", "value-misplaced", "fields-misplaced"],
)
def test_a_layout_that_does_not_hold_is_refused(monkeypatch, name, wrong):
    monkeypatch.setattr(memory, name, wrong)
    assert memory.private_states(2) is None


def test_no_state_is_found_in_a_generator_that_is_not_a_plain_torch_cpu_generator():
    class Subclassed(torch.Generator):
        pass

    assert memory.words_view(Subclassed()) is None
    assert memory.words_view(np.random.MT19937(0)) is None  # type: ignore[arg-type]
    (private, view), _ = _proven()
    assert memory.default_state_view(Subclassed(), view) is None
