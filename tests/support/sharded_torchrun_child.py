"""A rank of a sharded run under ``torchrun`` whose blocks are wrapped as torchtitan wraps them
(``checkpoint_wrapper``, then ``torch.compile`` replacing the block, then ``fully_shard``).

``torchrun --standalone --nproc-per-node 2 -m support.sharded_torchrun_child JOB OUT``
(tests/ on ``PYTHONPATH``):

- ``pause``: each rank runs the compiled trainer uninterrupted for ``STEPS`` steps
  (``uninterrupted``), then a fresh one with ``pause_on_signal(OUT/pause)``; rank 0
  prints ``READY`` after step ``PAUSE - 1`` and every rank waits there for the signal,
  then steps until the pause lands (``at_pause``, ``paused_at``). Where no compiler
  works, rank 0 writes ``OUT/no-compiler.txt`` with the reason and every rank exits.
- ``resume``: in a new ``torchrun``, a fresh compiled trainer resumes ``OUT/pause``
  (``at_resume``) and runs to ``STEPS`` (``end``); a fresh eager one (the same blocks,
  checkpoint-wrapped, not compiled) resumes it too (``eager_at_resume``).

- ``points``: resume points every ``POINT_EVERY`` steps (``keep=2``); each rank first
  runs uninterrupted for ``POINT_STEPS`` steps (``uninterrupted``, ``at_resumed_point``),
  then trains with points; rank 1 is SIGKILLed while writing its part of the point at
  ``DYING_POINT`` (after its shards, in its rank file), so that point stays incomplete
  and the job fails.
- ``latest``: in a new ``torchrun``, ``resume_latest()`` (``resumed_from``, ``at_resume``),
  then on to ``POINT_STEPS`` with points (``end``, ``points``: the point directories left).

Each rank saves its shards of the weights and gradients by parameter order, the
optimizer, scheduler, loader and RNG states (``fsdp_workers.by_parameter_order``) in
``OUT/<JOB>-rank<r>.pt`` and exits 0. Deterministic algorithms on, one thread: inductor's
CPU kernels then sum in the same order in every process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from support.compiled_runs import NO_COMPILER, compiler_missing
from support.ddp_workers import COLLECTIVE_TIMEOUT, CONFIG
from support.fsdp_workers import (
    CheckpointedTrainer,
    CompiledTrainer,
    FSDPTrainer,
    by_parameter_order,
)
from trainer_resume import ResumePoints
from trainer_resume.resume_points.sharded_points import list_sharded_points, sharded_point_name
from trainer_resume.sharded import write

STEPS = 5
PAUSE = 3
POINT_EVERY = 2
POINT_STEPS = 8
DYING_POINT = 6
RESUMED_POINT = DYING_POINT - POINT_EVERY
WAIT_S = 300.0  # a bound on the wait for the signal, not a synchronisation


def _pause(out: Path, rank: int) -> dict[str, Any]:
    reference = CompiledTrainer()
    while reference.completed_steps < STEPS:
        reference.step()
    result = {"uninterrupted": by_parameter_order(reference)}
    reference.loader.close()
    trainer = CompiledTrainer()
    with trainer.pause_on_signal(out / "pause"):
        while not trainer.paused and trainer.completed_steps < STEPS:
            trainer.step()
            if trainer.completed_steps == PAUSE - 1:
                if rank == 0:
                    print("READY", flush=True)
                deadline = time.monotonic() + WAIT_S
                while not trainer.pause_requested:
                    if time.monotonic() > deadline:
                        raise TimeoutError("no pause signal came")
                    time.sleep(0.01)
    result.update(at_pause=by_parameter_order(trainer), paused_at=trainer.completed_steps)
    trainer.loader.close()
    return result


def _resume(out: Path) -> dict[str, Any]:
    trainer = CompiledTrainer()
    trainer.step()  # a state any missing restore would leave behind
    trainer.resume(out / "pause")
    result = {"at_resume": by_parameter_order(trainer)}
    while trainer.completed_steps < STEPS:
        trainer.step()
    result["end"] = by_parameter_order(trainer)
    trainer.loader.close()
    eager = CheckpointedTrainer()
    eager.step()
    eager.resume(out / "pause")
    result["eager_at_resume"] = by_parameter_order(eager)
    eager.loader.close()
    return result


def _points_trainer(out: Path) -> tuple[FSDPTrainer, ResumePoints]:
    points = ResumePoints(out / "points", every_steps=POINT_EVERY, keep=2, when_busy="wait")
    trainer = FSDPTrainer()
    trainer._initialize_training_resume(CONFIG, version="1", resume_points=points)
    return trainer, points


def _points(out: Path, rank: int) -> None:
    reference = FSDPTrainer()
    result: dict[str, Any] = {}
    while reference.completed_steps < POINT_STEPS:
        reference.step()
        if reference.completed_steps == RESUMED_POINT:
            result["at_resumed_point"] = by_parameter_order(reference)
    result["uninterrupted"] = by_parameter_order(reference)
    reference.loader.close()
    torch.save(result, out / f"points-rank{rank}.pt")  # before the kill
    trainer, _ = _points_trainer(out)
    if rank == 1:
        real = write.save_checkpoint

        def dying(checkpoint: Any, path: Any, **kwargs: Any) -> Any:
            if sharded_point_name(DYING_POINT) in str(path):
                os.kill(os.getpid(), signal.SIGKILL)  # its shards are written, its rank file not
            return real(checkpoint, path, **kwargs)

        write.save_checkpoint = dying
    while trainer.completed_steps < POINT_STEPS:
        trainer.step()
    raise AssertionError("rank 1 was not killed while writing its point")


def _latest(out: Path) -> dict[str, Any]:
    trainer, points = _points_trainer(out)
    trainer.step()  # a state any missing restore would leave behind
    resumed_from = trainer.resume_latest()
    result = {"resumed_from": resumed_from, "at_resume": by_parameter_order(trainer)}
    while trainer.completed_steps < POINT_STEPS:
        trainer.step()
    points.wait()
    dist.barrier()  # every rank's writer is done: the listing is final
    result["end"] = by_parameter_order(trainer)
    result["points"] = [
        (steps, committed) for steps, _, committed in list_sharded_points(out / "points")
    ]
    trainer.loader.close()
    return result


def main(job: str, out: Path) -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    rank = dist.get_rank()
    if job in ("points", "latest"):
        if job == "points":
            _points(out, rank)
        else:
            torch.save(_latest(out), out / f"latest-rank{rank}.pt")
        dist.barrier()
        dist.destroy_process_group()
        return 0
    reason = compiler_missing()
    if reason is not None:  # the test skips, naming the reason
        if rank == 0:
            (out / NO_COMPILER).write_text(reason)
        dist.destroy_process_group()
        return 0
    result = _pause(out, rank) if job == "pause" else _resume(out)
    torch.save(result, out / f"{job}-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], Path(sys.argv[2]))
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown under gloo's and inductor's threads
