"""One phase of ``trainer-resume demo``, run in its own process by the demo.

Protocol: one line per event on stdout (``step N`` after each completed step,
``paused N`` when the pause file was written, ``done N`` at the end); anything
else the process prints goes to stderr. The result (per-step losses and the
trainer's final snapshot: model, optimizer, schedule, scaler, loader position,
counters and the next RNG draws) is written with ``save_checkpoint`` to ``--result``.

Modes:
    reference     train from scratch to ``--steps``.
    pause         the same, with SIGTERM turned into a pause at the next step
                  boundary (``pause_on_signal``); the process ends once it is written.
    resume        a fresh trainer resumes the pause file and trains to ``--steps``.
    weights-only  a fresh trainer loads only the model weights from the pause file
                  (new optimizer, schedule, scaler and RNG; loader from the start)
                  and trains the remaining steps: the common "load the weights" resume.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import OmegaConf

from ...durable import save_checkpoint
from ...example import run_training

__all__ = ["main"]

MODES = ("reference", "pause", "resume", "weights-only")

_protocol = sys.stdout  # main() sends everything else to stderr


def _report(line: str) -> None:
    print(line, file=_protocol, flush=True)


def run(mode: str, config_path: str, pause_file: str, result_path: str, steps: int) -> None:
    result = run_training(
        OmegaConf.load(config_path),
        steps=steps,
        pause_path=pause_file if mode == "pause" else None,
        handle_signals=mode == "pause",
        resume_path=pause_file if mode == "resume" else None,
        weights_only_path=pause_file if mode == "weights-only" else None,
        on_step=lambda step, loss: _report(f"step {step}"),
    )
    if result.paused:
        _report(f"paused {result.completed_steps}")
    save_checkpoint(result.as_state(), result_path)
    _report(f"done {result.completed_steps}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_resume.cli.demo.worker")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--pause-file", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)
    global _protocol
    _protocol, sys.stdout = sys.stdout, sys.stderr
    run(args.mode, args.config, args.pause_file, args.result, args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
