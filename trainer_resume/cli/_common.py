"""What every ``trainer-resume`` subcommand shares: exit statuses, ``UsageError``, tables.

The dispatcher (``cli/__init__.py``) and the subcommands import from here; this module
imports nothing of the package, so no subcommand needs the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "format_bytes",
    "format_table",
    "read_key_file",
]

# Exit statuses, the same for every subcommand (documented in --help and docs/cli.md).
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INTERRUPTED = 130  # the shell's status for a process stopped by Ctrl-C (128 + SIGINT)


class UsageError(Exception):
    """A subcommand cannot run as asked (bad config key, unusable factory...): exit status 2."""


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
