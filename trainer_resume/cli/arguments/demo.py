"""``trainer-resume demo``: its arguments and help."""

from __future__ import annotations

import argparse
import sys

from .._common import EXIT_STATUS_HELP, positive_int

NAME = "demo"
HELP = "show an exact resume against the usual weights-only resume"
DESCRIPTION = """\
Train the bundled example model (a small CNN with Dropout and BatchNorm, AdamW,
a per-step LR schedule, bfloat16 autocast with a GradScaler on CPU, and a
ResumableDataLoader with 2 workers and random augmentation), each run in its own
subprocess:
  1. reference: uninterrupted, to the last step;
  2. paused: the same training receives a real SIGTERM from this process after
     step K; it writes its pause file at the step boundary and exits 0;
  3. exact resume: a fresh subprocess resumes the pause file and finishes;
  4. weights-only resume: a fresh subprocess loads only the model weights from
     the pause file, with a new optimizer, scheduler and a restarted loader.
Then it prints how each resume compares with the reference: parameters,
optimizer state, per-step losses and later RNG draws (bit-identical yes/no and
the max abs difference) for the exact resume; final weights and the loss
divergence after K for the weights-only resume.
"""
EPILOG = (
    """\
examples:
  trainer-resume demo
  trainer-resume demo train.steps=60 optimizer.lr=0.01 --pause-after 20
  trainer-resume demo --config my.yaml --workdir runs/demo

Overrides use OmegaConf's dot-list form (key.path=value); a key that the config
does not have is an error naming the key.

"""
    + EXIT_STATUS_HELP
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="YAML config of the example trainer (default: the bundled configs/demo.yaml)",
    )
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="directory for the pause file and the runs' results, kept afterwards "
        "(default: a temporary directory, removed at the end)",
    )
    parser.add_argument(
        "--pause-after",
        metavar="K",
        type=positive_int,
        help="send SIGTERM after step K (default: 40%% of the steps); the pause file is "
        "written at the next step boundary",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDES",
        help="config overrides in OmegaConf dot-list form, e.g. train.steps=60 optimizer.lr=0.01",
    )


def take_unparsed(args: argparse.Namespace, rest: list[str]) -> list[str]:
    """Move the overrides argparse left over into ``args.overrides``; return the others.

    Overrides may come before, between or after the options; argparse alone takes
    positional arguments only in one run.
    """
    overrides = [item for item in rest if "=" in item and not item.startswith("-")]
    args.overrides += overrides
    return [item for item in rest if item not in overrides]


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(
        config_path=args.config,
        workdir=args.workdir,
        overrides=args.overrides,
        pause_after=args.pause_after,
        progress=not args.no_progress,
        out=sys.stdout,
    )
