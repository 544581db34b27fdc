"""Ranks of a small DDP training run (gloo, CPU) for the distributed tests.

Module level on purpose: every rank (forked from a forkserver that preloads it) finds
its functions here by name. Each rank writes ``result_<tag>_rank<r>.pt`` (weights,
optimizer and scheduler states, every batch, the sample ids per step) or
``error_<tag>_rank<r>.txt``.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import random
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from trainer_resume import ResumePoints
from trainer_resume.distributed import WorldSizeChangeWarning
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, training_step

SIZE = 24
BATCH = 2  # per rank
FEATURES = 4
CONFIG = {
    "model": {"hidden": 8, "dropout": 0.25},
    "optim": {"lr": 0.05, "decay": 0.9},
    "data": {"size": SIZE},
}
# Generous on purpose: on a loaded machine importing torch in a fresh rank alone has
# taken 40 s. These bound a hang; a dead rank is noticed within seconds anyway.
JOIN_TIMEOUT_S = 300.0
COLLECTIVE_TIMEOUT = timedelta(seconds=240)


class IdDataset(Dataset):
    """Sample ``i``: features with random augmentation, a target, and the id ``i``."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(SIZE, FEATURES, generator=generator)
        self.y = torch.randn(SIZE, 1, generator=generator)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x = self.x[index] + 0.1 * torch.randn(FEATURES) * float(np.random.uniform(0.5, 1.5))
        return (-x if random.random() < 0.5 else x), self.y[index], index


class RankTrainer(TrainingResumeMixin):
    """What every distributed test rank shares: the model's layers (Dropout), AdamW, a
    per-step LR schedule, the loader, the seeds. Subclasses distribute the model
    (:meth:`_distribute`); without a process group it stays a plain module."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        hidden, dropout = CONFIG["model"]["hidden"], CONFIG["model"]["dropout"]
        self.module = nn.Sequential(
            nn.Linear(FEATURES, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 1),
        )
        distributed = dist.is_available() and dist.is_initialized()
        self.model = self._distribute(self.module) if distributed else self.module
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=CONFIG["optim"]["lr"])
        decay = CONFIG["optim"]["decay"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: decay**step)
        dataset = IdDataset()
        # Same seeds on every rank: one global stream; the sampler shards it by the process group.
        sampler = InfiniteRandomSampler(
            dataset, generator=torch.Generator().manual_seed(11), resumable=True
        )
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=BATCH,
            sampler=sampler,
            generator=torch.Generator().manual_seed(12),
            resumable=True,
        )
        self.iterator = iter(self.loader)
        # Each rank's main-process generators differ (dropout masks differ per rank), so
        # resuming a rank with another rank's RNG state would show.
        rank = dist.get_rank() if distributed else 0
        torch.manual_seed(100 + rank)
        random.seed(100 + rank)
        np.random.seed(100 + rank)
        self.batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.kill_in_pause: int | None = None  # completed step at which this rank dies in pause()
        self.extra = {"marker": 1}
        self.checkpoint_in_step = False  # the next step asks for a resume point (this rank only)
        self._initialize_training_resume(CONFIG, version="1")

    def _distribute(self, module: nn.Module) -> nn.Module:
        raise NotImplementedError

    def _resume_objects(self) -> dict[str, Any]:
        return {
            "model": self.module,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
        }

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        if self.kill_in_pause is not None and self.completed_steps == self.kill_in_pause:
            os.kill(os.getpid(), signal.SIGKILL)  # dies before its state reaches rank 0
        return dict(self.extra)

    def _load_resume_extra_state(self, state: Any) -> None:
        self.extra = dict(state)

    def _rebuild_resume_iterators(self) -> None:
        self.iterator = iter(self.loader)

    @training_step
    def step(self) -> None:
        x, y, ids = next(self.iterator)
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.batches.append((x, y, ids))
        if self.checkpoint_in_step:
            self.checkpoint_in_step = False
            self.checkpoint()  # taken by every rank when this step completes


class DDPTrainer(RankTrainer):
    """The shared rank trainer with its model wrapped in DistributedDataParallel."""

    def _distribute(self, module: nn.Module) -> nn.Module:
        return DistributedDataParallel(module)


class WrappedDDPTrainer(DDPTrainer):
    """Returns the DistributedDataParallel wrapper itself as the model (its names under ``module.``)."""

    def _resume_objects(self) -> dict[str, Any]:
        return {**super()._resume_objects(), "model": self.model}


def _kill_at_replace(trainer: DDPTrainer, step: int) -> None:
    """Rank 0 dies inside the durable write of the pause at ``step``, before the rename."""
    real = os.replace

    def dying_replace(*args: Any, **kwargs: Any) -> Any:
        if trainer.completed_steps == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    os.replace = dying_replace


def _capture_stderr(path: Path) -> None:
    """Send this rank's fd 2 to ``path``: C++ aborts (gloo, ``terminate called``) and
    faulthandler's Python traceback on a fatal signal land there for ``describe_exits``."""
    sys.stderr.flush()
    stream = open(path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(stream.fileno(), 2)
    faulthandler.enable(file=stream, all_threads=True)


def join_group(rank: int, world: int, init_file: str) -> None:
    """Join the test's gloo group as ``rank`` of ``world`` (one intra-op thread each)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    """One rank: optionally resume, run steps, honour pause requests, save the result.

    ``job`` keys: ``tag``; ``steps`` (run until ``completed_steps`` reaches it) or
    ``more`` (run this many steps after resuming); ``resume`` (pause file);
    ``requests`` ({step: [pause file, requesting rank]}: that rank asks for a pause
    before the step, so all ranks pause when it completes); ``kill`` ([rank, step,
    "state" | "replace"]); ``points`` ([directory, every_steps]: take resume points);
    ``resume_latest`` (resume from the newest point of ``points``); ``checkpoint``
    ([step, rank]: that rank calls ``checkpoint()`` inside that step); ``wrapped``
    (the resume objects hold the DDP wrapper, not the module it wraps); ``rank_config``
    ({rank: {key: value}}: config entries of that rank's own, as a device per rank).
    """
    tag = job["tag"]
    _capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        warnings.simplefilter("always", WorldSizeChangeWarning)
        join_group(rank, world, init_file)
        trainer = WrappedDDPTrainer() if job.get("wrapped") else DDPTrainer()
        points = None
        config = {**CONFIG, **job.get("rank_config", {}).get(str(rank), {})}
        if job.get("points"):
            points = ResumePoints(job["points"][0], every_steps=job["points"][1], when_busy="wait")
        if points is not None or config != CONFIG:
            trainer._initialize_training_resume(config, version="1", resume_points=points)
        kill = job.get("kill")
        if kill is not None and kill[0] == rank:
            if kill[2] == "state":
                trainer.kill_in_pause = kill[1]
            else:
                _kill_at_replace(trainer, kill[1])
        caught: list[str] = []
        resumed_steps = None
        if job.get("resume"):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", WorldSizeChangeWarning)
                trainer.resume(job["resume"])
            caught = [
                str(w.message) for w in seen if issubclass(w.category, WorldSizeChangeWarning)
            ]
            resumed_steps = trainer.completed_steps
        if job.get("resume_latest"):
            trainer.resume_latest()
            resumed_steps = trainer.completed_steps
        target = job["steps"] if "steps" in job else trainer.completed_steps + job["more"]
        requests = {int(step): value for step, value in job.get("requests", {}).items()}
        paused_at = []
        while trainer.completed_steps < target:
            request = requests.get(trainer.completed_steps + 1)
            if request is not None and request[1] == rank:
                trainer.request_pause(request[0])
            if job.get("checkpoint") == [trainer.completed_steps + 1, rank]:
                trainer.checkpoint_in_step = True
            trainer.step()
            if trainer.paused:
                paused_at.append(trainer.completed_steps)
                if job.get("continue_after_pause"):
                    trainer.resume(
                        requests[trainer.completed_steps][0]
                    )  # in-process: the same state
                    continue
                break
        if points is not None:
            points.wait()  # a rank ends with os._exit: nothing joins the writer
        torch.save(
            {
                "model": trainer.module.state_dict(),
                "optimizer": trainer.optimizer.state_dict(),
                "scheduler_last_epoch": trainer.scheduler.last_epoch,
                "batches": trainer.batches,
                "ids": [ids.tolist() for _, _, ids in trainer.batches],
                "completed_steps": trainer.completed_steps,
                "resumed_steps": resumed_steps,
                "paused_at": paused_at,
                "warnings": caught,
                "lr": trainer.optimizer.param_groups[0]["lr"],
            },
            Path(out, f"result_{tag}_rank{rank}.pt"),
        )
        trainer.loader.close()
        # No rank tears its connections down while a peer may still read from them.
        dist.barrier()
        # DDP holds the process group and gloo work objects: free them while the
        # interpreter is fully alive. Left to interpreter shutdown, gloo's threads
        # release tensors after Python stopped handing out the GIL, which aborts
        # the process now and then (SIGABRT) after a successful run.
        del trainer
        gc.collect()
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
    _exit_now()


def _exit_now() -> None:
    """End a rank that finished its job without interpreter shutdown.

    Every result is on disk and the process group is gone; what interpreter
    shutdown would add (destroying torch's C++ state while its threads may still
    run) can only turn a finished rank into a crashed one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _as_launched(
    rank: int,
    launcher: tuple[str, dict[str, str], set[signal.Signals]],
    main: Callable[..., None],
    *args: Any,
) -> None:
    """Run ``main(rank, *args)`` in the launching process's directory, environment and
    signal mask (a forkserver's child starts in the server's)."""
    directory, environment, mask = launcher
    os.chdir(directory)
    os.environ.clear()
    os.environ.update(environment)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    main(rank, *args)


def launch(
    world: int,
    job: dict[str, Any],
    out: Path,
    *,
    timeout: float = JOIN_TIMEOUT_S,
    main: Callable[[int, int, str, dict[str, Any], str], None] | None = None,
) -> list[int | None]:
    """Run ``world`` ranks of ``job``; returns their exit codes (killed ranks: negative).

    Every rank is joined with a deadline; ranks still alive after it (e.g. blocked in
    a collective after a peer died) are killed. ``main`` (default: this module's
    ``rank_main``) is a module-level function the ranks find by name.
    """
    init_file = out / f"init_{job['tag']}"
    # Each rank is a process of its own, forked from a server that has torch imported
    # and never computed with it (a spawned rank spent seconds importing torch, and
    # torch._dynamo, which the optimizers import on first use, anew); it starts as a
    # spawned one would: in this process's directory, environment and signal mask.
    mp.set_forkserver_preload(["torch", "torch._dynamo", "support.ddp_workers"])
    launcher = (os.getcwd(), dict(os.environ), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    context = mp.start_processes(
        _as_launched,
        args=(launcher, rank_main if main is None else main, world, str(init_file), job, str(out)),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout
    processes = context.processes
    grace: float | None = None
    while time.monotonic() < deadline and any(process.is_alive() for process in processes):
        if grace is None and any(process.exitcode not in (None, 0) for process in processes):
            # A rank died: the others may be blocked in a collective with it.
            grace = time.monotonic() + 10.0
        if grace is not None and time.monotonic() > grace:
            break
        processes[0].join(0.1)
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(10)
    return [process.exitcode for process in processes]


def describe_exits(codes: list[int | None], tag: str, out: Path, *, lines: int = 30) -> str:
    """The exit codes, then the tail of each failed rank's traceback file and stderr."""
    parts = [f"exit codes {codes}"]
    for rank, code in enumerate(codes):
        if code == 0:
            continue
        for kind in ("error", "stderr"):
            path = out / f"{kind}_{tag}_rank{rank}.txt"
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- rank {rank} (exit {code}) {path.name}:\n{tail}")
    return "\n".join(parts)


def load_results(world: int, tag: str, out: Path) -> list[dict[str, Any]]:
    results = []
    for rank in range(world):
        error = out / f"error_{tag}_rank{rank}.txt"
        assert not error.exists(), error.read_text()
        results.append(torch.load(out / f"result_{tag}_rank{rank}.pt", weights_only=True))
    return results
