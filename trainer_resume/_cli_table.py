"""Plain-text tables for the ``trainer-resume`` command's reports."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "format_bytes"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, indent: str = "  ") -> str:
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
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{count:,} B ({value:.1f} {unit})"
