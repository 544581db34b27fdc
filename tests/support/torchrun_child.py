"""A worker started by ``torchrun``: DDP over gloo, paused by a SIGTERM to the process group.

``torchrun --standalone --nproc-per-node 2 -m support.torchrun_child OUT`` (tests/ on
``PYTHONPATH``): each rank trains a small DDP model with ``pause_on_signal``; rank 0
prints ``READY`` after step 3 and every rank waits there for the signal, then trains
on until the pause lands. Each rank writes ``OUT/rank<r>.txt`` ("paused at <step>")
and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from support.ddp_workers import COLLECTIVE_TIMEOUT, DDPTrainer

WAIT_S = 300.0  # a bound on the wait for the signal, not a synchronisation


def main(out: Path) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    rank = dist.get_rank()
    trainer = DDPTrainer()
    with trainer.pause_on_signal(out / "pause.ckpt"):
        while not trainer.paused and trainer.completed_steps < 1000:
            trainer.step()
            if trainer.completed_steps == 3:
                if rank == 0:
                    print("READY", flush=True)
                deadline = time.monotonic() + WAIT_S
                while not trainer.pause_requested:
                    if time.monotonic() > deadline:
                        return 3
                    time.sleep(0.01)
    (out / f"rank{rank}.txt").write_text(f"paused at {trainer.completed_steps}")
    trainer.loader.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if trainer.paused else 4


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown under gloo's threads (see ddp_workers)
