"""Small helpers shared by the benchmark scripts: timing, tables, JSON output."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"


def busy_wait_cpu(microseconds: float) -> None:
    """Spin until this thread has used ``microseconds`` of CPU time.

    CPU time, not wall time: a descheduled process does not count as working, so the
    cost stays the same per sample however many processes share the cores.
    """
    if microseconds <= 0:
        return
    end = time.thread_time_ns() + int(microseconds * 1000)
    while time.thread_time_ns() < end:
        pass


def reset_peak_rss() -> bool:
    """Make ``ru_maxrss`` restart from the current RSS (Linux); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's peak RSS (since the last ``reset_peak_rss``) in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def environment() -> dict[str, Any]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain-text table with right-aligned columns."""
    cells = [[str(header) for header in headers]] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    print(title)
    for number, row in enumerate(cells):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
        if number == 0:
            print("  ".join("-" * width for width in widths))
    print()


def max_weight_difference(expected: Path, got: Path) -> float:
    """Largest absolute difference between two saved state dicts (0.0: bit-identical)."""
    import torch

    from trainer_resume.difference import max_abs_difference

    return max_abs_difference(
        torch.load(expected, weights_only=True), torch.load(got, weights_only=True)
    )


def framework_resume_result(
    label: str,
    pause_s: list[float],
    resume_s: list[float],
    first_differing_step: int | None,
    max_weight_difference: float,
) -> dict[str, Any]:
    """One method's entry in a framework resume comparison (see :func:`report_framework_resume`)."""
    return {
        "label": label,
        "pause_s": pause_s,
        "median_pause_s": statistics.median(pause_s),
        "resume_s": resume_s,
        "median_resume_s": statistics.median(resume_s),
        "first_differing_step": first_differing_step,
        "max_weight_difference": max_weight_difference,
        "identical": first_differing_step is None and max_weight_difference == 0.0,
    }


def report_framework_resume(
    name: str, title: str, step: str, methods: dict[str, Any], **summary: Any
) -> Path:
    """Print and write a framework's own resume beside the adapter's (benchmarks/_report.py's
    ``FrameworkResume`` layout: ``summary`` holds ``parameters``, ``steps``,
    ``interrupted_after``, ``repeats``).

    Args:
        step: What the steps count, in the table's header ("step", "micro-step").
    """
    print_table(
        title,
        [
            "method",
            "pause s",
            "resume s (to first batch)",
            f"first differing {step}",
            "max weight difference",
            "bit-identical",
        ],
        [
            [
                result["label"],
                f"{result['median_pause_s']:.3f}",
                f"{result['median_resume_s']:.3f}",
                "none"
                if result["first_differing_step"] is None
                else result["first_differing_step"],
                f"{result['max_weight_difference']:.3g}",
                "yes" if result["identical"] else "no",
            ]
            for result in methods.values()
        ],
    )
    return write_json(name, {**summary, "methods": methods})


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus the environment) to ``benchmarks/out/<name>.json``."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(
        json.dumps({"environment": environment(), **payload}, indent=2, default=str) + "\n"
    )
    return path
