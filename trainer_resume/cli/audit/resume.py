"""Resume exactness: a fresh loader that loads a state taken mid-run reads on as the run did.

For a loader with ``state_dict()`` / ``load_state_dict()``, per worker setting: a
reference run of two passes (each to its end, or ``--batches`` long) records every
batch's digest and the state after a few batches: the first, the middle of the
first pass, and the first pass's last when it ended there. For each, a fresh loader
from the factory loads that state and reads on with the same passes (the rest of the
first, then the second); its batches must have the reference's digests, one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from .._common import format_table
from .runs import EpochRun, Target, delivered, is_endless
from .tagging import value_digest

__all__ = ["ResumeCheck", "check_resumes", "print_resumes", "resumable_reason"]

PASSES = 2


@dataclass
class ResumeCheck:
    """One interrupt point of one worker setting, and what the resumed loader did."""

    workers: int
    after: int  # batches delivered before the state was taken
    at_pass_end: bool
    compared: int = 0
    difference: str | None = None  # None: every batch the same

    @property
    def ok(self) -> bool:
        return self.difference is None


def resumable_reason(target: Target) -> str | None:
    """Why the target's resumes cannot be checked, or None."""
    if target.refusal is not None:
        return f"ResumableDataLoader refuses the dataset: {target.refusal}"
    loader = target.loader
    if not (
        callable(getattr(loader, "state_dict", None))
        and callable(getattr(loader, "load_state_dict", None))
    ):
        return f"the {type(loader).__name__} has no state_dict() / load_state_dict()"
    if getattr(loader, "resumable", True) is False:
        return f"the {type(loader).__name__} was built with resumable=False"
    return None


def _read(loader: Any, limits: list[int | None], taken: set[int] | None = None):
    """Read one pass per limit (a new ``iter()`` each): digests per pass, states by count."""
    passes: list[list[str]] = []
    ended: list[bool] = []
    states: dict[int, Any] = {}
    total = 0
    for limit in limits:
        digests: list[str] = []
        iterator = iter(loader)
        finished = False
        while limit is None or len(digests) < limit:
            try:
                batch = next(iterator)
            except StopIteration:
                finished = True
                break
            digests.append(value_digest(delivered(batch).batch))
            total += 1
            if taken is not None and total in taken:
                states[total] = loader.state_dict()
        del iterator
        passes.append(digests)
        ended.append(finished)
    return passes, ended, states


def check_resumes(
    build: Callable[[], Target],
    workers: int,
    first_pass: EpochRun,
    *,
    batches: int | None,
) -> list[ResumeCheck]:
    """Run the reference and each resume for one worker setting (fresh targets from
    ``build``); ``first_pass`` is that setting's first pass in the audit's own run."""
    length = first_pass.batches
    if length == 0:
        return []
    points = sorted({1, max(1, length // 2), length})
    if not first_pass.ended:
        points = [point for point in points if point < length] or [1]
    target = build()
    # Passes as the audit's run cut them: an endless loader's at the audit's window.
    limit = length if is_endless(target.loader) else batches
    try:
        reference, _, states = _read(target.loader, [limit, limit], set(points))
    finally:
        _close(target.loader)
    expected = [digest for digests in reference for digest in digests]
    checks = []
    for point in points:
        at_end = first_pass.ended and point == length
        check = ResumeCheck(workers, point, at_pass_end=at_end)
        checks.append(check)
        if point not in states:
            check.difference = "the reference run delivered fewer batches than the audit's run"
            continue
        resumed = build()
        try:
            resumed.loader.load_state_dict(states[point])
            rest = len(reference[0]) - point
            # The rest of the first pass (to its end when passes are not cut), then the second.
            limits: list[int | None] = [None if first_pass.ended else rest] if rest else []
            got, _, _ = _read(resumed.loader, [*limits, limit])
        except Exception as error:  # a loader that fails to resume is a finding
            check.difference = f"raised {type(error).__name__}: {error}"
            continue
        finally:
            _close(resumed.loader)
        flat = [digest for digests in got for digest in digests]
        wanted = expected[point:]
        check.compared = min(len(flat), len(wanted))
        for number, (a, b) in enumerate(zip(wanted, flat)):
            if a != b:
                check.difference = f"batch {point + number + 1} differs"
                break
        else:
            if len(flat) != len(wanted):
                check.difference = f"{len(flat)} batches instead of {len(wanted)}"
    return checks


def print_resumes(checks: list[ResumeCheck], out: TextIO) -> int:
    """Print the resume checks; returns the problems."""
    print(
        "\nresume: a fresh loader from the factory loads the state taken after a batch and "
        f"reads on\n  ({PASSES} passes); its batches against the uninterrupted run's, one by one",
        file=out,
    )
    rows = [
        (
            check.workers,
            f"{check.after}{' (end of pass 1)' if check.at_pass_end else ''}",
            check.compared,
            "same" if check.ok else f"DIFFER: {check.difference}",
        )
        for check in checks
    ]
    print(
        format_table(("num_workers", "after batch", "batches compared", "result"), rows), file=out
    )
    return sum(not check.ok for check in checks)


def _close(loader: object) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
