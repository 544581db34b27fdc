"""What the audit concludes for an ``IterableDataset``, whose items are identified by content.

An iterable dataset's items have no index: each is identified by one digest of its
whole content (every field), taken where it was read, before collation. Per pass,
every worker setting is checked against ``num_workers=0``: the same number of items,
and the same items, each delivered exactly once across the workers whatever their
order (``DataLoader`` interleaves the workers' items, so the order differs by
design). Where the items draw from the global generators their contents depend on
the process that read them, so only the counts are compared, and the report says so.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from .._common import format_table
from .runs import EpochRun

__all__ = ["check_stream_passes", "compare_stream_workers", "item_identities"]

_SHOWN = 3  # items named per finding


def _identity(digests: dict[str, str]) -> str:
    hasher = hashlib.sha256()
    for path, digest in sorted(digests.items()):
        hasher.update(path.encode() + b"=" + digest.encode())
    return hasher.hexdigest()[:16]


def item_identities(run: EpochRun) -> list[str]:
    """One content digest per item of the pass, in delivery order."""
    return [_identity(digests) for digests in run.samples]


def _pass_difference(reference: EpochRun, other: EpochRun) -> tuple[int, int]:
    """Items the other pass delivers more often, and less often, than the reference."""
    expected, found = Counter(item_identities(reference)), Counter(item_identities(other))
    return sum((found - expected).values()), sum((expected - found).values())


def compare_stream_workers(
    runs: dict[int, list[EpochRun]], *, by_content: bool, drawn: Sequence[str], out: TextIO
) -> int:
    """Print each worker setting against ``num_workers=0``, pass by pass; returns the problems."""
    reference = runs[0]
    basis = (
        "items are identified by their content"
        if by_content
        else f"the items draw from the global generator(s) {', '.join(drawn)}, so their "
        "contents depend on the process that read them: counts only"
    )
    print(f"\nworkers: each setting against num_workers=0 (same seed); {basis}", file=out)
    rows, problems = [], 0
    for workers, other in runs.items():
        if workers == 0:
            continue
        findings = []
        for number, (left, right) in enumerate(zip(reference, other), start=1):
            if by_content:
                extra, missing = _pass_difference(left, right)
                if extra or missing:
                    findings.append(f"pass {number}: {extra} extra, {missing} missing")
            elif len(left.samples) != len(right.samples):
                findings.append(f"pass {number}: {len(right.samples)} vs {len(left.samples)}")
        problems += bool(findings)
        rows.append(
            (
                workers,
                ", ".join(str(len(run.samples)) for run in other),
                "DIFFER at " + "; ".join(findings[:_SHOWN]) if findings else "exactly once",
            )
        )
    if rows:
        print(format_table(("num_workers", "items per pass", "items"), rows), file=out)
        if problems and by_content:
            print(
                "  extra: delivered more often than with num_workers=0 (a worker that does not "
                "shard the stream\n  by get_worker_info() repeats it); missing: never delivered",
                file=out,
            )
    else:
        print("  only num_workers=0 was run; nothing to compare", file=out)
    return problems


def check_stream_passes(runs: dict[int, list[EpochRun]], *, by_content: bool, out: TextIO) -> None:
    """Print the items and batches of each pass, and whether the passes repeat one order."""
    print("\npasses: items and batches per pass", file=out)
    rows = [
        (workers, number, len(run.samples), run.batches, "yes" if run.ended else "no (--batches)")
        for workers, epoch_runs in runs.items()
        for number, run in enumerate(epoch_runs, start=1)
    ]
    print(format_table(("num_workers", "pass", "items", "batches", "complete"), rows), file=out)
    reference = [item_identities(run) for run in runs[0]]
    if len(reference) > 1 and not by_content:
        print("  order: not compared (the items' contents change with the generators)", file=out)
    elif len(reference) > 1:
        same = all(items == reference[0] for items in reference[1:])
        print(
            "  order: " + ("the same in every pass" if same else "differs between passes"),
            file=out,
        )
