"""Compiled runs of ``wrapped_trainers.WrappedTrainer`` (inductor on CPU), each job in a process of
its own, for ``tests/mixin/test_mixin_compiled.py``.

    python tests/support/compiled_runs.py pause WORKDIR
    python tests/support/compiled_runs.py resume WORKDIR

``pause`` first compiles a trial function: where no compiler works it writes
``no-compiler.txt`` with the reason and stops. Otherwise it runs the compiled trainer
uninterrupted (``uninterrupted.pt``) and to the pause step, pausing to
``compiled.ckpt`` (its state then: ``paused.pt``). ``resume``, in a new process, resumes
``compiled.ckpt`` and ``eager.ckpt`` (written by the test) in fresh compiled trainers and
runs each to the end (``resumed-<name>.pt``: the state right after the resume and at
the end). Deterministic algorithms are on: without them inductor's CPU kernels may
accumulate in another order from run to run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import trainer_resume
from support.wrapped_trainers import PAUSE_STEP, STEPS, WrappedTrainer

NO_COMPILER = "no-compiler.txt"


def _compiler_missing() -> str | None:
    """Why ``torch.compile`` cannot compile here, or ``None`` when a trial compile works."""
    try:
        torch.compile(lambda x: torch.relu(x) * 2)(torch.ones(3))
    except Exception as error:  # noqa: BLE001 - whatever the backend raised is the reason
        return f"torch.compile (inductor on CPU) fails here: {type(error).__name__}: {error}"
    return None


def pause(workdir: Path) -> None:
    reason = _compiler_missing()
    if reason is not None:
        (workdir / NO_COMPILER).write_text(reason)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=("pause", "resume"))
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    print(f"with {trainer_resume.__file__}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    (pause if args.job == "pause" else resume)(args.workdir)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
