"""Stateful IterableDatasets, loaders over them and pass-loop runs for the iterable-dataset tests.

Module level on purpose: worker processes and a spawned process import this module by
name to unpickle the datasets.
"""

from __future__ import annotations

import random
import traceback
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainer_resume.loaders import ResumableDataLoader

# Items per worker with 3 workers: uneven, and worker 1 reads nothing. With 0 workers the
# one process reads them all. Batches of 7: 4 + 0 + 2 per pass with 3 workers, 5 with 0.
SHARES = (23, 0, 12)
EPOCHS = 3


def _share() -> tuple[int, int]:
    """(first item, item count) of this process's part of the data."""
    info = get_worker_info()
    if info is None:
        return 0, sum(SHARES)
    return sum(SHARES[: info.id]), SHARES[info.id]


def _row(number: int, passes: int) -> torch.Tensor:
    """``[item id, pass, random.random(), numpy.random.rand(), torch.rand()]``: the id plus a
    draw from each generator augmentation code typically uses."""
    return torch.tensor(
        [
            float(number),
            float(passes),
            random.random(),
            float(np.random.rand()),
            float(torch.rand(())),
        ],
        dtype=torch.float64,
    )


class CountingStream(IterableDataset):
    """A dataset with torchdata's Stateful protocol: its state is the position in the pass
    and the passes read; its ``__iter__`` is a generator that reads the state."""

    def __init__(self) -> None:
        self.position = 0
        self.passes = 0

    def __iter__(self):
        first, count = _share()
        while self.position < count:
            self.position += 1
            yield _row(first + self.position - 1, self.passes)
        self.position, self.passes = 0, self.passes + 1

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "passes": self.passes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if set(state) != {"position", "passes"}:
            raise KeyError(f"not a CountingStream state: {sorted(state)}")
        self.position, self.passes = state["position"], state["passes"]


class EpochStream(CountingStream):
    """``set_epoch(e)`` before each pass, as training loops do; the epoch is in the state
    and in column 1 (``100 * epoch + passes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        for row in super().__iter__():
            row[1] += 100 * self.epoch
            yield row

    def state_dict(self) -> dict[str, int]:
        return {**super().state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict({key: state[key] for key in ("position", "passes")})
        self.epoch = state["epoch"]


class _Cursor:
    """An iterator with state_dict() / load_state_dict(): the dataset has no state."""

    def __init__(self) -> None:
        self.first, self.count = _share()
        self.position = 0

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= self.count:
            raise StopIteration
        self.position += 1
        return _row(self.first + self.position - 1, 0)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class CursorStream(IterableDataset):
    """A dataset without state whose ``__iter__`` returns a stateful iterator."""

    def __iter__(self) -> _Cursor:
        return _Cursor()


class RestartingStream(IterableDataset):
    """Its own iterator, as datasets are often written: ``__iter__`` restarts it and returns
    ``self``, ``__next__`` reads on (an ``iter()`` per batch would restart it every time)."""

    def __init__(self) -> None:
        self.first, self.count = _share()
        self.position = 0

    def __iter__(self) -> RestartingStream:
        self.first, self.count = _share()
        self.position = 0
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= self.count:
            raise StopIteration
        self.position += 1
        return _row(self.first + self.position - 1, 0)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class ResumingStream(RestartingStream):
    """Its own iterator whose ``__iter__`` starts over unless a state was loaded since the
    last one (then it reads on from there), as datasets that resume after
    ``load_state_dict()`` are written: a second load it was never given in the
    uninterrupted run would make its next pass read on from the end, an empty pass."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = False

    def __iter__(self) -> ResumingStream:
        self.first, self.count = _share()
        if not self.loaded:
            self.position = 0
        self.loaded = False
        return self

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict(state)
        self.loaded = True


class TorchRngStream(IterableDataset):
    """Its own restarting iterator whose items come from torch's global generator, which its
    state holds (``torch.get_rng_state()``). ``lazy``: a loaded state is kept and applied at
    the next ``__iter__`` or ``__next__``, whichever comes first (``__iter__`` applies it,
    then restarts, as for a dataset that was in that state); otherwise at once."""

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy
        self.first, self.count = _share()
        self.position = 0
        self.pending: dict | None = None

    def _apply_pending(self) -> None:
        if self.pending is not None:
            state, self.pending = self.pending, None
            self.position = state["position"]
            torch.set_rng_state(state["torch"])

    def __iter__(self) -> TorchRngStream:
        self._apply_pending()
        self.first, self.count = _share()
        self.position = 0
        return self

    def __next__(self) -> torch.Tensor:
        self._apply_pending()
        if self.position >= self.count:
            raise StopIteration
        self.position += 1
        number = float(self.first + self.position - 1)
        return torch.cat([torch.tensor([number], dtype=torch.float64), torch.rand(3).double()])

    def state_dict(self) -> dict:
        return {"position": self.position, "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.pending = {"position": state["position"], "torch": state["torch"].clone()}
        if not self.lazy:
            self._apply_pending()


class PlainStream(IterableDataset):
    """No state anywhere: ``__iter__`` returns a plain list iterator."""

    def __iter__(self):
        return iter([torch.tensor([float(i)]) for i in range(5)])


class GeneratorStream(IterableDataset):
    """No state anywhere: ``__iter__`` is a generator."""

    def __iter__(self):
        yield from (torch.tensor([float(i)]) for i in range(5))


class FailingStream(CountingStream):
    """Raises while reading item ``bad`` of a pass as long as ``fail`` is set."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad = bad
        self.fail = True

    def __iter__(self):
        for row in super().__iter__():
            if self.fail and int(row[0]) == self.bad:
                raise ValueError(f"cannot decode item {self.bad}")
            yield row


DATASETS = {
    "dataset-state": CountingStream,
    "iterator-state": CursorStream,
    "restarting": RestartingStream,
    "resuming": ResumingStream,
    "torch-rng-eager": lambda: TorchRngStream(lazy=False),
    "torch-rng-lazy": lambda: TorchRngStream(lazy=True),
}


def make_loader(
    kind: str = "dataset-state",
    batch_size: int | None = 7,
    num_workers: int = 0,
    persistent: bool = False,
    **options: Any,
) -> ResumableDataLoader:
    return ResumableDataLoader(
        DATASETS[kind](),
        batch_size=batch_size,
        num_workers=num_workers,
        persistent_workers=persistent,
        resumable=True,
        **options,
    )


def run_passes(loader: ResumableDataLoader, epochs: int = EPOCHS, *, after: list | None = None):
    """The usual epoch loop from the loader's own epoch counter to ``epochs``: batches, and
    the state after each batch (``after`` gets the state after each epoch's loop too)."""
    batches, states = [], []
    for _ in range(loader.epoch, epochs):
        for count, batch in enumerate(loader):
            # Every dataset here has 35 items per pass: a pass that goes on is a reader bug.
            assert count < 100, "the pass does not end"
            batches.append(batch)
            states.append(loader.state_dict())
        if after is not None:
            after.append(loader.state_dict())
    return batches, states


def assert_same_batches(expected: list, got: list, what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches instead of {len(expected)}"
    for number, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"{what}: batch {number} differs"


def uninterrupted(
    kind: str,
    batch_size: int | None,
    num_workers: int = 0,
    persistent: bool = False,
    epochs: int = EPOCHS,
):
    """The pass loop without a pause: its batches, the state before the first batch and
    after each one, and the state after each pass's loop."""
    torch.manual_seed(0)
    loader = make_loader(kind, batch_size, num_workers, persistent)
    before = loader.state_dict()
    after_loops: list = []
    batches, states = run_passes(loader, epochs, after=after_loops)
    loader.close()
    return batches, [before, *states], after_loops


def resumed(
    kind: str,
    batch_size: int | None,
    num_workers: int,
    persistent: bool,
    state: dict,
    seed: int = 1234,
    epochs: int = EPOCHS,
) -> list:
    """The rest of the pass loop in a new loader that loads ``state``."""
    torch.manual_seed(seed)  # unlike the uninterrupted run: the state must fix everything
    random.seed(seed)
    np.random.seed(seed)
    loader = make_loader(kind, batch_size, num_workers, persistent)
    loader.load_state_dict(state)
    batches, _ = run_passes(loader, epochs)
    loader.close()
    return batches


def resume_iterable_jobs(jobs: list[tuple[str, int | None, int, bool, dict]], out: str) -> None:
    """Spawned-process entry: for each ``(kind, batch_size, num_workers, persistent, state)``
    build a fresh loader, load ``state``, finish the pass loop and save the batches."""
    try:
        torch.manual_seed(987654321)  # seeded unlike the parent: the state must fix everything
        random.seed(5)
        np.random.seed(6)
        results = []
        for kind, batch_size, num_workers, persistent, state in jobs:
            loader = make_loader(kind, batch_size, num_workers, persistent)
            loader.load_state_dict(state)
            results.append(run_passes(loader)[0])
            loader.close()
        torch.save({"results": results}, out)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise
