"""Child process of the DALI resume tests: reference runs and SIGTERM pauses, or resumes.

``python -m support.dali_child pause WORKDIR`` runs each case uninterrupted, then once per
pause point with a SIGTERM at that step (a pause file each); ``python -m support.dali_child
resume WORKDIR`` resumes every pause file in this new process and finishes the run.
Both save what they saw to ``WORKDIR/<mode>.pt``.
"""

from __future__ import annotations

import os
import random
import sys

import torch

from support import dali_runs

# (kind, last_batch_policy, steps after which a SIGTERM pauses). Epochs of 6 batches
# (PARTIAL, FILL; FILL's third has 5), 5 (DROP) and 3 (external source).
CASES = [
    ("file", "PARTIAL", [2, 6, 9, 12]),
    ("file", "FILL", [6, 8]),
    ("file", "DROP", [5, 7]),
    ("external", "FILL", [2, 3, 5]),
    ("shuffle_after_epoch", "PARTIAL", [6, 8, 14]),
]


def _finished(trainer: dali_runs.DALITrainer, seen: list[dict]) -> dict:
    return {
        "seen": seen,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
    }


def pause(workdir: str) -> dict:
    root = dali_runs.write_images(os.path.join(workdir, "images"))
    results = {}
    for kind, policy, points in CASES:
        trainer = dali_runs.DALITrainer(dali_runs.make_iterator(kind, root, policy))
        results[(kind, policy, None)] = _finished(trainer, dali_runs.train(trainer))
        for step in points:
            path = os.path.join(workdir, f"{kind}-{policy}-{step}.ckpt")
            trainer = dali_runs.DALITrainer(
                dali_runs.make_iterator(kind, root, policy), signal_at=step
            )
            with trainer.pause_on_signal(path, warn_without_step_after=None):
                seen = dali_runs.train(trainer)
            assert trainer.paused and trainer.completed_steps == step, (kind, policy, step)
            results[(kind, policy, step)] = {"seen": seen, "path": path}
    return results


def resume(workdir: str) -> dict:
    root = os.path.join(workdir, "images")
    results = {}
    for kind, policy, points in CASES:
        for step in points:
            torch.manual_seed(1234)  # unlike the paused run: resume() must restore every generator
            random.seed(1234)
            trainer = dali_runs.DALITrainer(dali_runs.make_iterator(kind, root, policy))
            trainer.resume(os.path.join(workdir, f"{kind}-{policy}-{step}.ckpt"))
            epoch = trainer.loader.epoch  # the epoch the first pass after the resume reads
            results[(kind, policy, step)] = _finished(trainer, dali_runs.train(trainer))
            results[(kind, policy, step)]["epoch_at_resume"] = epoch
    return results


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    outcome = pause(directory) if mode == "pause" else resume(directory)
    torch.save(outcome, os.path.join(directory, f"{mode}.pt"))
    print("DONE", flush=True)
