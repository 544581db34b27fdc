"""``trainer-resume export``: its arguments and help."""

from __future__ import annotations

import argparse
import sys

from .._common import EXIT_STATUS_HELP, add_key_file_argument

NAME = "export"
HELP = "write a verified file's weights as a plain torch or safetensors file"
DESCRIPTION = """\
Verify a trainer-resume file and write its model weights (--what model, the
default: a flat mapping with exactly the keys of model.state_dict(), buffers
included) or its whole state (--what all) as a plain torch.save file or a
.safetensors file, durably (temp file, fsync, atomic rename). The result opens
with torch.load(weights_only=True), safetensors.torch.load_file, and, for a
Lightning file exported whole, LightningModule.load_from_checkpoint.

"The model" is the resume object named "model", or the one --object names, or
the only one that is a module state_dict; an error lists the names when that is
ambiguous. For a Lightning file it is the LightningModule's state_dict.
"""
EPILOG = (
    """\
examples:
  trainer-resume export runs/exp1/pause.ckpt model.safetensors
  trainer-resume export runs/exp1/pause.ckpt generator.pt --object generator
  trainer-resume export runs/exp1/pause.ckpt plain.ckpt --what all

"""
    + EXIT_STATUS_HELP
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="the trainer-resume file")
    parser.add_argument("out", metavar="OUT", help="the file to write (replaced atomically)")
    parser.add_argument(
        "--format",
        choices=("torch", "safetensors"),
        help="torch (a torch.save file) or safetensors (needs the safetensors package; "
        "--what model only); default: safetensors when OUT ends in .safetensors, else torch",
    )
    parser.add_argument(
        "--what",
        choices=("model", "all"),
        default="model",
        help="model: the model's state_dict (default); all: the whole state (for a Lightning "
        "file, a plain Lightning checkpoint)",
    )
    parser.add_argument("--object", metavar="NAME", help="the resume object that is the model")
    add_key_file_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..export import run_export

    return run_export(
        args.path,
        args.out,
        format=args.format,
        what=args.what,
        object=args.object,
        key_file=args.key_file,
        out=sys.stdout,
    )
