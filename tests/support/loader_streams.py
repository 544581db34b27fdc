"""Datasets, loader factories and spawned-process entry points for the loader tests.

Module level on purpose: a spawned process (and a spawned worker) imports this
module by name to unpickle what the tests send it.
"""

from __future__ import annotations

import atexit
import io
import json
import multiprocessing
import os
import random
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader, build_batch_sampler

SIZE = 10
BATCH = 4
TARGETS = ("sampler", "naive", "class_balance", "balance")
# Unequal classes (5, 2, 3): class_balance oversamples to 3 * 5 = 15 samples per cycle.
LABELS = [0, 0, 0, 0, 0, 1, 1, 2, 2, 2]
# balance: group 0 (5 indices) x 1.5 -> 7 samples, group 1 (5 indices) x 0.4 -> 2 samples.
GROUPS = [index % 2 for index in range(SIZE)]
RATIOS = {0: 1.5, 1: 0.4}


class AugmentedDataset(Dataset):
    """Row ``[index, random.random(), numpy.random.rand(), torch.rand()]``: the id plus one
    draw from each generator that augmentation code typically uses."""

    def __init__(self, size: int = SIZE, labels: list[int] | None = None) -> None:
        self.size = size
        self.labels = (
            list(labels) if labels is not None else [LABELS[i % len(LABELS)] for i in range(size)]
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(
            [float(index), random.random(), float(np.random.rand()), float(torch.rand(()))],
            dtype=torch.float64,
        )


class FlagFailingDataset(AugmentedDataset):
    """Raises for ``bad_index`` while the flag file exists (visible to worker processes too)."""

    def __init__(self, flag: str, bad_index: int, size: int = SIZE) -> None:
        super().__init__(size)
        self.flag = flag
        self.bad_index = bad_index

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad_index and Path(self.flag).exists():
            raise ValueError(f"cannot decode sample {index}")
        return super().__getitem__(index)


class FlagExitingDataset(FlagFailingDataset):
    """The worker process dies (``os._exit``) at ``bad_index`` while the flag file exists."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad_index and Path(self.flag).exists():
            os._exit(3)
        return super().__getitem__(index)


class UnpicklableError(Exception):
    """Needs two arguments, so unpickling it from ``args`` (one message) fails."""

    def __init__(self, index: int, text: str) -> None:
        super().__init__(f"sample {index} is {text}")


class UnpicklableFailureDataset(AugmentedDataset):
    """Every sample raises an exception that cannot cross a process boundary."""

    def __getitem__(self, index: int) -> torch.Tensor:
        raise UnpicklableError(0, "unreadable")


def noisy_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    """Stack the samples and append a row drawn by the collate function itself."""
    extra = torch.tensor(
        [-1.0, random.random(), float(np.random.rand()), float(torch.rand(()))], dtype=torch.float64
    )
    return torch.cat([torch.stack(samples), extra[None]])


def mark_worker(directory: str, worker_id: int) -> None:
    """A worker_init_fn (bound with functools.partial) that leaves a file per worker."""
    info = torch.utils.data.get_worker_info()
    assert info is not None and info.id == worker_id
    Path(directory, f"worker-{worker_id}").touch()
    random.random()  # drawing from the worker's generators must not change the stream


def abort_at_exit(worker_id: int) -> None:
    """A worker_init_fn whose worker aborts in its own interpreter exit (SIGABRT), as a
    native library that leaves a thread running can make it do."""
    atexit.register(os.abort)


def batches_per_cycle(target: str) -> int:
    return {"sampler": 0, "naive": 3, "class_balance": 4, "balance": 3}[target]


def pause_points(target: str) -> list[int]:
    """0, 1, mid-cycle, before the last batch of a cycle, at the cycle end, across the boundary."""
    if target == "sampler":
        # 10 samples, batches of 4: batch 2 (positions 8..11) straddles the first cycle
        # boundary, batch 4 (16..19) is the last one inside cycle 1, and batch 5 starts
        # exactly at cycle 2 (position 20).
        return [0, 1, 2, 3, 4, 5, 6]
    per_cycle = batches_per_cycle(target)
    return [0, 1, per_cycle // 2, per_cycle - 1, per_cycle, per_cycle + 1]


def make_loader(
    target: str,
    *,
    num_workers: int = 0,
    dataset: Dataset | None = None,
    repeat: bool = True,
    collate_fn: Any = noisy_collate,
    **options: Any,
) -> ResumableDataLoader:
    """A resumable loader over :class:`AugmentedDataset` for one of :data:`TARGETS`."""
    dataset = AugmentedDataset() if dataset is None else dataset
    if target == "sampler":
        sampler = InfiniteRandomSampler(dataset, resumable=True)
        return ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            resumable=True,
            **options,
        )
    target_options: dict[str, Any] = {}
    if target == "balance":
        target_options = {"groups": GROUPS, "ratios": RATIOS}
    batch_sampler = build_batch_sampler(
        target,
        dataset,
        BATCH,
        repeat=repeat,
        shuffle=True,
        drop_last=False,
        resumable=True,
        **target_options,
    )
    return ResumableDataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        resumable=True,
        **options,
    )


def run_with_states(target: str, num_workers: int, count: int, *, seed: int = 0, **options: Any):
    """Uninterrupted run: ``count`` batches, and the loader state before each one (and after the last)."""
    torch.manual_seed(seed)
    loader = make_loader(target, num_workers=num_workers, **options)
    iterator = iter(loader)
    batches, states = [], []
    for _ in range(count):
        states.append(loader.state_dict())
        batches.append(next(iterator))
    states.append(loader.state_dict())
    loader.close()
    return batches, states


def resume_jobs(jobs: list[tuple[str, int, int, dict, int]], out: str) -> None:
    """Spawned-process entry: for each ``(target, workers, k, state, count)`` build a fresh
    loader, load ``state`` and save the next ``count`` batches to ``out``."""
    try:
        torch.manual_seed(987654321)  # fresh seeds differ from the parent's; the state must win
        results = {}
        for target, num_workers, k, state, count in jobs:
            # Workers fork from this process (a spawned process would spawn them, which
            # costs seconds per loader); spawned workers have their own test.
            context = {"multiprocessing_context": "fork"} if num_workers else {}
            loader = make_loader(target, num_workers=num_workers, **context)
            loader.load_state_dict(state)
            iterator = iter(loader)
            results[f"{target}/{num_workers}/{k}"] = [next(iterator) for _ in range(count)]
            loader.close()
        torch.save({"results": results}, out)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise


def run_spawned(function: Any, *args: Any, out: Path, timeout: float = 240) -> dict:
    """Run ``function(*args, str(out))`` in a spawned process and return what it saved."""
    process = multiprocessing.get_context("spawn").Process(target=function, args=(*args, str(out)))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(10)
        raise AssertionError(f"spawned process did not finish within {timeout} s")
    saved = torch.load(out, weights_only=True) if out.exists() else {"error": "no output"}
    if "error" in saved or process.exitcode != 0:
        raise AssertionError(
            f"spawned process failed (exit code {process.exitcode}):\n{saved.get('error')}"
        )
    return saved


def assert_plain_data(state: Any) -> None:
    """``state`` comes back unchanged from ``torch.load(weights_only=True)`` and from JSON."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state
    assert json.loads(json.dumps(state)) == state
