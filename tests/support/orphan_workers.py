"""A trainer process whose loaders' workers are running, for the parent-death tests.

``python -m support.orphan_workers started`` (tests/ on ``PYTHONPATH``) starts, from the
main thread, the workers of each loader the library starts workers for, reads one
batch from each, prints one JSON line ``{loader: [worker pids]}`` and waits for its
stdin to close (the test SIGKILLs it first):

* ``map-fork`` (two workers), ``map-spawn``, ``map-forkserver`` (one each): a
  resumable map-style loader;
* ``iterable-fork``: a resumable loader over a stateful ``IterableDataset``;
* ``plain-fork``: a ``ResumableDataLoader`` with ``resumable=False``;
* ``dali-fork``: a ``ResumableDALIIterator`` whose pipeline has a parallel external
  source (DALI forks its Python workers when the pipeline is built).

``python -m support.orphan_workers late DIRECTORY`` forks two children that wait for
their stdin to close (the test SIGKILLs this process and reaps it first), then tie
themselves to this dead process as a loader worker does, once as the main thread's
child and once as a forkserver's; each writes ``survived-<kind>`` into ``DIRECTORY`` if
it is still alive after that. Prints ``forked <pid> <pid>``.

``python -m support.orphan_workers thread`` starts persistent fork workers from a
thread that then ends, reads every batch of three epochs in the main thread and prints
``{"batches": n}``: workers started off the main thread are not tied to that thread.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from typing import Any

import numpy as np
from nvidia.dali import fn, pipeline_def

from support.iterable_streams import CountingStream
from support.signal_trainers import NoisyDataset
from trainer_resume.adapters.dali import ResumableDALIIterator
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.processes.parent_death import die_with_parent, tie


def dali_sample(info: Any) -> np.ndarray:
    return np.full((2,), info.idx_in_epoch, dtype=np.float32)


@pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="fork")
def parallel_pipeline():
    return fn.external_source(source=dali_sample, parallel=True, batch=False)


def _children() -> set[int]:
    return {child.pid for child in multiprocessing.active_children() if child.pid}


def _loader(context: str, workers: int = 2, **options: Any) -> ResumableDataLoader:
    options.setdefault("resumable", True)
    return ResumableDataLoader(
        NoisyDataset(),
        batch_size=2,
        num_workers=workers,
        multiprocessing_context=context,
        **options,
    )


def started() -> None:
    running: list[Any] = []  # keeps every iterator, and with it its workers, alive
    pids: dict[str, list[int]] = {}

    def start(name: str, make: Any) -> None:
        before = _children()
        iterator = make()
        next(iterator)
        running.append(iterator)
        pids[name] = sorted(_children() - before)

    # DALI first: it forks its workers from a process that started no other workers yet.
    start(
        "dali-fork",
        lambda: iter(
            ResumableDALIIterator(
                parallel_pipeline, ["x"], pipeline_kwargs={"enable_checkpointing": True}
            )
        ),
    )
    start("map-fork", lambda: iter(_loader("fork")))
    start("iterable-fork", lambda: iter(_iterable()))
    start("plain-fork", lambda: iter(_loader("fork", resumable=False)))
    # One worker each: every one imports torch.
    start("map-spawn", lambda: iter(_loader("spawn", 1)))
    start("map-forkserver", lambda: iter(_loader("forkserver", 1)))
    print(json.dumps(pids), flush=True)
    sys.stdin.read()


def _iterable() -> ResumableDataLoader:
    return ResumableDataLoader(
        CountingStream(),
        batch_size=3,
        num_workers=1,
        multiprocessing_context="fork",
        resumable=True,
    )


def thread() -> None:
    loader = _loader("fork", persistent_workers=True)
    holder: list[Any] = []
    starter = threading.Thread(target=lambda: holder.append(iter(loader)))
    starter.start()
    starter.join()  # the thread that forked the workers has ended
    batches = sum(1 for _ in holder[0])
    batches += sum(1 for _ in range(2) for _ in loader)  # the same workers, two more epochs
    print(json.dumps({"batches": batches}), flush=True)


def late(directory: str) -> None:
    bonds = {"main-thread": tie(), "forkserver": tie(direct=False)}
    children = []
    for kind, bond in bonds.items():
        child = os.fork()
        if child == 0:
            sys.stdin.read()  # the test SIGKILLs this process, reaps it, then closes stdin
            assert bond is not None
            die_with_parent(bond)
            with open(os.path.join(directory, f"survived-{kind}"), "w") as marker:
                marker.write("alive after die_with_parent")
            os._exit(0)
        children.append(child)
    print("forked", *children, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    {"started": started, "thread": thread, "late": late}[sys.argv[1]](*sys.argv[2:])
