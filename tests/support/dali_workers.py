"""Ranks of a 2-rank DDP run (gloo, CPU) fed by DALI pipelines, one shard per rank.

Started by ``support.ddp_workers.launch(world, job, out, main=rank_main)``. Each rank's
file reader reads its shard (``shard_id=rank``, ``num_shards=world``) of the images in
``job["root"]``; each run trains ``job["epochs"]`` epochs. ``job["mode"]``:

    pause   the uninterrupted run, then one run per ``job["pauses"]`` entry
            (``{name: step}``), in which rank 1 calls ``request_pause`` during that step;
            every rank pauses at the same boundary into ``OUT/<name>.ckpt``.
    resume  every one of those pause files resumed by a fresh trainer, each run finished.

Each rank writes ``result_<tag>_rank<r>.pt`` (see ``support.dali_runs.finished``) or
``error_<tag>_rank<r>.txt``.
"""

from __future__ import annotations

import gc
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from support import dali_runs, ddp_workers


def pause_file(out: str | Path, name: str) -> Path:
    return Path(out, f"{name}.ckpt")


def _trainer(job: dict[str, Any], rank: int, world: int, **options: Any) -> dali_runs.DALITrainer:
    loader = dali_runs.make_iterator("file", job["root"], shard=(rank, world))
    trainer = dali_runs.DALITrainer(loader, distributed=True, **options)
    torch.manual_seed(100 + rank)  # each rank's dropout masks differ, so a swapped RNG would show
    return trainer


def _pause(job: dict[str, Any], rank: int, world: int, out: str) -> dict[str, Any]:
    epochs = job["epochs"]
    trainer = _trainer(job, rank, world)
    results: dict[str, Any] = {
        "reference": dali_runs.finished(trainer, *dali_runs.train(trainer, epochs))
    }
    for name, step in job["pauses"].items():
        requester = {"pause_at": step, "pause_request": str(pause_file(out, name))}
        trainer = _trainer(job, rank, world, **(requester if rank == 1 else {}))
        seen, ends = dali_runs.train(trainer, epochs)
        assert trainer.paused, (name, rank)
        results[name] = {"seen": seen, "ends": ends, "completed_steps": trainer.completed_steps}
    return results


def _resume(job: dict[str, Any], rank: int, world: int, out: str) -> dict[str, Any]:
    results = {}
    for name in job["pauses"]:
        trainer = _trainer(job, rank, world)
        torch.manual_seed(1234)  # unlike the paused run: resume() restores every generator
        trainer.resume(pause_file(out, name))
        epoch = trainer.loader.epoch
        results[name] = dict(
            dali_runs.finished(trainer, *dali_runs.train(trainer, job["epochs"])),
            epoch_at_resume=epoch,
        )
    return results


def rank_main(rank: int, world: int, init_file: str, job: dict[str, Any], out: str) -> None:
    tag = job["tag"]
    ddp_workers._capture_stderr(Path(out, f"stderr_{tag}_rank{rank}.txt"))
    try:
        ddp_workers.join_group(rank, world, init_file)
        run = _pause if job["mode"] == "pause" else _resume
        torch.save(run(job, rank, world, out), Path(out, f"result_{tag}_rank{rank}.pt"))
        dist.barrier()  # no rank tears its connections down while a peer may still read
        gc.collect()  # DDP's gloo work objects, freed while the interpreter is fully alive
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"error_{tag}_rank{rank}.txt").write_text(traceback.format_exc())
        raise
    ddp_workers._exit_now()
