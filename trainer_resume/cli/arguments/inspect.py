"""``trainer-resume inspect``: its arguments and help."""

from __future__ import annotations

import argparse
import sys

from .._common import EXIT_STATUS_HELP, add_key_file_argument

NAME = "inspect"
HELP = "describe a checkpoint file (ours verified; plain torch and Lightning files too)"
DESCRIPTION = """\
Describe a checkpoint file. trainer-resume's files (pause files of the mixin, one
process or several; Lightning pause files and checkpoints written by
DurableCheckpointIO; finished markers; save_checkpoint files) are verified first
(format marker, length and digest, and the signature when --key-file is given),
before anything is unpickled. Plain torch.save files (Lightning's own
checkpoints, state dicts) are described too, marked "not verified: no
trainer-resume header". Everything is loaded weights-only: no code in the file runs.

Shown: the kind of file, integrity, the step counters it holds (completed_steps,
Lightning's global_step, a plain file's global_step/step/epoch), the epoch, the
number of processes, the config signature, each saved object with its tensor
count and bytes, each loader's position (consumed samples; cycle and offset, in
samples for a sampler and in batches for a batch sampler; delivered batches;
ranks), the saved RNG and the extra-state keys; other files entry by entry (a
.safetensors file from its header). A resume-point directory is described by its
points, pause files and finished marker, and its newest valid file in full.
--json prints the same content as JSON.
"""
EPILOG = EXIT_STATUS_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the file")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_key_file_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..inspect import run_inspect

    return run_inspect(args.path, as_json=args.json, key_file=args.key_file, out=sys.stdout)
