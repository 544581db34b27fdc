"""The ``trainer-resume`` command: ``demo``, ``inspect``, ``export`` and ``audit-loader``.

This module only builds the parser and dispatches; each subcommand lives in its
own module of this package (``inspect``, ``export``, ``audit``, ``demo``), imported when it runs
so ``--help`` stays fast. What they share is in ``_common``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "main",
]

_EXIT_TEXT = """\
exit status:
  0  success (demo: the exact resume is bit-identical; audit-loader: every check passed;
     inspect: the file was described, plain torch.save and Lightning files included)
  1  a check failed (demo: the exact resume differs; audit-loader: a problem was found)
  2  usage error (bad option, unknown config key, factory not found; export: no single
     model or an unknown object name, safetensors not installed)
  3  error (unreadable, corrupted, truncated, foreign or wrongly signed file;
     a training subprocess failed); printed as "error [code]: message"
"""

_DESCRIPTION = """\
Pause a PyTorch training job at any completed step and resume it bit-identically
in a new process. Run "trainer-resume COMMAND --help" for a command's options.
"""

_DEMO_DESCRIPTION = """\
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

_DEMO_EPILOG = (
    """\
examples:
  trainer-resume demo
  trainer-resume demo train.steps=60 optimizer.lr=0.01 --pause-after 20
  trainer-resume demo --config my.yaml --workdir runs/demo

Overrides use OmegaConf's dot-list form (key.path=value); a key that the config
does not have is an error naming the key.

"""
    + _EXIT_TEXT
)

_INSPECT_DESCRIPTION = """\
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

_EXPORT_DESCRIPTION = """\
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

_EXPORT_EPILOG = (
    """\
examples:
  trainer-resume export runs/exp1/pause.ckpt model.safetensors
  trainer-resume export runs/exp1/pause.ckpt generator.pt --object generator
  trainer-resume export runs/exp1/pause.ckpt plain.ckpt --what all

"""
    + _EXIT_TEXT
)

_AUDIT_DESCRIPTION = """\
Automate the usual loader checks. MODULE:FACTORY names a callable (MODULE is
imported with the current directory first on sys.path). It is called as
FACTORY(num_workers=W) when it has a num_workers parameter, else as FACTORY().
It returns either
  - a map-style dataset (__getitem__ and __len__): the audit loads it with
    torch's DataLoader(batch_size=--batch-size, shuffle=False, num_workers=W)
    and no collation, so samples are compared exactly as dataset[i] returns them; or
  - a torch DataLoader (a ResumableDataLoader too) over a map-style dataset; the
    factory must then take num_workers and build the loader with it.
A sample may be anything: a tensor, a tuple such as (image, label), a dict,
nested containers. It is identified by its dataset index (the audit tags each
dataset[i] on its way through the loader; the loader's collate_fn still gets the
bare samples), and compared whole, field by field.

Checks:
  contract    dataset[i] before collation: every field ([0] of a tuple, image of
              a dict, nested containers too) has one type, dtype and shape; each
              differing or failing sample is named by its index; and which
              global generators (torch, random, numpy) dataset[i] draws from
  workers     each worker count against num_workers=0, from the same seed: the
              same indices in the same order, the same samples (the first
              differing field is named), the same collated batches; the known
              causes of a difference are explained
  epochs      duplicate indices and indices never delivered (gaps) in each epoch
              (an endless loader is cut into windows of len(dataset) samples)
  throughput  samples/s of every epoch of every setting, and the median; the
              first batch of each epoch (worker start-up) is excluded and shown
"""

_AUDIT_EPILOG = (
    """\
examples:
  trainer-resume audit-loader mypackage.data:make_dataset
  trainer-resume audit-loader mypackage.data:make_loader --workers 0,2,4 --epochs 3 --batches 50

"""
    + _EXIT_TEXT
)


def _worker_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected non-negative worker counts, got {text!r}")
    return list(dict.fromkeys(values))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``trainer-resume`` command."""
    from .. import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="trainer-resume",
        description=_DESCRIPTION,
        epilog=_EXIT_TEXT,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="show an exact resume against the usual weights-only resume",
        description=_DEMO_DESCRIPTION,
        epilog=_DEMO_EPILOG,
        formatter_class=formatter,
    )
    demo.add_argument(
        "--config",
        metavar="PATH",
        help="YAML config of the example trainer (default: the bundled configs/demo.yaml)",
    )
    demo.add_argument(
        "--workdir",
        metavar="DIR",
        help="directory for the pause file and the runs' results, kept afterwards "
        "(default: a temporary directory, removed at the end)",
    )
    demo.add_argument(
        "--pause-after",
        metavar="K",
        type=_positive,
        help="send SIGTERM after step K (default: 40%% of the steps); the pause file is "
        "written at the next step boundary",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDES",
        help="config overrides in OmegaConf dot-list form, e.g. train.steps=60 optimizer.lr=0.01",
    )

    inspect = commands.add_parser(
        "inspect",
        help="describe a checkpoint file (ours verified; plain torch and Lightning files too)",
        description=_INSPECT_DESCRIPTION,
        epilog=_EXIT_TEXT,
        formatter_class=formatter,
    )
    inspect.add_argument("path", metavar="PATH", help="the file")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.add_argument(
        "--key-file",
        metavar="F",
        help="file whose bytes (all of them, exactly) are the signing key; "
        "the signature is then required and verified",
    )

    export = commands.add_parser(
        "export",
        help="write a verified file's weights as a plain torch or safetensors file",
        description=_EXPORT_DESCRIPTION,
        epilog=_EXPORT_EPILOG,
        formatter_class=formatter,
    )
    export.add_argument("path", metavar="PATH", help="the trainer-resume file")
    export.add_argument("out", metavar="OUT", help="the file to write (replaced atomically)")
    export.add_argument(
        "--format",
        choices=("torch", "safetensors"),
        help="torch (a torch.save file) or safetensors (needs the safetensors package; "
        "--what model only); default: safetensors when OUT ends in .safetensors, else torch",
    )
    export.add_argument(
        "--what",
        choices=("model", "all"),
        default="model",
        help="model: the model's state_dict (default); all: the whole state (for a Lightning "
        "file, a plain Lightning checkpoint)",
    )
    export.add_argument("--object", metavar="NAME", help="the resume object that is the model")
    export.add_argument(
        "--key-file",
        metavar="F",
        help="file whose bytes (all of them, exactly) are the signing key; "
        "the signature is then required and verified",
    )

    audit = commands.add_parser(
        "audit-loader",
        help="check a dataset or loader: sample contract, workers, epochs, speed",
        description=_AUDIT_DESCRIPTION,
        epilog=_AUDIT_EPILOG,
        formatter_class=formatter,
    )
    audit.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="the factory to audit, e.g. mypackage.data:make_dataset",
    )
    audit.add_argument(
        "--workers",
        type=_worker_list,
        default=[0, 2],
        metavar="0,2,4",
        help="comma-separated worker counts to run and compare; 0 is always included (default: 0,2)",
    )
    audit.add_argument(
        "--epochs", type=_positive, default=2, metavar="E", help="epochs per setting (default: 2)"
    )
    audit.add_argument(
        "--batches",
        type=_positive,
        metavar="N",
        help="at most N batches per epoch; the contract check then reads the first "
        "N x batch size samples (default: whole epochs and every sample)",
    )
    audit.add_argument(
        "--batch-size",
        type=_positive,
        default=8,
        metavar="B",
        help="batch size when the factory returns a dataset (default: 8)",
    )
    audit.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of Python, NumPy and torch before each setting (default: 0)",
    )
    return parser


def _error(text: str) -> None:
    print(f"error: {text}", file=sys.stderr)


def _resume_error(error: Exception) -> None:
    detail = getattr(error, "detail", None)
    text = f"error [{error.code}]: {error.message}"  # type: ignore[attr-defined]
    print(f"{text}: {detail}" if detail else text, file=sys.stderr)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(
            config_path=args.config,
            workdir=args.workdir,
            overrides=args.overrides,
            pause_after=args.pause_after,
            progress=not args.no_progress,
            out=sys.stdout,
        )
    if args.command == "inspect":
        from .inspect import run_inspect

        return run_inspect(args.path, as_json=args.json, key_file=args.key_file, out=sys.stdout)
    if args.command == "export":
        from .export import run_export

        return run_export(
            args.path,
            args.out,
            format=args.format,
            what=args.what,
            object=args.object,
            key_file=args.key_file,
            out=sys.stdout,
        )
    from .audit import run_audit

    return run_audit(
        args.target,
        workers=args.workers,
        epochs=args.epochs,
        batches=args.batches,
        batch_size=args.batch_size,
        seed=args.seed,
        out=sys.stdout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see ``trainer-resume --help``)."""
    parser = build_parser()
    # Overrides may come before, between or after the demo's options; argparse alone
    # takes positional arguments only in one run, so the remaining ones are added here.
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        args.overrides += [item for item in rest if "=" in item and not item.startswith("-")]
        rest = [item for item in rest if not ("=" in item and not item.startswith("-"))]
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from ..errors import ResumeError

    try:
        return _dispatch(args)
    except ResumeError as error:
        _resume_error(error)
        return EXIT_ERROR
    except UsageError as error:
        _error(str(error))
        return EXIT_USAGE
    except FileNotFoundError as error:
        _error(f"no such file: {error.filename or error}")
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, without a second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except OSError as error:
        _error(f"{error.strerror or error}: {error.filename}" if error.filename else str(error))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
