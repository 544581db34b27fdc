"""RESULTS.md from the suite's JSON: target checks, tables, notes (pure functions, stdlib only).

Every figure in the generated file comes from a JSON written by a benchmark script
in the same run; nothing here holds a measured number.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.step_instructions import figures

PASS, MISS, NOT_MEASURED = "PASS", "MISS", "NOT MEASURED"

THROUGHPUT_TARGET = 0.97  # ResumableDataLoader / DataLoader samples/s at 200 µs per sample
THROUGHPUT_COST_US = 200.0
RESUME_FLAT_TARGET = 1.2  # max/min of the median time to first batch over positions
RESUME_FAR_POSITION = 100_000_000
PAUSE_TIME_TARGET = 0.95  # pause() / (torch.save + fsync), medians
RESUME_TIME_TARGET = 1.1  # resume() / (torch.load + load_state_dict), medians
PAUSE_RSS_TARGET = 1.1  # peak RSS above baseline / state size
CLOUD_TARGET = 1.1  # pause() / resume() at an s3:// URL against fsspec with torch.save's bytes

Results = Mapping[str, Mapping[str, Any] | None]
Section = tuple[str, Sequence[str], Sequence[Sequence[str]]]


@dataclass(frozen=True)
class TargetCheck:
    """One measured figure against one target."""

    target: str
    status: str  # PASS, MISS or NOT MEASURED
    measured: str
    source: str


@dataclass(frozen=True)
class ScriptRun:
    """What the runner recorded for one benchmark script."""

    name: str
    command: str
    status: str  # "ok", "failed (exit N)", "timed out after N s", "not available: ..."
    seconds: float | None
    output: str


def _missing(target: str, source: str, why: str) -> TargetCheck:
    return TargetCheck(target, NOT_MEASURED, why, source)


def _status(ok: bool) -> str:
    return PASS if ok else MISS


def _dataset(entry: Mapping[str, Any]) -> str:
    return str(entry.get("dataset", "map"))  # results written before iterables were measured


def throughput_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """Map-style ResumableDataLoader / DataLoader >= 0.97 at 200 µs per sample, one check per setting."""
    target = f"loader throughput >= {THROUGHPUT_TARGET} x DataLoader at {THROUGHPUT_COST_US:.0f} µs/sample"
    source = "loader_throughput.json"
    if data is None:
        return [_missing(target, source, "no result from this run")]
    try:
        default_workers = data.get("settings", {}).get("num_workers")
        checks = []
        for entry in data["results"]:
            if abs(float(entry["cost_us"]) - THROUGHPUT_COST_US) > 1e-9 or _dataset(entry) != "map":
                continue
            ours, theirs = entry["resumable_samples_per_s"], entry["torch_samples_per_s"]
            ratio = ours / theirs
            workers = entry.get("num_workers", default_workers)
            setting = f"num_workers={workers}: " if workers is not None else ""
            checks.append(
                TargetCheck(
                    target,
                    _status(ratio >= THROUGHPUT_TARGET),
                    f"{setting}{ratio:.3f} ({ours:,.0f} vs {theirs:,.0f} samples/s, medians)",
                    source,
                )
            )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return [
            _missing(target, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        ]
    return checks or [_missing(target, source, f"no run at {THROUGHPUT_COST_US:.0f} µs/sample")]


CPU_RATIO_TARGETS = (
    ("map", 200.0, None, 0.97),
    ("map", 0.0, 0, 0.90),
    ("iterable", 0.0, None, 0.90),
)  # (dataset, µs/sample, num_workers or any, minimum)
STATEFUL_SLACK = 0.02  # the noise of these machines, for "at least StatefulDataLoader's"


def _ratio_text(entry: Mapping[str, Any], prefix: str) -> str:
    text = f"{float(entry[f'{prefix}cpu_ratio']):.3f}"
    runs = entry.get(f"{prefix}cpu_ratio_runs")
    if runs:
        text += f" (min-max over {len(runs)} repeats {min(runs):.3f}-{max(runs):.3f})"
    return text


def cpu_ratio_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """DataLoader's CPU / ResumableDataLoader's: map-style >= 0.97 at 200 µs/sample and >= 0.90
    at 0 µs/sample without workers, iterable >= 0.90 at 0 µs/sample, and at every point at
    least StatefulDataLoader's (within 0.02)."""
    source = "loader_throughput.json"
    target = "loader CPU ratio to DataLoader"
    if data is None:
        return [_missing(target, source, "no result from this run")]
    checks = []
    try:
        for entry in data["results"]:
            cost, workers = float(entry["cost_us"]), entry.get("num_workers")
            dataset = _dataset(entry)
            ours = float(entry["cpu_ratio"])
            setting = f"{dataset}, num_workers={workers}, {cost:.0f} µs/sample: "
            for at_dataset, at_cost, at_workers, minimum in CPU_RATIO_TARGETS:
                if (
                    dataset == at_dataset
                    and abs(cost - at_cost) < 1e-9
                    and at_workers in (None, workers)
                ):
                    checks.append(
                        TargetCheck(
                            f"{target} >= {minimum:.2f} at {at_cost:.0f} µs/sample ({at_dataset}"
                            + (f", num_workers={at_workers}" if at_workers is not None else "")
                            + ")",
                            _status(ours >= minimum),
                            setting + _ratio_text(entry, ""),
                            source,
                        )
                    )
            if "stateful_cpu_ratio" in entry:
                theirs = float(entry["stateful_cpu_ratio"])
                checks.append(
                    TargetCheck(
                        f"{target} >= StatefulDataLoader's - {STATEFUL_SLACK}",
                        _status(ours >= theirs - STATEFUL_SLACK),
                        f"{setting}{ours:.3f} vs {theirs:.3f}",
                        source,
                    )
                )
    except (KeyError, TypeError, ValueError) as error:
        return [
            _missing(target, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        ]
    return checks or [_missing(target, source, "no run at a target setting")]


def seeding_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """Seeding and handing back the generators, per batch without workers: <= its target
    (and, where the JSON names one, <= its stretch)."""
    source = "loader_throughput.json"
    if data is None:
        return [_missing("seeding + hand-back per batch", source, "no result from this run")]
    try:
        measured, limit = data["seeding_us_per_batch"], data["seeding_target_us"]
    except (KeyError, TypeError) as error:
        target = "seeding + hand-back per batch"
        return [_missing(target, source, f"not in this JSON ({type(error).__name__}: {error})")]
    checks = [
        TargetCheck(
            f"seeding + hand-back per batch <= {limit:.0f} µs (num_workers=0)",
            _status(measured <= limit),
            f"{measured:.1f} µs per batch",
            source,
        )
    ]
    stretch = data.get("seeding_stretch_us")
    if stretch is not None:
        checks.append(
            TargetCheck(
                f"seeding + hand-back per batch <= {stretch:.0f} µs (num_workers=0, stretch)",
                _status(measured <= stretch),
                f"{measured:.1f} µs per batch",
                source,
            )
        )
    return checks


def _medians(runs: Mapping[str, Sequence[float]]) -> dict[int, float]:
    return {int(position): statistics.median(times) for position, times in runs.items() if times}


def resume_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """Ours flat in position (max/min <= 1.2 up to 1e8); StatefulDataLoader's grows."""
    flat = f"resume time flat in position (max/min <= {RESUME_FLAT_TARGET}, positions up to 1e8)"
    grows = f"StatefulDataLoader resume time grows with position (max/min > {RESUME_FLAT_TARGET})"
    source = "loader_resume.json"
    if data is None:
        return [
            _missing(flat, source, "no result from this run"),
            _missing(grows, source, "no result from this run"),
        ]
    checks = []
    try:
        ours = _medians(data["resumable"])
        spread = max(ours.values()) / min(ours.values())
        reached = max(ours)
        figures = ", ".join(
            f"{position:,}: {seconds * 1e3:.1f} ms" for position, seconds in sorted(ours.items())
        )
        if reached < RESUME_FAR_POSITION:
            checks.append(
                TargetCheck(
                    flat,
                    MISS,
                    f"max/min {spread:.2f}, but positions only up to {reached:,}",
                    source,
                )
            )
        else:
            checks.append(
                TargetCheck(
                    flat,
                    _status(spread <= RESUME_FLAT_TARGET),
                    f"max/min {spread:.2f} ({figures})",
                    source,
                )
            )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        checks.append(
            _missing(flat, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        )
    try:
        theirs = _medians(data.get("stateful_dataloader") or {})
        if len(theirs) < 2:
            skipped = data.get("stateful_dataloader_skipped") or {}
            why = (
                "; ".join(f"{position}: {reason}" for position, reason in skipped.items())
                or "not run"
            )
            checks.append(_missing(grows, source, f"fewer than two positions measured ({why})"))
        else:
            first, last = min(theirs), max(theirs)
            growth = theirs[last] / theirs[first]
            checks.append(
                TargetCheck(
                    grows,
                    _status(growth > RESUME_FLAT_TARGET),
                    f"x{growth:.2f} from position {first:,} ({theirs[first] * 1e3:.1f} ms) to {last:,} "
                    f"({theirs[last] * 1e3:.1f} ms)",
                    source,
                )
            )
    except (TypeError, ValueError, ZeroDivisionError) as error:
        checks.append(
            _missing(grows, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        )
    return checks


def _params(size: Mapping[str, Any]) -> str:
    return f"{size['parameters'] / 1e6:.1f}M params"


def _ratio_checks(
    checkpointing: Mapping[str, Any] | None,
    kind: str,
    ours: str,
    reference: str,
    limit: float,
) -> list[TargetCheck]:
    """``ours`` / ``reference`` for each state size of checkpointing.py, fresh process per
    run and same process (interleaved), against ``limit``."""
    target = f"{ours} <= {limit} x {reference}"
    source = "checkpointing.json"
    if checkpointing is None:
        return [_missing(target, source, "no result from this run")]
    checks = []
    try:
        for size in checkpointing["sizes"]:
            places = [("fresh process per run", size[kind])]
            if "same_process" in size:
                places.append(("same process, interleaved", size["same_process"][kind]))
            for where, results in places:
                mine, theirs = results[ours]["median_seconds"], results[reference]["median_seconds"]
                ratio = mine / theirs
                checks.append(
                    TargetCheck(
                        target,
                        _status(ratio <= limit),
                        f"{_params(size)}, {where}: {ratio:.2f}x ({mine:.3f} s vs "
                        f"{theirs:.3f} s, medians)",
                        source,
                    )
                )
    except (KeyError, TypeError, ZeroDivisionError) as error:
        return [
            _missing(target, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        ]
    return checks


def pause_time_checks(
    checkpointing: Mapping[str, Any] | None, pause: Mapping[str, Any] | None
) -> list[TargetCheck]:
    """pause() <= 0.95 x torch.save + fsync: each state size of checkpointing.py (fresh and
    same process), and pause.py."""
    checks = _ratio_checks(
        checkpointing, "save", "pause()", "torch.save + fsync", PAUSE_TIME_TARGET
    )
    if pause is not None:
        target = f"pause() <= {PAUSE_TIME_TARGET} x torch.save + fsync"
        try:
            blocking = pause["blocking"]
            ratio = blocking["pause_median_s"] / blocking["torch_save_fsync_median_s"]
            checks.append(
                TargetCheck(
                    target,
                    _status(ratio <= PAUSE_TIME_TARGET),
                    f"{pause['parameters'] / 1e6:.1f}M params, same process: {ratio:.2f}x "
                    f"({blocking['pause_median_s']:.3f} s vs {blocking['torch_save_fsync_median_s']:.3f} s, medians)",
                    "pause.json",
                )
            )
        except (KeyError, TypeError, ZeroDivisionError) as error:
            checks.append(
                _missing(
                    target,
                    "pause.json",
                    f"unexpected JSON layout ({type(error).__name__}: {error})",
                )
            )
    return checks


def resume_time_checks(checkpointing: Mapping[str, Any] | None) -> list[TargetCheck]:
    """resume() <= 1.1 x torch.load + load_state_dict: each state size, fresh and same process."""
    return _ratio_checks(
        checkpointing, "load", "resume()", "torch.load + load_state_dict", RESUME_TIME_TARGET
    )


def worst_pause_size(checkpointing: Mapping[str, Any] | None) -> str | None:
    """The state size label whose pause() time ratio misses the target by most (None: no miss)."""
    worst: tuple[float, str] | None = None
    try:
        for size in (checkpointing or {}).get("sizes", []):
            ratio = (
                size["save"]["pause()"]["median_seconds"]
                / size["save"]["torch.save + fsync"]["median_seconds"]
            )
            if ratio > PAUSE_TIME_TARGET and (worst is None or ratio > worst[0]):
                worst = (ratio, size["label"])
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return None if worst is None else worst[1]


def pause_memory_checks(checkpointing: Mapping[str, Any] | None) -> list[TargetCheck]:
    """Peak RSS above baseline during pause() <= 1.1 x the state size."""
    target = f"peak RSS during pause() <= {PAUSE_RSS_TARGET} x state size above baseline"
    source = "checkpointing.json"
    if checkpointing is None:
        return [_missing(target, source, "no result from this run")]
    checks = []
    try:
        for size in checkpointing["sizes"]:
            peak = size["save"]["pause()"]["max_peak_rss_above_baseline_bytes"]
            state = size["state_bytes"]
            ratio = peak / state
            checks.append(
                TargetCheck(
                    target,
                    _status(ratio <= PAUSE_RSS_TARGET),
                    f"{_params(size)}: {ratio:.2f}x ({peak / (1 << 20):,.1f} MiB above baseline for "
                    f"{state / (1 << 20):,.1f} MiB of state, worst run)",
                    source,
                )
            )
    except (KeyError, TypeError, ZeroDivisionError) as error:
        return [
            _missing(target, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        ]
    return checks


HF_TRAINER_TARGET = "ResumableTrainer resumes a transformers Trainer run bit-identically"
ACCELERATE_TARGET = "the Accelerate adapter resumes an Accelerate loop bit-identically"


@dataclass(frozen=True)
class FrameworkResume:
    """A benchmark that resumes one framework's run its own way and with this library's adapter.

    Its JSON holds ``parameters``, ``steps``, ``interrupted_after``, ``repeats`` and, under
    ``methods``, per method: ``label``, ``identical``, ``first_differing_step``,
    ``max_weight_difference``, ``median_pause_s`` and ``median_resume_s``.
    """

    name: str  # the benchmark's name (its JSON file and script)
    title: str  # "Hugging Face Trainer"
    target: str
    ours: str  # the key of the adapter's method
    theirs: str  # the key of the framework's own
    their_resume: str  # "the Trainer's own resume"
    step: str  # what the steps count: "step", "micro-step"


HF_TRAINER = FrameworkResume(
    "hf_trainer_resume",
    "Hugging Face Trainer",
    HF_TRAINER_TARGET,
    "resumable",
    "trainer",
    "the Trainer's own resume",
    "step",
)
ACCELERATE = FrameworkResume(
    "accelerate_resume",
    "Accelerate",
    ACCELERATE_TARGET,
    "adapter",
    "accelerate",
    "Accelerate's own resume",
    "micro-step",
)


def framework_resume_checks(
    benchmark: FrameworkResume, data: Mapping[str, Any] | None
) -> list[TargetCheck]:
    """The adapter's resumed run equals its uninterrupted run (losses and weights)."""
    source, target, step = f"{benchmark.name}.json", benchmark.target, benchmark.step
    if data is None:
        return [_missing(target, source, "no result from this run")]
    try:
        ours, theirs = data["methods"][benchmark.ours], data["methods"][benchmark.theirs]
        where = f"resumed after {step} {data['interrupted_after']} of {data['steps']}"
        if ours["identical"]:
            measured = f"{where}: losses and weights identical"
        else:
            measured = f"{where}: differs from {step} {ours['first_differing_step']}"
        if theirs["first_differing_step"] is not None:
            measured += (
                f"; {benchmark.their_resume} differs from {step} {theirs['first_differing_step']}"
            )
        return [TargetCheck(target, _status(bool(ours["identical"])), measured, source)]
    except (KeyError, TypeError) as error:
        why = f"unexpected JSON layout ({type(error).__name__}: {error})"
        return [_missing(target, source, why)]


def cloud_storage_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """pause() and resume() at an s3:// URL within 1.1 x torch.save's bytes written with
    fsspec (fs.pipe and fs.open "wb") and torch.load from fs.open, medians."""
    source = "cloud_storage.json"
    pairs = (
        ("write", "pause()", "torch.save(BytesIO) + fs.pipe"),
        ("write", "pause()", 'torch.save(fs.open(url, "wb"))'),
        ("read", "resume()", 'torch.load(fs.open(url, "rb")) + load_state_dict'),
    )
    checks = []
    for kind, ours, reference in pairs:
        target = f"{ours} at s3:// <= {CLOUD_TARGET} x {reference}"
        if data is None:
            checks.append(_missing(target, source, "no result from this run"))
            continue
        try:
            mine = data[kind][ours]["median_seconds"]
            theirs = data[kind][reference]["median_seconds"]
            ratio = mine / theirs
            size = data["state_bytes"] / (1 << 20)
            measured = (
                f"{size:,.0f} MiB state: {ratio:.2f}x ({mine:.3f} s vs {theirs:.3f} s, medians)"
            )
            checks.append(TargetCheck(target, _status(ratio <= CLOUD_TARGET), measured, source))
        except (KeyError, TypeError, ZeroDivisionError) as error:
            why = f"unexpected JSON layout ({type(error).__name__}: {error})"
            checks.append(_missing(target, source, why))
    return checks


def hf_trainer_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """ResumableTrainer's resumed run equals its uninterrupted run (losses and weights)."""
    return framework_resume_checks(HF_TRAINER, data)


def accelerate_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """The Accelerate adapter's resumed loop equals its uninterrupted run (losses and weights)."""
    return framework_resume_checks(ACCELERATE, data)


STEP_STRETCH_US = 5.0  # the stretch: the boundary's own cost over the bare loop, plus the seeding


def step_overhead_checks(
    data: Mapping[str, Any] | None, throughput: Mapping[str, Any] | None = None
) -> list[TargetCheck]:
    """``@training_step`` over a ResumableDataLoader / the bare loop over DataLoader, per loader
    case (median of the per-round ratios <= the case's target, the min-max spread shown), and
    the stretch: the median overhead <= 5 µs plus the seeding per batch (loader_throughput.json)."""
    source = "step_overhead.json"
    target = "per-step cost over a bare loop"
    if data is None:
        return [_missing(target, source, "no result from this run")]
    checks = []
    try:
        seeding = None if throughput is None else throughput.get("seeding_us_per_batch")
        for case, limit in data["targets"].items():
            entry = data["cases"].get(case)
            if entry is None:
                checks.append(_missing(f"{target} <= {limit:.2f}x ({case})", source, "not run"))
                continue
            ours, bare = entry["library"], entry["bare"]
            ratio, ratios = float(ours["median_ratio_to_bare"]), ours["ratios_to_bare"]
            overhead = float(ours["median_overhead_us"])
            figures = (
                f"{ratio:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}; "
                f"{ours['median_us_per_step']:.1f} vs {bare['median_us_per_step']:.1f} µs/step, "
                f"{overhead:+.1f} µs)"
            )
            checks.append(
                TargetCheck(
                    f"{target} <= {float(limit):.2f}x ({case})",
                    _status(ratio <= float(limit)),
                    figures,
                    source,
                )
            )
            stretch = f"{target} <= {STEP_STRETCH_US:.0f} µs + seeding ({case}, stretch)"
            if seeding is None:
                checks.append(_missing(stretch, source, "no seeding figure (loader_throughput)"))
            else:
                limit_us = STEP_STRETCH_US + float(seeding)
                checks.append(
                    TargetCheck(
                        stretch,
                        _status(overhead <= limit_us),
                        f"{overhead:+.1f} µs (limit {limit_us:.1f} µs)",
                        source,
                    )
                )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return [
            _missing(target, source, f"unexpected JSON layout ({type(error).__name__}: {error})")
        ]
    return checks or [_missing(target, source, "no case measured")]


def cold_resume_checks(data: Mapping[str, Any] | None) -> list[TargetCheck]:
    """resume() from an evicted file <= 1.10x torch.load + load_state_dict from one evicted the
    same way (~10M parameters), and at ~100M parameters pause() and resume() >= 0.90 of the
    plain 16 MiB writes' and reads' bandwidth measured in the same run."""
    source = "cold_resume.json"
    small = "cold resume() <= {:.2f}x torch.load + load_state_dict (~10M parameters)"
    write = "pause() write bandwidth >= {:.2f}x plain writes + fsync (~100M parameters)"
    read = "cold resume() read bandwidth >= {:.2f}x plain reads (~100M parameters)"
    if data is None:
        return [
            _missing(target.format(limit), source, "no result from this run")
            for target, limit in ((small, 1.10), (write, 0.90), (read, 0.90))
        ]
    checks = []
    try:
        limit = float(data["small_target"])
        entry = data["small"]
        seconds = entry["seconds"]
        ratio, ratios = float(entry["median_ratio"]), entry["ratios"]
        checks.append(
            TargetCheck(
                small.format(limit),
                _status(ratio <= limit),
                f"{ratio:.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}; "
                f"{statistics.median(seconds['resume()']):.3f} s vs "
                f"{statistics.median(seconds['torch.load']):.3f} s, medians)",
                source,
            )
        )
        bandwidth = float(data["bandwidth_target"])
        large = data["large"]
        if large is None:
            checks += [
                _missing(write.format(bandwidth), source, "the large state was skipped"),
                _missing(read.format(bandwidth), source, "the large state was skipped"),
            ]
            return checks
        rates = large["bytes_per_s"]
        for target, key, ours, theirs in (
            (write, "write_ratios", "pause_write", "plain_write"),
            (read, "read_ratios", "resume_read", "plain_read"),
        ):
            ratios = large[key]
            ratio = statistics.median(ratios)
            checks.append(
                TargetCheck(
                    target.format(bandwidth),
                    _status(ratio >= bandwidth),
                    f"{ratio:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}; "
                    f"{statistics.median(rates[ours]) / (1 << 20):,.0f} vs "
                    f"{statistics.median(rates[theirs]) / (1 << 20):,.0f} MiB/s, medians, "
                    f"{large['file_bytes'] / (1 << 30):.2f} GiB)",
                    source,
                )
            )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return [
            _missing(
                "cold resume and bandwidth",
                source,
                f"unexpected JSON layout ({type(error).__name__}: {error})",
            )
        ]
    return checks


def step_overhead_summary(results: Results) -> list[Section]:
    """µs per step of every variant of step_overhead.py, per loader case, with the ratios."""
    data = results.get("step_overhead")
    if data is None:
        return []
    rows = []
    try:
        for case, entry in data["cases"].items():
            for variant, result in entry.items():
                values, ratios = result["us_per_step"], result["ratios_to_bare"]
                rows.append(
                    [
                        case,
                        str(variant),
                        f"{result['median_us_per_step']:.1f}",
                        f"{min(values):.1f}-{max(values):.1f}",
                        f"{result['median_ratio_to_bare']:.3f}",
                        f"{min(ratios):.3f}-{max(ratios):.3f}",
                    ]
                )
        title = (
            f"Per-step cost (step_overhead.py: {data['steps']} steps after {data['warmup']}, "
            f"{data['rounds']} rounds interleaved in blocks of {data.get('block', data['steps'])} "
            f"steps; load average {data.get('load_average_before')})"
        )
    except (KeyError, TypeError, ValueError) as error:
        return [("Per-step cost", ["error"], [[f"unexpected JSON layout: {error}"]])]
    headers = ["case", "variant", "median µs/step", "min-max", "x bare", "x bare min-max"]
    return [(title, headers, rows)]


def step_instructions_summary(results: Results) -> list[Section]:
    """Instructions per step of step_overhead.py's variants, counted by callgrind (context)."""
    data = results.get("step_instructions")
    if data is None:
        return []
    title = "Instructions per step (step_instructions.py: callgrind; context, not a target)"
    if "not_measured" in data:
        return [(title, ["not measured"], [[str(data["not_measured"])]])]
    rows = []
    try:
        for case, entry in data["cases"].items():
            rows += [[case, str(variant), *figures(result)] for variant, result in entry.items()]
        title = (
            f"Instructions per step (step_instructions.py: callgrind, {data['steps']} steps "
            f"after {data['warmup']}; context, not a target)"
        )
    except (KeyError, TypeError, ValueError) as error:
        return [(title, ["error"], [[f"unexpected JSON layout: {error}"]])]
    return [(title, ["case", "variant", "instructions/step", "x bare", "over bare"], rows)]


def check_targets(results: Results) -> list[TargetCheck]:
    """Every target of the suite, checked from the scripts' JSON (None: no JSON from this run)."""
    return (
        [
            *throughput_checks(results.get("loader_throughput")),
            *cpu_ratio_checks(results.get("loader_throughput")),
            *seeding_checks(results.get("loader_throughput")),
            *resume_checks(results.get("loader_resume")),
            *pause_time_checks(results.get("checkpointing"), results.get("pause")),
            *resume_time_checks(results.get("checkpointing")),
            *pause_memory_checks(results.get("checkpointing")),
            *hf_trainer_checks(results.get("hf_trainer_resume")),
            *accelerate_checks(results.get("accelerate_resume")),
            *cloud_storage_checks(results.get("cloud_storage")),
        ]
        + (
            # only where the suite ran it (a run of other scripts has no per-step figure to miss)
            step_overhead_checks(results["step_overhead"], results.get("loader_throughput"))
            if "step_overhead" in results
            else []
        )
        + (cold_resume_checks(results["cold_resume"]) if "cold_resume" in results else [])
    )


def checkpoint_summary(results: Results) -> list[Section]:
    """Tables that put checkpointing.json and pause.json side by side (save, resume, file size, overhead)."""
    sections: list[Section] = []
    checkpointing, pause = results.get("checkpointing"), results.get("pause")
    try:
        if checkpointing is not None:
            rows = []
            for size in checkpointing["sizes"]:
                state = size["state_bytes"]
                for name, result in size["save"].items():
                    rows.append(
                        [
                            _params(size),
                            name,
                            f"{result['median_seconds']:.3f}",
                            f"{result['ratio_to_reference']:.2f}",
                            f"{result['max_peak_rss_above_baseline_bytes'] / state:.2f}",
                            f"{result['file_bytes'] / (1 << 20):,.1f}",
                        ]
                    )
            sections.append(
                (
                    "Checkpoint save (checkpointing.py, fresh process per run)",
                    [
                        "state",
                        "method",
                        "median s",
                        "x torch.save + fsync",
                        "peak RSS above baseline / state",
                        "file MiB",
                    ],
                    rows,
                )
            )
            rows = [
                [
                    _params(size),
                    name,
                    f"{result['median_seconds']:.3f}",
                    f"{result['ratio_to_reference']:.2f}",
                    f"{result['max_peak_rss_above_baseline_bytes'] / size['state_bytes']:.2f}",
                ]
                for size in checkpointing["sizes"]
                for name, result in size["load"].items()
            ]
            sections.append(
                (
                    "Resume (checkpointing.py, the file just written)",
                    [
                        "state",
                        "method",
                        "median s",
                        "x torch.load + load_state_dict",
                        "peak RSS above baseline / state",
                    ],
                    rows,
                )
            )
        rows = []
        if pause is not None:
            sizes = pause["file_size"]
            rows += [
                [
                    "pause file, shared keys (pause.py)",
                    f"{sizes['shared_bytes'] / (1 << 20):,.1f} MiB",
                    f"{sizes['shared_bytes'] / sizes['separate_bytes']:.3f} x separate copies",
                ],
                [
                    "pause file, separate copies (pause.py)",
                    f"{sizes['separate_bytes'] / (1 << 20):,.1f} MiB",
                    "",
                ],
            ]
        overhead = (checkpointing or {}).get("step_overhead") or (pause or {}).get("overhead")
        if overhead is not None:
            rows += [
                [
                    "@training_step overhead per call",
                    f"{overhead['training_step_overhead_us']:.3f} µs",
                    f"{overhead['training_step_call_us']:.3f} µs wrapped vs {overhead['plain_call_us']:.3f} µs plain",
                ],
                [
                    "@serialized_training overhead per call",
                    f"{overhead['serialized_training_overhead_us']:.3f} µs",
                    "",
                ],
            ]
        if rows:
            sections.append(
                ("Shared keys and step overhead", ["what", "measured", "context"], rows)
            )
    except (KeyError, TypeError, ZeroDivisionError) as error:
        sections.append(
            (
                "Checkpoint summary",
                ["problem"],
                [[f"unexpected JSON layout ({type(error).__name__}: {error})"]],
            )
        )
    return sections


def framework_resume_summary(benchmark: FrameworkResume, results: Results) -> list[Section]:
    """The framework's own resume beside the adapter's: exactness, pause and resume times."""
    data = results.get(benchmark.name)
    if data is None:
        return []
    step = benchmark.step
    try:
        rows = [
            [
                method["label"],
                "yes" if method["identical"] else "no",
                "none"
                if method["first_differing_step"] is None
                else str(method["first_differing_step"]),
                f"{method['max_weight_difference']:.3g}",
                f"{method['median_pause_s']:.3f}",
                f"{method['median_resume_s']:.3f}",
            ]
            for method in data["methods"].values()
        ]
        title = (
            f"{benchmark.title} resume ({benchmark.name}.py, {data['parameters'] / 1e6:.1f}M "
            f"parameters, resumed after {step} {data['interrupted_after']} of {data['steps']}, "
            f"medians of {data['repeats']})"
        )
    except (KeyError, TypeError) as error:
        problem = f"unexpected JSON layout ({type(error).__name__}: {error})"
        return [(f"{benchmark.title} resume", ["problem"], [[problem]])]
    headers = [
        "method",
        "bit-identical",
        f"first differing {step}",
        "max weight difference",
        "pause s",
        "resume s",
    ]
    return [(title, headers, rows)]


def hf_trainer_summary(results: Results) -> list[Section]:
    """The Trainer's own resume beside ResumableTrainer's: exactness, pause and resume times."""
    return framework_resume_summary(HF_TRAINER, results)


def accelerate_summary(results: Results) -> list[Section]:
    """Accelerate's own resume beside the adapter's: exactness, pause and resume times."""
    return framework_resume_summary(ACCELERATE, results)


def where_pause_time_goes(profile: Mapping[str, Any] | None) -> str | None:
    """A paragraph from profile_pause.json: pause()'s time by category against torch.save + fsync."""
    if profile is None:
        return None
    try:
        ours = profile["writers"]["pause()"]
        theirs = profile["writers"]["torch.save + fsync"]
        total_ours, total_theirs = ours["profiled_s"], theirs["profiled_s"]
        parts = [
            f"{category} {seconds:.3f} s ({seconds / total_ours:.0%})"
            for category, seconds in sorted(ours["categories"].items(), key=lambda item: -item[1])
            if seconds >= 0.0005
        ]
        differences = sorted(
            (
                (category, ours["categories"][category] - theirs["categories"].get(category, 0.0))
                for category in ours["categories"]
            ),
            key=lambda item: -item[1],
        )
        extra = [
            f"{category} {delta:+.3f} s" for category, delta in differences if delta >= 0.0005
        ][:3]
        top = ", ".join(
            f"`{entry['function']}` {entry['tottime_s']:.3f} s" for entry in ours["top"][:4]
        )
    except (KeyError, TypeError, ZeroDivisionError) as error:
        return f"profile_pause.json has an unexpected layout ({type(error).__name__}: {error})."
    return (
        f"cProfile of {profile['parameters'] / 1e6:.1f}M parameters + AdamW "
        f"({profile['state_bytes'] / (1 << 20):,.1f} MiB), fastest of {profile['runs']} runs each: pause() "
        f"{total_ours:.3f} s against {total_theirs:.3f} s for torch.save + fsync "
        f"({total_ours / total_theirs:.2f}x under the profiler). pause() by category: {'; '.join(parts)}. "
        f"Largest additions over torch.save + fsync: {', '.join(extra) or 'none'}. "
        f"Most own time: {top}."
    )


def where_loader_time_goes(profile: Mapping[str, Any] | None) -> str | None:
    """A paragraph from profile_loader.json: CPU per sample of both loaders and the profile's additions."""
    if profile is None:
        return None
    try:
        medians = profile["median_cpu_us_per_sample"]
        ours, theirs = medians["ResumableDataLoader"], medians["DataLoader"]
        extra = profile["profiles"]["ResumableDataLoader"]["categories_us_per_sample"]
        base = profile["profiles"]["DataLoader"]["categories_us_per_sample"]
        differences = sorted(
            ((category, extra[category] - base[category]) for category in extra),
            key=lambda item: -item[1],
        )
        added = ", ".join(
            f"{category} {delta:+.1f} µs" for category, delta in differences if delta >= 0.05
        )
        top = ", ".join(
            f"`{entry['function']}` {entry['own_us_per_sample']:.1f} µs"
            for entry in profile["profiles"]["ResumableDataLoader"]["top"][:4]
        )
    except (KeyError, TypeError) as error:
        return f"profile_loader.json has an unexpected layout ({type(error).__name__}: {error})."
    return (
        f"In one process (num_workers=0, {profile['cost_us']:.0f} µs spin per sample, median of "
        f"{profile['repeats']}), a sample costs {ours:.1f} CPU µs with ResumableDataLoader against {theirs:.1f} µs "
        f"with DataLoader: {ours - theirs:+.1f} µs per sample, a throughput ratio of {theirs / ours:.3f} wherever "
        f"CPU is the bottleneck (as with 2 workers on 2 cores). Under cProfile with "
        f"{profile['profile_cost_us']:.0f} µs spin, the per-sample additions by category: {added or 'none'}; "
        f"most own time in the resumable loader: {top}."
    )


def where_seeding_time_goes(profile: Mapping[str, Any] | None) -> str | None:
    """A paragraph from profile_loader.json: seeding one batch and handing back, step by step."""
    if profile is None or not profile.get("seeding_breakdown_us"):
        return None
    try:
        steps = dict(profile["seeding_breakdown_us"])
        whole = steps.pop("whole: CallerGenerators.run around seed_batch")
        parts = "; ".join(
            f"{name} {value:.2f} µs"
            for name, value in sorted(steps.items(), key=lambda item: -item[1])
        )
    except (KeyError, TypeError, AttributeError) as error:
        return f"profile_loader.json has an unexpected layout ({type(error).__name__}: {error})."
    return (
        f"Seeding one batch and handing the caller's generators back took {whole:.2f} µs in the profile "
        f"run (each step timed on its own, min of repeats): {parts}."
    )


def where_resume_time_goes(profile: Mapping[str, Any] | None) -> str | None:
    """A paragraph from profile_resume.json: in-process time by position, and the workers' fixed cost."""
    if profile is None:
        return None
    try:
        medians = _medians(profile["in_process_seconds"])
        startup = statistics.median(profile["worker_startup_seconds"])
        shares = {
            int(position): item["randperm_s"] / item["profiled_s"]
            for position, item in profile["profiles"].items()
        }
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return f"profile_resume.json has an unexpected layout ({type(error).__name__}: {error})."
    figures = ", ".join(
        f"{position:,}: {seconds * 1e3:.1f} ms" for position, seconds in sorted(medians.items())
    )
    low, high = f"{min(shares.values()):.0%}", f"{max(shares.values()):.0%}"
    share = low if low == high else f"{low}-{high}"
    dominated = (
        " With workers the first batch is therefore mostly worker start-up, a cost that does not depend on the "
        "position."
        if startup > max(medians.values())
        else ""
    )
    return (
        f"In one process (num_workers=0, median of {profile['repeats']}), load_state_dict + the first batch takes "
        f"{figures} (max/min {max(medians.values()) / min(medians.values()):.2f}); under cProfile "
        f"torch.randperm (the one permutation of the position's cycle) is {share} of it. A fresh "
        f"num_workers={profile['num_workers_for_startup']} loader with no state loaded needs {startup * 1e3:.1f} ms "
        f"(median) for its first batch.{dominated}"
    )


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(value: str) -> str:
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def render_results(
    *,
    command: str,
    generated: str,
    machine: Mapping[str, str],
    runs: Sequence[ScriptRun],
    checks: Sequence[TargetCheck],
    notes: Sequence[tuple[str, str]],
    sections: Sequence[Section] = (),
) -> str:
    """The text of RESULTS.md."""
    lines = [
        "# Benchmark results",
        "",
        (
            f"Generated by `{command}` on {generated}. This file is written by the benchmark runner "
            "(`benchmarks/run.py`); rerun the command to refresh it rather than editing it."
        ),
        "",
        "## Machine",
        "",
        *_markdown_table(["", ""], [[key, value] for key, value in machine.items()]),
        "",
        "## Targets",
        "",
    ]
    lines += _markdown_table(
        ["target", "status", "measured", "from"],
        [[c.target, f"**{c.status}**", c.measured, c.source] for c in checks],
    )
    counts = {
        status: sum(c.status == status for c in checks) for status in (PASS, MISS, NOT_MEASURED)
    }
    lines += [
        "",
        f"{counts[PASS]} passed, {counts[MISS]} missed, {counts[NOT_MEASURED]} not measured.",
        "",
    ]
    if sections:
        lines += ["## Summary", ""]
        for title, headers, rows in sections:
            lines += [f"### {title}", "", *_markdown_table(headers, rows), ""]
    lines += ["## Runs", ""]
    lines += _markdown_table(
        ["benchmark", "command", "status", "wall s"],
        [
            [
                run.name,
                f"`{run.command}`",
                run.status,
                "" if run.seconds is None else f"{run.seconds:.0f}",
            ]
            for run in runs
        ],
    )
    lines.append("")
    for run in runs:
        lines += [f"### {run.name}", "", f"`{run.command}` ({run.status})", ""]
        if run.output.strip():
            lines += ["```text", run.output.rstrip(), "```", ""]
    if notes:
        lines += ["## Notes", ""]
        for title, text in notes:
            lines += [f"### {title}", "", text, ""]
    return "\n".join(lines).rstrip() + "\n"
