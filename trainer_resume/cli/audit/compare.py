"""What the audit concludes from the recorded runs: worker settings against ``num_workers=0``,
duplicates and gaps per epoch, and the known causes of the differences it finds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from .._common import format_table
from .contract import field_name
from .runs import EpochRun

__all__ = ["WorkerFindings", "check_epochs", "compare_workers", "explain"]

_SHOWN = 10  # findings listed per check; the rest are counted


@dataclass
class WorkerFindings:
    """Which kinds of difference the worker comparison found (they decide the explanations)."""

    order: list[int] = field(default_factory=list)  # worker counts whose sample order differs
    contents: list[int] = field(default_factory=list)  # ... whose samples differ for the same index
    collation: list[int] = field(default_factory=list)  # ... whose collated batches differ

    @property
    def problems(self) -> int:
        return len(self.order) + len(self.contents) + len(self.collation)


def _order_difference(reference: list[EpochRun], other: list[EpochRun]) -> str | None:
    for epoch, (left, right) in enumerate(zip(reference, other), start=1):
        for position, (a, b) in enumerate(zip(left.indices, right.indices)):
            if a != b:
                return f"epoch {epoch}, position {position}: index {a} vs {b}"
        if len(left.indices) != len(right.indices):
            return f"epoch {epoch}: {len(left.indices)} vs {len(right.indices)} samples"
    return None


def _field_difference(expected: dict[str, str], found: dict[str, str]) -> str:
    for path, digest in expected.items():
        if found.get(path) != digest:
            return (
                f"{field_name(path)} differs" if path in found else f"{field_name(path)} is missing"
            )
    extra = next(path for path in found if path not in expected)
    return f"{field_name(extra)} is extra"


def _contents_difference(reference: list[EpochRun], other: list[EpochRun]) -> str | None:
    # Samples are matched by index within each epoch (the n-th delivery of an index with
    # the n-th), so contents are compared even where the order differs.
    for epoch, (left, right) in enumerate(zip(reference, other), start=1):
        theirs: dict[int, list[dict[str, str]]] = {}
        for index, sample in zip(right.indices, right.samples):
            theirs.setdefault(index, []).append(sample)
        for position, (index, sample) in enumerate(zip(left.indices, left.samples)):
            deliveries = theirs.get(index)
            found = deliveries.pop(0) if deliveries else None
            if found is not None and found != sample:
                where = f"epoch {epoch}, position {position} (index {index})"
                return f"{where}: {_field_difference(sample, found)}"
    return None


def _collation_difference(reference: list[EpochRun], other: list[EpochRun]) -> str | None:
    for epoch, (left, right) in enumerate(zip(reference, other), start=1):
        for number, (a, b) in enumerate(zip(left.batch_digests, right.batch_digests)):
            if a != b and left.batch_indices[number] == right.batch_indices[number]:
                return (
                    f"epoch {epoch}, batch {number}: collate_fn output differs for the same samples"
                )
    return None


def compare_workers(runs: dict[int, list[EpochRun]], out: TextIO) -> WorkerFindings:
    """Print each worker setting against ``num_workers=0``: order, samples, collated batches."""
    reference = runs[0]
    print(
        "\nworkers: each setting against num_workers=0 (same seed); samples are matched by index",
        file=out,
    )
    findings = WorkerFindings()
    rows = []
    for workers, other in runs.items():
        if workers == 0:
            continue
        order = _order_difference(reference, other)
        contents = _contents_difference(reference, other)
        collation = None if contents else _collation_difference(reference, other)
        for found, kind in ((order, findings.order), (contents, findings.contents)):
            if found:
                kind.append(workers)
        if collation:
            findings.collation.append(workers)
        rows.append(
            (
                workers,
                "same" if order is None else f"DIFFER at {order}",
                "same" if contents is None else f"DIFFER at {contents}",
                "same" if collation is None else "DIFFER",
            )
        )
        if collation:
            print(f"  num_workers={workers}: {collation}", file=out)
    if rows:
        print(format_table(("num_workers", "order", "samples", "batches"), rows), file=out)
    else:
        print("  only num_workers=0 was run; nothing to compare", file=out)
    return findings


_ORDER_FROM_AUGMENTATION = (
    "order: dataset[i] draws from torch's global generator (seen in the contract check).",
    "At num_workers=0 it runs in the main process, where the same generator also seeds",
    "the shuffle: a sampler without its own generator draws each epoch's permutation",
    "from it at iter(), so the augmentation of one epoch changes the order of the next,",
    "and the order depends on the number of workers. Fix: give the loader its own",
    "generator (DataLoader(generator=torch.Generator().manual_seed(s))), or use",
    "ResumableDataLoader.",
)
_ORDER_UNSEEDED = (
    "order: the sampler's order is not a fixed function of the seed: it draws from a",
    "generator that something else in the main process also draws from. Fix: give the",
    "loader its own generator, or use ResumableDataLoader with a resumable sampler.",
)
_SAMPLES_FROM_WORKER_RNG = (
    "samples: dataset[i] draws from the global generator(s) {drawn}. In a worker these",
    "are seeded per worker from a base seed drawn at iter(), so the draws depend on the",
    "number of workers and on which worker fetched the sample, and a resumed run does",
    "not replay them. Fix: ResumableDataLoader seeds every sample from its position in",
    "the stream, the same in the main process and in any worker.",
)
_SAMPLES_UNSEEDED = (
    "samples: dataset[i] depends on something the loader does not seed: a generator",
    "object the dataset owns (numpy.random.default_rng(), torch.Generator), the time,",
    "files or a service. Draw from Python random, NumPy's global generator or torch's,",
    "which ResumableDataLoader seeds per sample.",
)
_BATCHES_UNSEEDED = (
    "batches: collate_fn draws randomness (e.g. mixup) that depends on the worker.",
    "ResumableDataLoader seeds collate_fn per batch.",
)


def _print_cause(lines: Sequence[str], out: TextIO, **values: str) -> None:
    first, *rest = (line.format(**values) for line in lines)
    print(f"  - {first}", file=out)
    for line in rest:
        print(f"    {line}", file=out)


def explain(
    findings: WorkerFindings, *, global_generators: Sequence[str], resumable: bool, out: TextIO
) -> None:
    """Print the known causes that fit what the comparison found."""
    if not findings.problems:
        return
    print("\nknown causes:", file=out)
    if findings.order:
        from_augmentation = "torch" in global_generators
        _print_cause(_ORDER_FROM_AUGMENTATION if from_augmentation else _ORDER_UNSEEDED, out)
    if findings.contents:
        from_workers = bool(global_generators) and not resumable
        drawn = ", ".join(global_generators)
        _print_cause(
            _SAMPLES_FROM_WORKER_RNG if from_workers else _SAMPLES_UNSEEDED, out, drawn=drawn
        )
    if findings.collation:
        _print_cause(_BATCHES_UNSEEDED, out)


def _windows(epoch_runs: list[EpochRun], size: int, endless: bool) -> list[tuple[list[int], bool]]:
    """Per-epoch index lists with whether each is a complete epoch; an endless stream is
    cut into consecutive windows of ``size`` samples (its cycles)."""
    if not endless:
        return [(run.indices, run.ended) for run in epoch_runs]
    stream = [i for run in epoch_runs for i in run.indices]
    return [
        (stream[start : start + size], start + size <= len(stream))
        for start in range(0, len(stream), size)
    ]


def _indices_text(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in list(indices)[:_SHOWN])
    more = len(indices) - _SHOWN
    return shown + (f", ... ({more} more)" if more > 0 else "")


def check_epochs(runs: dict[int, list[EpochRun]], size: int, endless: bool, out: TextIO) -> int:
    """Print duplicates and gaps per epoch and whether the order changes; returns the problems."""
    unit = f"window of {size} samples (the loader is endless)" if endless else "epoch"
    print(f"\nepochs: duplicates and gaps, per {unit}", file=out)
    rows, notes, problems = [], [], 0
    for workers, epoch_runs in runs.items():
        for number, (indices, complete) in enumerate(_windows(epoch_runs, size, endless), start=1):
            duplicates = sorted(i for i, n in Counter(indices).items() if n > 1)
            if complete:
                delivered = set(indices)
                gaps = [i for i in range(size) if i not in delivered]
                gap_text = str(len(gaps))
            else:
                gaps, gap_text = [], "not checked (partial)"
            problems += bool(duplicates) + bool(gaps)
            rows.append((workers, number, len(indices), len(duplicates), gap_text))
            where = f"num_workers={workers} epoch {number}"
            if duplicates:
                notes.append(f"  DUPLICATES {where}: indices {_indices_text(duplicates)}")
            if gaps:
                notes.append(f"  GAPS {where}: indices never delivered {_indices_text(gaps)}")
    header = ("num_workers", "epoch", "samples", "duplicate indices", "gaps")
    print(format_table(header, rows), file=out)
    for note in notes:
        print(note, file=out)
    reference = _windows(runs[0], size, endless)
    if len(reference) > 1:
        same = all(indices == reference[0][0] for indices, _ in reference[1:])
        print(
            "  order: "
            + ("the same in every epoch" if same else "differs between epochs (shuffled)"),
            file=out,
        )
    return problems
