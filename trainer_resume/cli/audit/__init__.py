"""``trainer-resume audit-loader``: contract, worker, epoch and throughput checks of a loader."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from .._common import EXIT_CHECK_FAILED, EXIT_OK, format_table
from .contract import AuditUsageError, ContractReport, check_contract, describe
from .runs import EpochRun, build_target, is_endless, load_factory, run_epochs, seed_everything

__all__ = ["AuditUsageError", "run_audit"]

_SHOWN = 10  # findings listed per check; the rest are counted


def _ids_text(ids: Sequence[object]) -> str:
    shown = ", ".join(repr(i) for i in list(ids)[:_SHOWN])
    return shown + (f", ... ({len(ids) - _SHOWN} more)" if len(ids) > _SHOWN else "")


def _print_contract(report: ContractReport, out: TextIO) -> None:
    scope = "every index" if report.complete else f"the first {report.checked} indices"
    print(f"\ncontract: dataset[i] for {scope}, before collation", file=out)
    rows = [
        (path, *describe(signature), f"{count}/{report.checked}")
        for path, (signature, count) in report.references.items()
    ]
    print(format_table(("field", "type", "dtype", "shape", "samples"), rows), file=out)
    for violation in report.violations[:_SHOWN]:
        print(f"  VIOLATION {violation}", file=out)
    if len(report.violations) > _SHOWN:
        print(f"  ... and {len(report.violations) - _SHOWN} more violations", file=out)
    if not report.violations:
        print("  ok: every field has one type, dtype and shape", file=out)


def _first_difference(reference: list[EpochRun], other: list[EpochRun], attribute: str) -> str | None:
    for epoch, (left, right) in enumerate(zip(reference, other), start=1):
        a, b = getattr(left, attribute), getattr(right, attribute)
        for position, (x, y) in enumerate(zip(a, b)):
            if x != y:
                where = f"epoch {epoch}, position {position}"
                if attribute == "ids":
                    return f"{where}: id {x!r} vs {y!r}"
                return f"{where} (id {left.ids[position]!r})"
        if len(a) != len(b):
            return f"epoch {epoch}: {len(a)} vs {len(b)} samples"
    return None


def _compare_workers(runs: dict[int, list[EpochRun]], out: TextIO) -> int:
    reference = runs[0]
    print("\nworkers: each setting against num_workers=0 (same seed, position by position)", file=out)
    rows, problems = [], 0
    for workers, other in runs.items():
        if workers == 0:
            continue
        ids = _first_difference(reference, other, "ids")
        contents = None if ids else _first_difference(reference, other, "digests")
        problems += bool(ids) + bool(contents)
        rows.append(
            (
                workers,
                "same" if ids is None else f"DIFFER at {ids}",
                "not compared" if ids else ("same" if contents is None else f"DIFFER at {contents}"),
            )
        )
    if rows:
        print(format_table(("num_workers", "ids", "contents"), rows), file=out)
    else:
        print("  only num_workers=0 was run; nothing to compare", file=out)
    return problems


def _windows(epoch_runs: list[EpochRun], size: int, endless: bool) -> list[tuple[list, bool]]:
    """Per-epoch id lists with whether each is a complete epoch; an endless stream is
    cut into consecutive windows of ``size`` samples (its cycles)."""
    if not endless:
        return [(run.ids, run.ended) for run in epoch_runs]
    stream = [i for run in epoch_runs for i in run.ids]
    return [(stream[start : start + size], start + size <= len(stream)) for start in range(0, len(stream), size)]


def _check_epochs(runs: dict[int, list[EpochRun]], expected: list | None, size: int, endless: bool, out: TextIO) -> int:
    unit = f"window of {size} samples (the loader is endless)" if endless else "epoch"
    print(f"\nepochs: duplicates and gaps, per {unit}", file=out)
    rows, notes, problems = [], [], 0
    for workers, epoch_runs in runs.items():
        for number, (ids, complete) in enumerate(_windows(epoch_runs, size, endless), start=1):
            duplicates = sorted((i for i, n in Counter(ids).items() if n > 1), key=repr)
            if expected is not None and complete:
                delivered = set(ids)
                gaps = [i for i in expected if i not in delivered]
                gap_text = str(len(gaps))
            else:
                gaps, gap_text = [], "not checked (partial)"
            problems += bool(duplicates) + bool(gaps)
            rows.append((workers, number, len(ids), len(duplicates), gap_text))
            if duplicates:
                notes.append(f"  DUPLICATES num_workers={workers} epoch {number}: ids {_ids_text(duplicates)}")
            if gaps:
                notes.append(f"  GAPS num_workers={workers} epoch {number}: ids never delivered {_ids_text(gaps)}")
    print(format_table(("num_workers", "epoch", "samples", "duplicate ids", "gaps"), rows), file=out)
    for note in notes:
        print(note, file=out)
    reference = _windows(runs[0], size, endless)
    if len(reference) > 1:
        same = all(ids == reference[0][0] for ids, _ in reference[1:])
        print(f"  order: {'the same in every epoch' if same else 'differs between epochs (shuffled)'}", file=out)
    return problems


def _print_throughput(runs: dict[int, list[EpochRun]], out: TextIO) -> None:
    epochs = max(len(r) for r in runs.values())
    print(
        "\nthroughput: samples/s of each epoch, wall time including the audit's id and content digests;"
        "\n  excluded as warm-up: iter() and the first batch of each epoch (worker start-up)",
        file=out,
    )
    header = ["num_workers", *(f"epoch {e}" for e in range(1, epochs + 1)), "median", "warm-up excluded"]
    rows = []
    for workers, epoch_runs in runs.items():
        rates = [run.samples_per_s for run in epoch_runs]
        known = [rate for rate in rates if rate is not None]
        rows.append(
            (
                workers,
                *(f"{rate:.1f}" if rate is not None else "n/a" for rate in rates),
                f"{statistics.median(known):.1f}" if known else "n/a",
                ", ".join(f"{run.warmup_samples} samples/{run.warmup_s:.3f} s" for run in epoch_runs),
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

    seed_everything(seed)
    first = build_target(factory, num_workers=0, batch_size=batch_size)
    dataset_size = len(first.dataset)
    origin = (
        f"a dataset; the audit loads it with batch_size={batch_size}, shuffle=False"
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
            seed_everything(seed)
            current = build_target(factory, num_workers=workers_count, batch_size=batch_size)
        seed_everything(seed)
        try:
            runs[workers_count] = run_epochs(current.loader, dataset_size=dataset_size, epochs=epochs, batches=batches)
        except AuditUsageError:
            raise
        except Exception as error:  # a loader that fails under one setting is a finding
            failures.append(f"  FAILED num_workers={workers_count}: {type(error).__name__}: {error}")
        finally:
            _close(current.loader)
    if failures:
        print("\nloading: a setting raised while iterating", file=out)
        print("\n".join(failures), file=out)
    if 0 not in runs:
        print(f"\nresult: {len(failures)} problem(s) found; the reference setting failed", file=out)
        return EXIT_CHECK_FAILED

    problems = len(failures) + _compare_workers(runs, out)
    expected = contract.ids if contract.complete else None
    problems += _check_epochs(runs, expected, dataset_size, endless, out)
    _print_throughput(runs, out)
    print(f"\nresult: {'ok' if not problems else f'{problems} problem(s) found'}", file=out)
    return EXIT_CHECK_FAILED if problems else EXIT_OK


def _close(loader: object) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
