"""Sharded pause of an FSDP2 model: pause time and per-rank peak memory vs gathering to rank 0.

Two gloo ranks on CPU shard a stack of Linear layers with ``fully_shard`` and take
one AdamW step (so the optimizer state exists), then pause in turn, in rotating order:

* ``sharded pause()``: the library's sharded pause directory: every rank writes its
  own shards through ``torch.distributed.checkpoint`` and its own state file, digests
  its share of the files, rank 0 commits the manifest.
* ``gather to rank 0``: what one pause file of a sharded model needs: ``get_state_dict``
  with ``full_state_dict=True, cpu_offload=True`` gathers the whole model and optimizer
  state on rank 0, which writes it with ``save_checkpoint``.

Time: from a barrier until the last rank returns (a second barrier). Memory: each
rank's peak RSS above its baseline (``ru_maxrss`` after resetting it, Linux; large
blocks are mmapped so that memory freed by an earlier round leaves the RSS). The
median over the repeats is reported. Prints a table and writes JSON to
``benchmarks/out/sharded_pause.json``.

    python -m benchmarks.sharded_pause --quick   # ~8M parameters (~100 MB of state)
    python -m benchmarks.sharded_pause           # ~67M parameters (~800 MB of state)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks._common import peak_rss_bytes, print_table, reset_peak_rss, write_json

WORLD = 2
MODES = ("sharded pause()", "gather to rank 0")


def _path_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
    return path.stat().st_size


def sharded_rank_model(rank: int, init: str, width: int, layers: int) -> tuple[Any, Any]:
    """In a rank's process: join the gloo group at ``init`` (one thread), and build the
    benchmark model (``layers`` x ``Linear(width, width)``, each layer and the whole
    ``fully_shard``-ed on a CPU mesh of the world) and its AdamW."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=600),
    )
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _rank(rank: int, init: str, options: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from trainer_resume.durable import save_checkpoint
    from trainer_resume.mixin import TrainingResumeMixin

    class Trainer(TrainingResumeMixin):
        def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
            self.model, self.optimizer = model, optimizer
            self._initialize_training_resume({"benchmark": "sharded_pause"}, version="1")

        def _resume_objects(self) -> dict[str, Any]:
            return {"model": self.model, "optimizer": self.optimizer}

        def _resume_loaders(self) -> dict[str, Any]:
            return {}

    width = options["width"]
    model, optimizer = sharded_rank_model(rank, init, width, options["layers"])
    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    trainer = Trainer(model, optimizer)
    local_bytes = sum(p.to_local().nbytes for p in model.parameters()) * 3  # + exp_avg(_sq)

    def gather_to_rank0(path: Path) -> None:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(model, optimizer, options=full)
        if rank == 0:
            save_checkpoint({"model": model_state, "optimizer": optimizer_state}, path)

    actions = {MODES[0]: trainer.pause, MODES[1]: gather_to_rank0}
    runs: list[dict[str, Any]] = []
    directory = Path(options["directory"])
    for repeat in range(options["repeats"] + 1):  # round 0 warms up and is dropped
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for mode in order:
            path = directory / f"{repeat}-{MODES.index(mode)}"
            if hasattr(os, "sync"):
                os.sync()
            gc.collect()
            reset = reset_peak_rss()
            baseline = peak_rss_bytes()
            dist.barrier()
            start = time.perf_counter()
            actions[mode](path)
            dist.barrier()
            seconds = time.perf_counter() - start
            peak = peak_rss_bytes() - baseline
            written = _path_bytes(path) if rank == 0 else 0
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            if repeat:
                runs.append(
                    {
                        "mode": mode,
                        "seconds": seconds,
                        "peak_above_baseline_bytes": peak,
                        "peak_reset": reset,
                        "written_bytes": written,
                    }
                )
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"local_state_bytes": local_bytes, "runs": runs})
    )
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~8M parameters instead of ~67M")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    # Large blocks from mmap, returned to the system when freed: otherwise glibc keeps
    # the memory a round freed resident, and the next round's peak would hide in it.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 17))
    width, layers = (1024, 8) if args.quick else (2048, 16)
    with tempfile.TemporaryDirectory() as scratch:
        options = {"width": width, "layers": layers, "repeats": args.repeats, "directory": scratch}
        mp.spawn(_rank, args=(str(Path(scratch, "init")), options, scratch), nprocs=WORLD)
        ranks = [json.loads(Path(scratch, f"rank{r}.json").read_text()) for r in range(WORLD)]
    parameters = width * width * layers + width * layers
    state = sum(rank["local_state_bytes"] for rank in ranks)
    rows, results = [], {}
    for mode in MODES:
        per_rank = [[run for run in rank["runs"] if run["mode"] == mode] for rank in ranks]
        seconds = statistics.median(
            max(r[i]["seconds"] for r in per_rank) for i in range(args.repeats)
        )
        peaks = [
            statistics.median(run["peak_above_baseline_bytes"] for run in runs) for runs in per_rank
        ]
        written = per_rank[0][0]["written_bytes"]
        results[mode] = {
            "median_seconds": seconds,
            "median_peak_above_baseline_bytes": peaks,
            "written_bytes": written,
            "runs": per_rank,
        }
        rows.append(
            [
                mode,
                f"{seconds:.3f}",
                *(f"{peak / (1 << 20):,.1f}" for peak in peaks),
                f"{written / (1 << 20):,.1f}",
            ]
        )
    ratio = results[MODES[0]]["median_seconds"] / results[MODES[1]]["median_seconds"]
    print_table(
        f"Pause of an FSDP2 model on {WORLD} gloo ranks: {parameters / 1e6:.1f}M parameters, "
        f"{state / (1 << 20):,.0f} MiB of model + AdamW state; median of {args.repeats}",
        [
            "method",
            "median s",
            *(f"rank {r} peak MiB above baseline" for r in range(WORLD)),
            "MiB written",
        ],
        rows,
    )
    print(f"sharded / gathered time: {ratio:.2f}x")
    write_json(
        "sharded_pause",
        {
            "parameters": parameters,
            "state_bytes": state,
            "world": WORLD,
            "modes": results,
            "sharded_to_gathered_time": ratio,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
