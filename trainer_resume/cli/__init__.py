"""The ``trainer-resume`` command: ``demo``, ``inspect``, ``export`` and ``audit-loader``.

This module only registers the subcommands and dispatches. Each subcommand declares
its arguments and help in its module of ``arguments/``, which imports the
subcommand's own modules (``demo``, ``inspect``, ``export``, ``audit``) only when it
runs, so ``--help`` stays fast. What they share is in ``_common``.
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
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    UsageError,
)
from .arguments import COMMANDS

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "main",
]

_DESCRIPTION = """\
Pause a PyTorch training job at any completed step and resume it bit-identically
in a new process. Run "trainer-resume COMMAND --help" for a command's options.
"""


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``trainer-resume`` command."""
    from .. import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="trainer-resume",
        description=_DESCRIPTION,
        epilog=EXIT_STATUS_HELP,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        subparser = commands.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.DESCRIPTION,
            epilog=command.EPILOG,
            formatter_class=formatter,
        )
        command.add_arguments(subparser)
        subparser.set_defaults(
            run=command.run, take_unparsed=getattr(command, "take_unparsed", None)
        )
    return parser


def _error(text: str) -> None:
    print(f"error: {text}", file=sys.stderr)


def _resume_error(error: Exception) -> None:
    detail = getattr(error, "detail", None)
    text = f"error [{error.code}]: {error.message}"  # type: ignore[attr-defined]
    print(f"{text}: {detail}" if detail else text, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see ``trainer-resume --help``)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.take_unparsed is not None:
        rest = args.take_unparsed(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from ..errors import ResumeError

    try:
        return args.run(args)
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
