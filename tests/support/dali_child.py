"""DALI trainer runs in a process of their own: ``python -m support.dali_child MODE WORKDIR``.

Modes:
    pause   each case uninterrupted, then once per pause point with a SIGTERM (or,
            in ``AT_EPOCH_END``, a ``request_pause``) during that step: a pause file each.
    resume  every pause file resumed in this new process, each run finished.

Both save what they saw to ``WORKDIR/<mode>.pt`` (see ``support.dali_runs.finished``).
"""

from __future__ import annotations

import os
import random
import sys

import torch

from support import dali_runs

# (kind, last_batch_policy, steps during which a SIGTERM asks for a pause). Epochs of 6
# batches (PARTIAL, FILL; FILL's second has 5), 5 (DROP) and 3 (external source). A
# pause lands when the step ends, or, at an epoch's last batch, when the next epoch's
# first step ends: after the loop's epoch-end work.
CASES = [
    ("file", "PARTIAL", [2, 6, 9, 12]),
    ("file", "FILL", [6, 8]),
    ("file", "DROP", [5, 7]),
    ("external", "FILL", [2, 3, 5]),
    ("shuffle_after_epoch", "PARTIAL", [6, 8, 12, 14]),
]
# (kind, last_batch_policy, steps during which request_pause() asks for a pause) in a
# loop that calls pause_if_requested() after its epoch-end work: a request at an
# epoch's last batch lands there.
AT_EPOCH_END = [
    ("file", "PARTIAL", [6]),
    ("external", "FILL", [3]),
]
LOOPS = {"step": CASES, "epoch_end": AT_EPOCH_END}


def pause_file(workdir: str, loop: str, kind: str, policy: str, step: int) -> str:
    return os.path.join(workdir, f"{loop}-{kind}-{policy}-{step}.ckpt")


def pause(workdir: str) -> dict:
    root = dali_runs.write_images(os.path.join(workdir, "images"))
    results = {}
    for kind, policy in dict.fromkeys((k, p) for cases in LOOPS.values() for k, p, _ in cases):
        trainer = dali_runs.DALITrainer(dali_runs.make_iterator(kind, root, policy))
        results[(kind, policy)] = dali_runs.finished(trainer, *dali_runs.train(trainer))
    for loop, cases in LOOPS.items():
        for kind, policy, points in cases:
            for step in points:
                path = pause_file(workdir, loop, kind, policy, step)
                trainer = dali_runs.DALITrainer(
                    dali_runs.make_iterator(kind, root, policy),
                    pause_at=step,
                    pause_request=path if loop == "epoch_end" else None,
                )
                with trainer.pause_on_signal(path, warn_without_step_after=None):
                    seen, ends = dali_runs.train(
                        trainer, pause_after_epoch_work=loop == "epoch_end"
                    )
                assert trainer.paused, (loop, kind, policy, step)
                results[(loop, kind, policy, step)] = {
                    "seen": seen,
                    "ends": ends,
                    "completed_steps": trainer.completed_steps,
                    "path": path,
                }
    return results


def resume(workdir: str) -> dict:
    root = os.path.join(workdir, "images")
    results = {}
    for loop, cases in LOOPS.items():
        for kind, policy, points in cases:
            for step in points:
                torch.manual_seed(1234)  # unlike the paused run: resume() restores every generator
                random.seed(1234)
                trainer = dali_runs.DALITrainer(dali_runs.make_iterator(kind, root, policy))
                trainer.resume(pause_file(workdir, loop, kind, policy, step))
                epoch = trainer.loader.epoch  # the epoch the first pass after the resume reads
                result = dali_runs.finished(trainer, *dali_runs.train(trainer))
                results[(loop, kind, policy, step)] = dict(result, epoch_at_resume=epoch)
    return results


if __name__ == "__main__":
    mode, directory = sys.argv[1], sys.argv[2]
    outcome = pause(directory) if mode == "pause" else resume(directory)
    torch.save(outcome, os.path.join(directory, f"{mode}.pt"))
    print("DONE", flush=True)
