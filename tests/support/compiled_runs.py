"""Compiled runs of ``wrapped_trainers.WrappedTrainer`` (inductor on CPU), each job in a process of
its own, for ``tests/mixin/test_mixin_compiled.py``.

    python tests/support/compiled_runs.py pause WORKDIR
    python tests/support/compiled_runs.py resume WORKDIR
    python tests/support/compiled_runs.py sharded WORKDIR

``pause`` and ``sharded`` first compile a trial function: where no compiler works they
write ``no-compiler.txt`` with the reason and stop. ``pause`` runs the compiled trainer
uninterrupted (``uninterrupted.pt``) and to the pause step, pausing to
``compiled.ckpt`` (its state then: ``paused.pt``). ``resume``, in a new process, resumes
``compiled.ckpt`` and ``eager.ckpt`` (written by the test) in fresh compiled trainers and
runs each to the end (``resumed-<name>.pt``: the state right after the resume and at
the end). ``sharded`` runs ``fsdp_workers``' trainers with compiled, checkpoint-wrapped
and plain blocks under a gloo group of one rank, pausing and resuming across them
(``sharded.pt``). Deterministic algorithms are on: without them inductor's CPU kernels
may accumulate in another order from run to run. Compiling here, not in the test
process, keeps inductor's threads out of the processes the other tests fork.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import trainer_resume
from support.wrapped_trainers import PAUSE_STEP, STEPS, WrappedTrainer

NO_COMPILER = "no-compiler.txt"
RUN_DEADLINE_S = 600.0  # bounds a hang; a cold compile on a loaded machine takes a minute


def run_in_new_process(job: str, workdir: Path) -> str | None:
    """Run ``job`` on ``workdir`` in a new interpreter; why no compiler works, or ``None``.

    Raises:
        AssertionError: the job failed (its output attached).
    """
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, __file__, job, str(workdir)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=RUN_DEADLINE_S,
    )
    assert done.returncode == 0, f"compiled_runs.py {job} failed:\n{done.stdout}\n{done.stderr}"
    missing = workdir / NO_COMPILER
    return missing.read_text() if missing.exists() else None


def compiler_missing() -> str | None:
    """Why ``torch.compile`` cannot compile here, or ``None`` when a trial compile works."""
    try:
        torch.compile(lambda x: torch.relu(x) * 2)(torch.ones(3))
    except Exception as error:  # noqa: BLE001 - whatever the backend raised is the reason
        return f"torch.compile (inductor on CPU) fails here: {type(error).__name__}: {error}"
    return None


def _no_compiler(workdir: Path) -> bool:
    reason = compiler_missing()
    if reason is not None:
        (workdir / NO_COMPILER).write_text(reason)
    return reason is not None


def pause(workdir: Path) -> None:
    if _no_compiler(workdir):
        return
    reference = WrappedTrainer("compiled", compiled=True)
    reference.run_to(STEPS)
    reference.loader.close()
    torch.save(reference.outcome(), workdir / "uninterrupted.pt")
    paused = WrappedTrainer("compiled", compiled=True)
    paused.run_to(PAUSE_STEP)
    paused.pause(workdir / "compiled.ckpt")
    paused.loader.close()
    torch.save(paused.outcome(), workdir / "paused.pt")


def resume(workdir: Path) -> None:
    for name in ("compiled", "eager"):
        trainer = WrappedTrainer("compiled", compiled=True)
        torch.rand(3)  # a missing RNG restore must not pass by luck
        trainer.resume(workdir / f"{name}.ckpt")
        at_resume = trainer.outcome()
        trainer.run_to(STEPS)
        trainer.loader.close()
        torch.save(
            {"at_resume": at_resume, "end": trainer.outcome()}, workdir / f"resumed-{name}.pt"
        )


SHARDED_STEPS = 5
SHARDED_PAUSE = 2


def sharded(workdir: Path) -> None:
    """Each case's state (by parameter order) at the pause, right after the resume, at the end."""
    if _no_compiler(workdir):
        return
    import torch.distributed as dist

    from support.fsdp_workers import (
        CheckpointedTrainer,
        CompiledTrainer,
        FSDPTrainer,
        by_parameter_order,
    )

    kinds = {"compiled": CompiledTrainer, "checkpointed": CheckpointedTrainer, "plain": FSDPTrainer}
    dist.init_process_group("gloo", init_method=f"file://{workdir}/init", rank=0, world_size=1)
    results: dict[str, Any] = {}
    try:
        reference = CompiledTrainer()
        for _ in range(SHARDED_STEPS):
            reference.step()
        results["uninterrupted"] = by_parameter_order(reference)
        reference.loader.close()
        for paused_kind, resumed_kind in [
            ("compiled", "compiled"),
            ("compiled", "checkpointed"),
            ("compiled", "plain"),
            ("plain", "compiled"),
        ]:
            path = workdir / f"sharded-{paused_kind}-{resumed_kind}"
            paused = kinds[paused_kind]()
            for _ in range(SHARDED_PAUSE):
                paused.step()
            paused.pause(path)
            at_pause = by_parameter_order(paused)
            paused.loader.close()
            resumed = kinds[resumed_kind]()
            resumed.step()  # a state any missing restore would leave behind
            resumed.resume(path)
            at_resume = by_parameter_order(resumed)
            while resumed.completed_steps < SHARDED_STEPS:
                resumed.step()
            resumed.loader.close()
            results[f"{paused_kind}->{resumed_kind}"] = {
                "at_pause": at_pause,
                "at_resume": at_resume,
                "end": by_parameter_order(resumed),
            }
    finally:
        dist.destroy_process_group()
    torch.save(results, workdir / "sharded.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=("pause", "resume", "sharded"))
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    print(f"with {trainer_resume.__file__}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    {"pause": pause, "resume": resume, "sharded": sharded}[args.job](args.workdir)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
    os._exit(0)  # no interpreter teardown under gloo's and inductor's threads (see ddp_workers)
