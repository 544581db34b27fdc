"""``trainer-resume audit-loader``: contract, worker, epoch, resume and throughput checks of a loader."""

from __future__ import annotations

import statistics
from typing import Any, TextIO

from ...rng import seed_cpu_generators
from .._common import EXIT_CHECK_FAILED, EXIT_OK, format_table
from .compare import check_epochs, compare_workers, explain
from .contract import (
    AuditUsageError,
    ContractReport,
    check_contract,
    check_stream_contract,
    describe,
)
from .resume import check_resumes, print_resumes, resumable_reason
from .runs import EpochRun, Target, build_target, is_endless, load_factory, run_epochs
from .streams import check_stream_passes, compare_stream_workers

__all__ = ["AuditUsageError", "run_audit"]

_SHOWN = 10  # contract violations listed; the rest are counted


def _print_contract(report: ContractReport, out: TextIO, *, stream: bool = False) -> None:
    if stream:
        scope = "every item" if report.complete else f"the first {report.checked} items"
        where = f"iter(dataset) read in this process, {scope}"
    else:
        where = "dataset[i] for " + (
            "every index" if report.complete else f"the first {report.checked} indices"
        )
    print(f"\ncontract: {where}, before collation", file=out)
    rows = [
        (path or "(sample)", *describe(signature), f"{count}/{report.checked}")
        for path, (signature, count) in report.references.items()
    ]
    print(format_table(("field", "type", "dtype", "shape", "samples"), rows), file=out)
    for violation in report.violations[:_SHOWN]:
        print(f"  VIOLATION {violation}", file=out)
    if len(report.violations) > _SHOWN:
        print(f"  ... and {len(report.violations) - _SHOWN} more violations", file=out)
    if not report.violations:
        print("  ok: every field has one type, dtype and shape", file=out)
    drawn = ", ".join(report.global_generators)
    reader = "the items draw" if stream else "dataset[i] draws"
    print(f"  global generators {reader} from: {drawn or 'none'}", file=out)


def _print_throughput(runs: dict[int, list[EpochRun]], out: TextIO) -> None:
    epochs = max(len(r) for r in runs.values())
    print(
        "\nthroughput: samples/s of each epoch, wall time including the audit's content digests;"
        "\n  excluded as warm-up: iter() and the first batch of each epoch (worker start-up)",
        file=out,
    )
    header = [
        "num_workers",
        *(f"epoch {e}" for e in range(1, epochs + 1)),
        "median",
        "warm-up excluded",
    ]
    rows = []
    for workers, epoch_runs in runs.items():
        rates = [run.samples_per_s for run in epoch_runs]
        known = [rate for rate in rates if rate is not None]
        rows.append(
            (
                workers,
                *(f"{rate:.1f}" if rate is not None else "n/a" for rate in rates),
                f"{statistics.median(known):.1f}" if known else "n/a",
                ", ".join(
                    f"{run.warmup_samples} samples/{run.warmup_s:.3f} s" for run in epoch_runs
                ),
            )
        )
    print(format_table(header, rows), file=out)
    if any(run.samples_per_s is None for r in runs.values() for run in r):
        print("  n/a: the epoch had a single batch, nothing left after the warm-up", file=out)


def run_audit(
    target: str,
    *,
    workers: list[int],
    epochs: int,
    batches: int | None,
    batch_size: int,
    seed: int,
    out: TextIO,
) -> int:
    """Run every check and print the report.

    Returns:
        0 when every check passed, 1 when any found a problem.

    Raises:
        AuditUsageError: the factory or its samples do not follow the documented form.
    """
    factory = load_factory(target)
    settings = [0, *(w for w in workers if w != 0)]
    print(f"audit-loader {target}", file=out)
    if 0 not in workers:
        print("  num_workers=0 added: it is the reference of the worker comparison", file=out)

    seed_cpu_generators(seed)
    first = build_target(factory, num_workers=0, batch_size=batch_size)
    if first.iterable:
        return _run_stream_audit(
            factory,
            first,
            settings=settings,
            epochs=epochs,
            batches=batches,
            batch_size=batch_size,
            seed=seed,
            out=out,
        )
    dataset_size = len(first.dataset)
    if dataset_size == 0:
        _close(first.loader)
        raise AuditUsageError(
            f"{target} gave an empty dataset (len 0): there is nothing to audit; "
            "return the dataset the training run reads"
        )
    origin = (
        f"a dataset; the audit loads it with batch_size={batch_size}, shuffle=False, no collation"
        if first.built_by_audit
        else f"a {type(first.loader).__name__} (batch_size={first.loader.batch_size})"
    )
    print(f"  factory returned {origin}; {dataset_size} samples", file=out)
    print(
        f"  settings: num_workers {settings}, {epochs} epochs, batches per epoch: {batches or 'all'}, seed {seed}",
        file=out,
    )

    per_batch = first.loader.batch_size or batch_size
    limit = dataset_size if batches is None else min(dataset_size, batches * per_batch)
    contract = check_contract(first.dataset, range(limit))
    contract.complete = limit == dataset_size
    _print_contract(contract, out)
    if contract.violations:
        _close(first.loader)
        print(
            f"\nresult: {len(contract.violations)} contract violation(s); loader runs skipped "
            "(collation would fail on them or hide them)",
            file=out,
        )
        return EXIT_CHECK_FAILED

    endless = is_endless(first.loader)
    _close(first.loader)
    runs, failures = _run_settings(
        factory, settings, epochs, batches, batch_size, seed, dataset_size
    )
    if failures:
        print("\nloading: a setting raised while iterating", file=out)
        print("\n".join(failures), file=out)
    if 0 not in runs:
        print(f"\nresult: {len(failures)} problem(s) found; the reference setting failed", file=out)
        return EXIT_CHECK_FAILED

    findings = compare_workers(runs, out)
    explain(
        findings,
        global_generators=contract.global_generators,
        resumable=bool(getattr(first.loader, "resumable", False)),
        out=out,
    )
    problems = len(failures) + findings.problems
    problems += check_epochs(runs, dataset_size, endless, out)
    problems += _resumes(factory, first, runs, settings, batches, batch_size, seed, out)
    _print_throughput(runs, out)
    print(f"\nresult: {'ok' if not problems else f'{problems} problem(s) found'}", file=out)
    return EXIT_CHECK_FAILED if problems else EXIT_OK


def _run_stream_audit(
    factory: Any,
    first: Target,
    *,
    settings: list[int],
    epochs: int,
    batches: int | None,
    batch_size: int,
    seed: int,
    out: TextIO,
) -> int:
    """The audit of an ``IterableDataset``: its items are identified by content."""
    loader = first.loader
    if first.built_by_audit:
        kind = type(loader).__name__
        how = ", resumable=True" if kind == "ResumableDataLoader" else ""
        origin = (
            f"an IterableDataset; the audit loads it with {kind}(batch_size={batch_size}{how}), "
            "no collation"
        )
    else:
        origin = (
            f"a {type(loader).__name__} (batch_size={loader.batch_size}) over an IterableDataset"
        )
    print(f"  factory returned {origin}", file=out)
    print(
        f"  settings: num_workers {settings}, {epochs} passes, batches per pass: {batches or 'all'}, seed {seed}",
        file=out,
    )
    _close(loader)
    # The contract reads a copy of its own: reading advances a stateful dataset.
    seed_cpu_generators(seed)
    reader = build_target(factory, num_workers=0, batch_size=batch_size)
    per_batch = reader.loader.batch_size or 1
    limit = None if batches is None else batches * per_batch
    contract = check_stream_contract(reader.dataset, limit)
    contract.complete = limit is None or contract.checked < limit
    _close(reader.loader)
    _print_contract(contract, out, stream=True)
    if contract.violations:
        print(
            f"\nresult: {len(contract.violations)} contract violation(s); loader runs skipped "
            "(collation would fail on them or hide them)",
            file=out,
        )
        return EXIT_CHECK_FAILED
    runs, failures = _run_settings(factory, settings, epochs, batches, batch_size, seed, None)
    if failures:
        print("\nloading: a setting raised while iterating", file=out)
        print("\n".join(failures), file=out)
    if 0 not in runs:
        print(f"\nresult: {len(failures)} problem(s) found; the reference setting failed", file=out)
        return EXIT_CHECK_FAILED
    drawn = contract.global_generators
    problems = len(failures)
    problems += compare_stream_workers(runs, by_content=not drawn, drawn=drawn, out=out)
    check_stream_passes(runs, by_content=not drawn, out=out)
    if first.refusal is not None:
        problems += 1
    problems += _resumes(factory, first, runs, settings, batches, batch_size, seed, out)
    _print_throughput(runs, out)
    print(f"\nresult: {'ok' if not problems else f'{problems} problem(s) found'}", file=out)
    return EXIT_CHECK_FAILED if problems else EXIT_OK


def _run_settings(
    factory: Any,
    settings: list[int],
    epochs: int,
    batches: int | None,
    batch_size: int,
    seed: int,
    dataset_size: int | None,
) -> tuple[dict[int, list[EpochRun]], list[str]]:
    """Each worker setting's passes, from a fresh target built and read under ``seed``."""
    runs: dict[int, list[EpochRun]] = {}
    failures: list[str] = []
    for workers_count in settings:
        seed_cpu_generators(seed)
        current = build_target(factory, num_workers=workers_count, batch_size=batch_size)
        seed_cpu_generators(seed)
        try:
            runs[workers_count] = run_epochs(
                current.loader, dataset_size=dataset_size, epochs=epochs, batches=batches
            )
        except AuditUsageError:
            raise
        except Exception as error:  # a loader that fails under one setting is a finding
            failures.append(
                f"  FAILED num_workers={workers_count}: {type(error).__name__}: {error}"
            )
        finally:
            _close(current.loader)
    return runs, failures


def _resumes(
    factory: Any,
    first: Target,
    runs: dict[int, list[EpochRun]],
    settings: list[int],
    batches: int | None,
    batch_size: int,
    seed: int,
    out: TextIO,
) -> int:
    """Resume checks with 0 workers and the most workers asked for; returns the problems."""
    reason = resumable_reason(first)
    if reason is not None:
        print(f"\nresume: not checked: {reason}", file=out)
        return 0
    checks = []
    for workers in sorted({0, max(settings)}):
        if workers not in runs or not runs[workers]:
            continue

        def build(workers: int = workers) -> Target:
            seed_cpu_generators(seed)
            return build_target(factory, num_workers=workers, batch_size=batch_size)

        checks.extend(check_resumes(build, workers, runs[workers][0], batches=batches))
    return print_resumes(checks, out)


def _close(loader: object) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
