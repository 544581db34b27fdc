"""Time to the first batch after ``load_state_dict`` at far stream positions.

A 4,000,000-sample map-style dataset (``dataset[i]`` is a one-element tensor),
``batch_size=32``, ``num_workers=2``. For each stream position a fresh loader is
built, then the clock runs from ``load_state_dict(state)`` to the first batch
returned; the positions are measured in turn, repeat after repeat.
ResumableDataLoader (resumable ``InfiniteRandomSampler``) reaches any position in
closed form: one permutation of the position's cycle. Target: flat, max/min <= 1.2
over positions 0, 1e6 and 1e8.

torchdata's ``StatefulDataLoader`` (``shuffle=True``) is shown beside it at the
positions it supports: its state lives inside one epoch (1e8 is epoch 25 of this
dataset and needs the generator state after 25 shuffles, which only replaying them
gives), and loading replays the sampler one index at a time up to the position.
Its state at position p is the state it saves after 1 batch with the counters set
to p / 32 batches (checked against a real state after a few batches, where
replaying is cheap), so building it does not replay p samples first. Positions for
it are capped at 1e6 (``--stateful-max``) to keep the run under two minutes.

    python -m benchmarks.loader_resume            # full run
    python -m benchmarks.loader_resume --quick    # short run

Prints a table and writes benchmarks/out/loader_resume.json.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import time
import warnings
from typing import Any

import torch
from torch.utils.data import Dataset

from benchmarks._common import median, print_table, write_json
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

SIZE = 4_000_000
BATCH = 32
WORKERS = 2
POSITIONS = (0, 1_000_000, 100_000_000)
TARGET = 1.2


class IndexDataset(Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


# --- ResumableDataLoader ---------------------------------------------------------------


def _resumable_loader() -> ResumableDataLoader:
    dataset = IndexDataset()
    sampler = InfiniteRandomSampler(dataset, resumable=True)
    return ResumableDataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, resumable=True
    )


def resumable_state(position: int) -> dict[str, Any]:
    """The state a resumable loader saves after ``position / 32`` delivered batches."""
    state = _resumable_loader().state_dict()
    cycle, offset = divmod(position, SIZE)
    state["sampler"].update(consumed=position, cycle=cycle, offset=offset)
    state["delivered_batches"] = position // BATCH
    return state


def resumable_first_batch(state: dict[str, Any]) -> tuple[float, torch.Tensor]:
    loader = _resumable_loader()
    start = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    elapsed = time.perf_counter() - start
    loader.close()
    return elapsed, batch


# --- torchdata StatefulDataLoader ---------------------------------------------------------


def _stateful_loader():
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return StatefulDataLoader(
            IndexDataset(), batch_size=BATCH, shuffle=True, num_workers=WORKERS
        )


def _set_batches(state: dict[str, Any], batches: int) -> dict[str, Any]:
    state = copy.deepcopy(state)
    snapshot = state["_snapshot"]
    snapshot["_snapshot_step"] = batches
    snapshot["_last_yielded_worker_id"] = (batches - 1) % WORKERS
    main = snapshot["_main_snapshot"]
    main["_sampler_iter_yielded"] = batches
    main["_sampler_iter_state"]["samples_yielded"] = batches * BATCH
    main["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = batches * BATCH
    return state


def stateful_states(positions: list[int]) -> dict[int, dict[str, Any]]:
    """StatefulDataLoader states at ``positions`` (multiples of 32, inside the first epoch)."""
    loader = _stateful_loader()
    iterator = iter(loader)
    next(iterator)
    after_one = loader.state_dict()
    for _ in range(4):
        next(iterator)
    real_after_five = loader.state_dict()
    del iterator
    if not _same(_set_batches(after_one, 5), real_after_five):
        raise RuntimeError(
            "StatefulDataLoader's state layout changed: cannot synthesise far states"
        )
    return {
        position: _set_batches(after_one, position // BATCH)
        for position in positions
        if position > 0
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def stateful_first_batch(state: dict[str, Any] | None) -> float:
    loader = _stateful_loader()
    start = time.perf_counter()
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def _in_turn(positions: tuple[int, ...], repeat: int) -> tuple[int, ...]:
    """The positions of one repeat, the order rotating from repeat to repeat: a machine that
    slows down for a while slows every position alike, and none always goes first."""
    if not positions:  # --stateful-max below every position: nothing to measure
        return positions
    shift = repeat % len(positions)
    return positions[shift:] + positions[:shift]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (5 instead of 9)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--stateful-max",
        type=int,
        default=1_000_000,
        help="largest position for StatefulDataLoader",
    )
    parser.add_argument(
        "--no-stateful", action="store_true", help="skip torchdata's StatefulDataLoader"
    )
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 9)

    states = {position: resumable_state(position) for position in POSITIONS}
    ours: dict[int, list[float]] = {position: [] for position in POSITIONS}
    first: dict[int, torch.Tensor] = {}
    for repeat in range(repeats):
        for position in _in_turn(POSITIONS, repeat):
            elapsed, first[position] = resumable_first_batch(states[position])
            ours[position].append(elapsed)
    for position, state in states.items():
        # The first batch really is the stream at `position`.
        sampler = InfiniteRandomSampler(IndexDataset(), resumable=True)
        sampler.load_state_dict(state["sampler"])
        expected = list(itertools.islice(iter(sampler), BATCH))
        if first[position][:, 0].tolist() != expected:
            raise RuntimeError(
                f"the first batch after loading position {position} is not the stream there"
            )

    theirs: dict[int, list[float]] = {}
    skipped: dict[int, str] = {}
    if args.no_stateful:
        skipped = {position: "not run (--no-stateful)" for position in POSITIONS}
    else:
        supported = [p for p in POSITIONS if p < SIZE and p <= args.stateful_max]
        stateful = stateful_states(supported)
        theirs = {position: [] for position in supported}
        for repeat in range(repeats):
            for position in _in_turn(tuple(supported), repeat):
                theirs[position].append(stateful_first_batch(stateful.get(position)))
        for position in POSITIONS:
            if position not in theirs:
                skipped[position] = (
                    "n/a: beyond one epoch (would replay 25 shuffles)"
                    if position >= SIZE
                    else "capped"
                )

    medians = {position: median(times) for position, times in ours.items()}
    spread = max(medians.values()) / min(medians.values())
    rows = []
    for position in POSITIONS:
        rows.append(
            [
                f"{position:,}",
                f"{medians[position] * 1e3:.1f}",
                " ".join(f"{t * 1e3:.1f}" for t in ours[position]),
                f"{median(theirs[position]) * 1e3:.1f}"
                if position in theirs
                else skipped[position],
                " ".join(f"{t * 1e3:.1f}" for t in theirs.get(position, [])),
            ]
        )
    print_table(
        f"Time to first batch after load_state_dict: {SIZE:,} samples, batch_size={BATCH}, "
        f"num_workers={WORKERS}, median of {repeats} (ms). ResumableDataLoader max/min = {spread:.2f} "
        f"(target <= {TARGET}). StatefulDataLoader capped at positions <= {args.stateful_max:,}.",
        ["position", "Resumable (ms)", "all runs", "StatefulDataLoader (ms)", "all runs"],
        rows,
    )
    path = write_json(
        "loader_resume",
        {
            "settings": {
                "dataset_size": SIZE,
                "batch_size": BATCH,
                "num_workers": WORKERS,
                "repeats": repeats,
            },
            "target_max_over_min": TARGET,
            "resumable": {str(p): times for p, times in ours.items()},
            "resumable_max_over_min": spread,
            "stateful_dataloader": {str(p): times for p, times in theirs.items()},
            "stateful_dataloader_skipped": {str(p): why for p, why in skipped.items()},
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
