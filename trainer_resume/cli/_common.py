"""What every ``trainer-resume`` subcommand shares: exit statuses and their help,
``UsageError``, argument types, the ``--key-file`` option, tables.

The dispatcher (``cli/__init__.py``), the argument declarations (``cli/arguments/``)
and the subcommands import from here; this module imports nothing of the package, so
no subcommand needs the dispatcher and ``--help`` stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STATUS_HELP",
    "EXIT_USAGE",
    "UsageError",
    "add_key_file_argument",
    "format_bytes",
    "format_table",
    "positive_int",
    "read_key_file",
    "type_phrase",
]

# Exit statuses, the same for every subcommand (documented in --help and docs/cli.md).
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INTERRUPTED = 130  # the shell's status for a process stopped by Ctrl-C (128 + SIGINT)

EXIT_STATUS_HELP = """\
exit status:
  0  success (demo: the exact resume is bit-identical; audit-loader: every check passed;
     inspect: the file was described, plain torch.save and Lightning files included)
  1  a check failed (demo: the exact resume differs; audit-loader: a problem was found)
  2  usage error (bad option, unknown config key, factory not found; export: no single
     model or an unknown object name, safetensors not installed, an OUT that is PATH
     or another trainer-resume file)
  3  error (unreadable, corrupted, truncated, foreign or wrongly signed file;
     a training subprocess failed); printed as "error [code]: message", or
     "error: no such file: PATH" (or the system's error) for a file it cannot open
"""


class UsageError(Exception):
    """A subcommand cannot run as asked (bad config key, unusable factory...): exit status 2."""


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_key_file_argument(parser: argparse.ArgumentParser) -> None:
    """``--key-file F``: the signing key of the files a subcommand reads (see ``read_key_file``)."""
    parser.add_argument(
        "--key-file",
        metavar="F",
        help="file whose bytes (all of them, exactly) are the signing key; "
        "the signature is then required and verified",
    )


def read_key_file(path: str) -> bytes:
    """The signing key held by the file ``path``: all of its bytes, exactly.

    Raises:
        UsageError: the file is empty.
        OSError: it cannot be read.
    """
    with open(path, "rb") as handle:
        key = handle.read()
    if not key:
        raise UsageError(f"the key file {path} is empty")
    return key


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], *, indent: str = "  "
) -> str:
    """Left-aligned columns separated by two spaces; the header is underlined."""
    cells = [[str(cell) for cell in header]] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(header))]
    lines = []
    for number, row in enumerate(cells):
        line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        lines.append(indent + line)
        if number == 0:
            lines.append(indent + "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_bytes(count: int) -> str:
    """``1234567`` -> ``"1,234,567 B (1.2 MiB)"``; small sizes stay in bytes only."""
    if count < 1024:
        return f"{count:,} B"
    value, unit = float(count), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        value, unit = value / 1024, larger
        if value < 1024:
            break
    return f"{count:,} B ({value:.1f} {unit})"


def type_phrase(value: object) -> str:
    """``value``'s type with its article, for messages: ``"an int"``, ``"a str"``."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
