"""What the step boundary costs in instructions: step_overhead.py's variants counted by callgrind.

Context for step_overhead.py, not a target. Its figures are times on a shared machine,
where one run's median moves by more than most changes to the library's step; the
instructions a step executes move by a few thousand between runs (hash seeds, memory
layout), a fraction of a percent of a step. Each variant of step_overhead.py (its
``Runner``: the same model, loaders and trainer) runs in a process of its own under
Valgrind's callgrind, with instrumentation off through the imports, the set-up and
``--warmup`` steps; the process then switches it on (``callgrind_control --instr=on``),
runs ``--steps`` steps and exits at once, so the count is those steps' alone (a few
thousand instructions of the switch besides, under 0.01% of them). Two processes run at
a time.

An instruction count is not a time: a step's time also depends on how much of its code
and data the caches hold, so a small addition to a loop that already fills them can
cost more time than its instructions alone would (step_overhead.py's table shows the
times). It says where the library's work is, and whether a change to it removed any.

    python -m benchmarks.step_instructions --quick

Needs ``valgrind`` and ``callgrind_control`` on the PATH (the report says "not measured"
without them). Prints the table and writes benchmarks/out/step_instructions.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import environment, print_table, write_json

CASES = ("map, 0 workers", "iterable, 0 workers")
VARIANTS = ("bare", "loader", "library", "dropping", "torchdata")
_ROOT = Path(__file__).resolve().parent.parent


def _child(variant: str, case: str, warmup: int, steps: int) -> None:
    """Run under callgrind: warm up uncounted, switch instrumentation on, count ``steps`` steps."""
    import torch

    from benchmarks.step_overhead import Runner, _as_without_the_library

    torch.set_num_threads(1)
    runner = Runner(variant, case)
    with _as_without_the_library(variant):
        for _ in range(warmup):
            runner.step()
        switch = subprocess.Popen(
            ["callgrind_control", "--instr=on", str(os.getpid())], stdout=subprocess.DEVNULL
        )
        while switch.poll() is None:  # callgrind reads the request while this process runs
            time.sleep(0.01)
        if switch.returncode != 0:
            os._exit(3)
        step = runner.step
        for _ in range(steps):
            step()
        os._exit(0)  # nothing after the steps is counted (not even the context's exit)


def _total(out: Path) -> int:
    """The instructions a callgrind output file counts (its ``summary:`` or ``totals:`` line)."""
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{out} has no summary line")


def count(variant: str, case: str, warmup: int, steps: int, directory: Path) -> int:
    """Instructions of ``steps`` steps of ``variant`` in ``case``, in a process of its own."""
    out = directory / f"{variant}-{case.replace(', ', '-').replace(' ', '_')}.callgrind"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "benchmarks.step_instructions",
        "--child",
        variant,
        case,
        str(warmup),
        str(steps),
    ]
    # From the repository root, where python -m finds the benchmarks package.
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{variant}, {case}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return _total(out)


def figures(result: dict[str, float]) -> list[str]:
    """A variant's row of the table: instructions per step, x bare, over bare."""
    return [
        f"{result['instructions_per_step']:,.0f}",
        f"{result['ratio_to_bare']:.3f}",
        f"{result['over_bare']:+,.0f}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--steps", type=int, default=None, help="counted steps per variant")
    parser.add_argument("--warmup", type=int, default=200, help="uncounted steps first")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--child", nargs=4, metavar=("VARIANT", "CASE", "WARMUP", "STEPS"))
    args = parser.parse_args(argv)
    if args.child:
        variant, case, warmup, steps = args.child
        _child(variant, case, int(warmup), int(steps))
        return
    steps = args.steps or (300 if args.quick else 1000)
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    payload: dict[str, Any] = {
        "environment": environment(),
        "steps": steps,
        "warmup": args.warmup,
        "cases": {},
    }
    if missing:
        payload["not_measured"] = f"{' and '.join(missing)} not found"
        print(f"not measured: {payload['not_measured']}")
        write_json("step_instructions", payload)
        return
    jobs = [(case, variant) for case in args.cases for variant in VARIANTS]
    with tempfile.TemporaryDirectory() as directory, ThreadPoolExecutor(2) as pool:
        futures = {
            job: pool.submit(count, job[1], job[0], args.warmup, steps, Path(directory))
            for job in jobs
        }
        totals = {job: future.result() for job, future in futures.items()}
    for case in args.cases:
        bare = totals[(case, "bare")] / steps
        entry = payload["cases"][case] = {}
        for variant in VARIANTS:
            per_step = totals[(case, variant)] / steps
            entry[variant] = {
                "instructions_per_step": per_step,
                "ratio_to_bare": per_step / bare,
                "over_bare": per_step - bare,
            }
        print_table(
            f"Instructions per step, {case} (callgrind, {steps} steps after {args.warmup}; "
            "step_overhead.py's variants)",
            ["variant", "instructions/step", "x bare", "over bare"],
            [[variant, *figures(result)] for variant, result in entry.items()],
        )
    write_json("step_instructions", payload)


if __name__ == "__main__":
    main()
