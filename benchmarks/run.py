"""Run the whole benchmark suite and write benchmarks/RESULTS.md.

Each benchmark script runs as its own child process (so it measures in a fresh
interpreter), prints its tables and writes JSON to benchmarks/out/. The runner then
checks the targets from that JSON and writes RESULTS.md: the machine, the exact
command, every table, the target checks and the profiles' notes.

    python -m benchmarks --quick     # a few minutes on 2 cores
    python -m benchmarks             # the full sizes (much longer)
    python -m benchmarks --only pause checkpointing --results partial.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks._report import (
    MISS,
    PASS,
    ScriptRun,
    TargetCheck,
    accelerate_summary,
    check_targets,
    checkpoint_summary,
    hf_trainer_summary,
    render_results,
    step_instructions_summary,
    step_overhead_summary,
    where_loader_time_goes,
    where_pause_time_goes,
    where_resume_time_goes,
    where_seeding_time_goes,
    worst_pause_size,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
RESULTS = HERE / "RESULTS.md"


@dataclass(frozen=True)
class Benchmark:
    """One script of the suite, run as ``python -m benchmarks.<script>``; it writes
    ``benchmarks/out/<name>.json``."""

    name: str
    script: str  # the module's name inside the benchmarks package
    quick_args: tuple[str, ...]
    full_args: tuple[str, ...] = ()
    timeout_s: int = 3600


SUITE: tuple[Benchmark, ...] = (
    Benchmark("loader_throughput", "loader_throughput", ("--quick",)),
    Benchmark("loader_resume", "loader_resume", ("--quick",)),
    Benchmark("step_overhead", "step_overhead", ("--quick",)),
    Benchmark("step_instructions", "step_instructions", ("--quick",)),
    Benchmark("reuse", "reuse", ("--quick",)),
    # durable_save has no --quick: a 128 MiB state instead of 1 GiB.
    Benchmark("durable_save", "durable_save", ("--size-mib", "128", "--repeats", "3")),
    Benchmark("pause", "pause", ("--quick",)),
    Benchmark("checkpointing", "checkpointing", ("--quick",)),
    Benchmark("cold_resume", "cold_resume", ("--quick",)),
    Benchmark("sharded_pause", "sharded_pause", ("--quick",)),
    Benchmark("hf_trainer_resume", "hf_trainer_resume", ("--quick",)),
    Benchmark("accelerate_resume", "accelerate_resume", ("--quick",)),
    Benchmark("cloud_storage", "cloud_storage", ("--quick",)),
    Benchmark("profile_pause", "_profile_pause", ("--quick",)),
    Benchmark("profile_loader", "_profile_loader", ("--quick",)),
    Benchmark("profile_resume", "_profile_resume", ("--quick",)),
)
NAMES = tuple(benchmark.name for benchmark in SUITE)
DISTRIBUTIONS = (
    "torch",
    "numpy",
    "pytorch-lightning",
    "torchdata",
    "accelerate",
    "transformers",
    "trainer-resume",
)


# ------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    except OSError:
        pass
    try:
        return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / (1 << 30):.1f} GiB"
    except (AttributeError, ValueError, OSError):
        return "unknown"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_description() -> dict[str, str]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = f"{os.cpu_count()}" + (
        f" ({usable} usable by this process)" if usable is not None else ""
    )
    description = {
        "CPU": f"{_cpu_model()} ({platform.machine()})",
        "cores": cores,
        "RAM": _memory_gib(),
        "OS": platform.platform(),
        "load average at start": " ".join(f"{value:.2f}" for value in os.getloadavg())
        if hasattr(os, "getloadavg")
        else "unknown",
        "python": platform.python_version(),
    }
    description.update({distribution: _version(distribution) for distribution in DISTRIBUTIONS})
    return description


# -------------------------------------------------------------------------- running


def sanitise(text: str) -> str:
    """Drop this machine's paths from printed output (RESULTS.md is committed)."""
    for path, shown in (
        (str(ROOT), "."),
        (tempfile.gettempdir(), "$TMPDIR"),
        (str(Path.home()), "~"),
    ):
        if path and path not in (".", "/"):
            text = text.replace(path, shown)
    return text


def arguments_for(benchmark: Benchmark, *, quick: bool, started: float) -> list[str]:
    """The script's arguments; the pause profile follows the state size that missed its target most."""
    arguments = list(benchmark.quick_args if quick else benchmark.full_args)
    if benchmark.name == "profile_pause":
        label = worst_pause_size(load_results(["checkpointing"], since=started)["checkpointing"])
        if label is not None:
            arguments = [argument for argument in arguments if argument != "--quick"] + [
                "--size",
                label,
            ]
            if quick and label != "10M":
                arguments += ["--runs", "2"]
    return arguments


def run_benchmark(benchmark: Benchmark, arguments: Sequence[str], *, timeout_s: float) -> ScriptRun:
    """Run one script in a fresh process, echoing its output; the script's whole process group
    is killed if it outlives ``timeout_s``."""
    module = f"benchmarks.{benchmark.script}"
    shown = shlex.join(["python", "-m", module, *arguments])
    if not (HERE / f"{benchmark.script}.py").is_file():
        return ScriptRun(
            benchmark.name,
            shown,
            f"not available: benchmarks/{benchmark.script}.py does not exist",
            None,
            "",
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group: a timeout also ends its workers and children
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        lines = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                print(f"  | {line}", end="", flush=True)
                lines.append(line)
            code = process.wait()
        finally:
            timer.cancel()
        stderr.seek(0)
        errors = stderr.read()
    seconds = time.perf_counter() - start
    output = "".join(lines)
    if timed_out.is_set():
        status = f"timed out after {timeout_s:.0f} s"
    elif code != 0:
        status = f"failed (exit {code})"
    else:
        status = "ok"
    if status != "ok":
        output += (
            "\n--- stderr (last lines) ---\n" + "\n".join(errors.strip().splitlines()[-25:]) + "\n"
        )
        print(f"  ! {benchmark.name}: {status}\n{errors[-3000:]}", flush=True)
    return ScriptRun(benchmark.name, shown, status, seconds, sanitise(output))


def load_results(names: Sequence[str], *, since: float | None) -> dict[str, dict[str, Any] | None]:
    """Each benchmark's JSON, or None when it is missing or older than ``since`` (a stale file
    from an earlier run must not be reported as this run's figure)."""
    results: dict[str, dict[str, Any] | None] = {}
    for name in names:
        path = OUT / f"{name}.json"
        try:
            if since is not None and path.stat().st_mtime < since:
                results[name] = None
                continue
            results[name] = json.loads(path.read_text())
        except (OSError, ValueError):
            results[name] = None
    return results


# --------------------------------------------------------------------------- notes


def _verdict(checks: Sequence[TargetCheck], prefix: str, what: str) -> str:
    statuses = {check.status for check in checks if check.target.startswith(prefix)}
    if MISS in statuses:
        return f"The {what} target was missed (see Targets); the profile below shows where the time goes. "
    if statuses == {PASS}:
        return f"The {what} target was met; the profile is kept for reference. "
    return f"The {what} target was not measured in this run; the profile is kept for reference. "


def build_notes(
    results: Mapping[str, Mapping[str, Any] | None],
    checks: Sequence[TargetCheck],
    runs: Sequence[ScriptRun],
) -> list[tuple[str, str]]:
    notes = []
    paragraph = where_pause_time_goes(results.get("profile_pause"))
    if paragraph:
        notes.append(
            (
                "Where the time goes: pause()",
                _verdict(checks, "pause() <=", "pause() time") + paragraph,
            )
        )
    paragraph = where_loader_time_goes(results.get("profile_loader"))
    if paragraph:
        notes.append(
            (
                "Where the time goes: ResumableDataLoader throughput",
                _verdict(checks, "loader throughput", "loader throughput") + paragraph,
            )
        )
    paragraph = where_seeding_time_goes(results.get("profile_loader"))
    if paragraph:
        notes.append(
            (
                "Where the time goes: seeding and handing back per batch",
                _verdict(checks, "seeding + hand-back", "seeding") + paragraph,
            )
        )
    paragraph = where_resume_time_goes(results.get("profile_resume"))
    if paragraph:
        notes.append(
            (
                "Where the time goes: first batch after load_state_dict",
                _verdict(checks, "resume time flat", "resume flatness") + paragraph,
            )
        )
    unavailable = [f"- {run.name}: {run.status}" for run in runs if run.status != "ok"]
    if unavailable:
        notes.append(("Not available or failed", "\n".join(unavailable)))
    notes.append(
        (
            "How to read this",
            (
                "Ratios compare methods measured in the same run on the same machine; absolute times are context only. "
                "This machine may be shared with other work (see the load average above), which widens the spread "
                "between runs: every run is listed next to each median."
            ),
        )
    )
    return notes


def write_results(
    path: Path,
    *,
    command: str,
    generated: str,
    machine: Mapping[str, str],
    runs: Sequence[ScriptRun],
    results: Mapping[str, Mapping[str, Any] | None],
) -> list[TargetCheck]:
    checks = check_targets(results)
    text = render_results(
        command=command,
        generated=generated,
        machine=machine,
        runs=runs,
        checks=checks,
        notes=build_notes(results, checks, runs),
        sections=[
            *step_overhead_summary(results),
            *step_instructions_summary(results),
            *checkpoint_summary(results),
            *hf_trainer_summary(results),
            *accelerate_summary(results),
        ],
    )
    path.write_text(text)
    return checks


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Scripts: "
        + ", ".join(f"{b.name} (python -m benchmarks.{b.script})" for b in SUITE),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and few repeats (a few minutes on 2 cores)",
    )
    parser.add_argument(
        "--only", nargs="+", choices=NAMES, metavar="NAME", help="run only these benchmarks"
    )
    parser.add_argument(
        "--skip", nargs="+", choices=NAMES, default=[], metavar="NAME", help="leave these out"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where to write the report (default: benchmarks/RESULTS.md)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per script (default: 3600)"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the last suite run's records in benchmarks/out/",
    )
    args = parser.parse_args(arguments)

    OUT.mkdir(parents=True, exist_ok=True)
    record = OUT / "suite.json"
    if args.report_only:
        saved = json.loads(record.read_text())
        runs = [ScriptRun(**run) for run in saved["runs"]]
        results = load_results([run.name for run in runs], since=saved["started"])
        checks = write_results(
            args.results,
            command=saved["command"],
            generated=saved["generated"],
            machine=saved["machine"],
            runs=runs,
            results=results,
        )
        _print_checks(checks, args.results)
        return 0

    selected = [
        b for b in SUITE if (not args.only or b.name in args.only) and b.name not in args.skip
    ]
    command = " ".join([prog or "python -m benchmarks.run", shlex.join(arguments)]).strip()
    machine = machine_description()
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.time()
    runs = []
    for number, benchmark in enumerate(selected, 1):
        script_arguments = arguments_for(benchmark, quick=args.quick, started=started)
        print(
            f"[{number}/{len(selected)}] {benchmark.name}: {shlex.join(script_arguments)}",
            flush=True,
        )
        runs.append(
            run_benchmark(
                benchmark, script_arguments, timeout_s=args.timeout or benchmark.timeout_s
            )
        )
        print(
            f"[{number}/{len(selected)}] {benchmark.name}: {runs[-1].status} in {runs[-1].seconds or 0:.0f} s",
            flush=True,
        )
    if hasattr(os, "getloadavg"):
        machine["load average at end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    record.write_text(
        json.dumps(
            {
                "command": command,
                "generated": generated,
                "started": started,
                "machine": machine,
                "runs": [asdict(run) for run in runs],
            },
            indent=2,
        )
        + "\n"
    )
    results = load_results([run.name for run in runs], since=started)
    checks = write_results(
        args.results,
        command=command,
        generated=generated,
        machine=machine,
        runs=runs,
        results=results,
    )
    print(f"total {time.time() - started:.0f} s")
    _print_checks(checks, args.results)
    return (
        0
        if all(run.status == "ok" or run.status.startswith("not available") for run in runs)
        else 1
    )


def _print_checks(checks: Sequence[TargetCheck], path: Path) -> None:
    for check in checks:
        print(f"{check.status:>12}  {check.target}: {check.measured}")
    print(f"wrote {sanitise(str(path))}")


if __name__ == "__main__":
    sys.exit(main())
