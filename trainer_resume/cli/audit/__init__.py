"""``trainer-resume audit-loader``: contract, worker, epoch and throughput checks of a loader."""

from __future__ import annotations

import statistics
from typing import TextIO

from ...rng import seed_cpu_generators
from .._common import EXIT_CHECK_FAILED, EXIT_OK, format_table
from .compare import check_epochs, compare_workers, explain
from .contract import AuditUsageError, ContractReport, check_contract, describe
from .runs import EpochRun, build_target, is_endless, load_factory, run_epochs

__all__ = ["AuditUsageError", "run_audit"]

_SHOWN = 10  # contract violations listed; the rest are counted


def _print_contract(report: ContractReport, out: TextIO) -> None:
    scope = "every index" if report.complete else f"the first {report.checked} indices"
    print(f"\ncontract: dataset[i] for {scope}, before collation", file=out)
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
    print(f"  global generators dataset[i] draws from: {drawn or 'none'}", file=out)


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
    dataset_size = len(first.dataset)
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

    runs: dict[int, list[EpochRun]] = {}
    failures: list[str] = []
    endless = is_endless(first.loader)
    for workers_count in settings:
        current = first if workers_count == 0 else None
        if current is None:
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
    _print_throughput(runs, out)
    print(f"\nresult: {'ok' if not problems else f'{problems} problem(s) found'}", file=out)
    return EXIT_CHECK_FAILED if problems else EXIT_OK


def _close(loader: object) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
