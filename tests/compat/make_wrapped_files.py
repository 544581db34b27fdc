"""Write pause files of a wrapped model with whichever checkout of the library is imported.

``test_wrapped_files.py`` runs this script with the package as it was before module state
was saved under the unwrapped module's names (commit 158d509, extracted by
``support.earlier_release``): its files name every weight and gradient as the wrapper
does (``_orig_mod.`` of ``torch.compile``, ``module.`` of DataParallel). By hand:

    mkdir old && git archive 158d509 trainer_resume | tar -x -C old
    PYTHONPATH=old:tests python tests/compat/make_wrapped_files.py /tmp/wrapped

One pause file per wrapping, ``<wrapping>.ckpt``, after ``PAUSE_STEP`` steps (inside an
accumulation window, so with gradients). The steps run eager: a compiled wrapping is an
``OptimizedModule`` that is never called, so no compiler is needed. And the sharded pause
directory ``sharded`` of a model whose blocks are checkpoint-wrapped and sharded by
``fully_shard`` (one gloo rank), after ``SHARDED_PAUSE_STEP`` steps: its gradients carry
``_checkpoint_wrapped_module.`` in their names.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch.distributed as dist
from support.wrapped_trainers import PAUSE_STEP, WRAPPINGS, WrappedTrainer

import trainer_resume

SHARDED_PAUSE_STEP = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the directory the files go to")
    args = parser.parse_args()
    print(f"writing with {trainer_resume.__file__}")
    args.out.mkdir(parents=True, exist_ok=True)
    for wrapping in WRAPPINGS:
        trainer = WrappedTrainer(wrapping)
        trainer.run_to(PAUSE_STEP)
        trainer.pause(args.out / f"{wrapping}.ckpt")
        trainer.loader.close()
    with tempfile.TemporaryDirectory() as scratch:
        dist.init_process_group("gloo", init_method=f"file://{scratch}/init", rank=0, world_size=1)
        try:
            from support.fsdp_workers import CheckpointedTrainer

            sharded = CheckpointedTrainer()
            for _ in range(SHARDED_PAUSE_STEP):
                sharded.step()
            sharded.pause(args.out / "sharded")
            sharded.loader.close()
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
