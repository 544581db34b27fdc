"""``trainer-resume audit-loader``: its arguments and help."""

from __future__ import annotations

import argparse
import sys

from .._common import EXIT_STATUS_HELP, positive_int

NAME = "audit-loader"
HELP = "check a dataset or loader: sample contract, workers, epochs, resumes, speed"
DESCRIPTION = """\
Automate the usual loader checks. MODULE:FACTORY names a callable (MODULE is
imported with the current directory first on sys.path). It is called as
FACTORY(num_workers=W) when it has a num_workers parameter, else as FACTORY().
It returns either
  - a map-style dataset (__getitem__ and __len__): the audit loads it with
    torch's DataLoader(batch_size=--batch-size, shuffle=False, num_workers=W)
    and no collation, so samples are compared exactly as dataset[i] returns them;
  - an IterableDataset: the audit loads it with ResumableDataLoader(batch_size=
    --batch-size, num_workers=W, resumable=True) and no collation (with torch's
    DataLoader where that refuses it, which is then a finding); or
  - a torch DataLoader (a ResumableDataLoader too) over either; the factory must
    then take num_workers and build the loader with it.
A sample may be anything: a tensor, a tuple such as (image, label), a dict,
nested containers. It is identified by its dataset index (the audit tags each
dataset[i] on its way through the loader; the loader's collate_fn still gets the
bare samples), and compared whole, field by field; an IterableDataset's items,
which have no index, are identified by their content.

Checks:
  contract    dataset[i] (or an IterableDataset's items, read in this process)
              before collation: every field ([0] of a tuple, image of a dict,
              nested containers too) has one type, dtype and shape; each
              differing or failing sample is named by its index; and which
              global generators (torch, random, numpy) dataset[i] draws from
  workers     each worker count against num_workers=0, from the same seed: the
              same indices in the same order, the same samples (the first
              differing field is named), the same collated batches; the known
              causes of a difference are explained. For an IterableDataset: the
              same items, each delivered exactly once across the workers (by
              count only where the items draw from the global generators)
  epochs      duplicate indices and indices never delivered (gaps) in each epoch
              (an endless loader is cut into windows of len(dataset) samples);
              for an IterableDataset, the items and batches of each pass
  resume      for a loader with state_dict() and load_state_dict(), with 0 and
              the most workers asked for: a fresh loader from the factory loads
              the state taken after the first batch, mid-pass and at the first
              pass's end, and must deliver the uninterrupted run's batches
  throughput  samples/s of every epoch of every setting, and the median; the
              first batch of each epoch (worker start-up) is excluded and shown
"""
EPILOG = (
    """\
examples:
  trainer-resume audit-loader mypackage.data:make_dataset
  trainer-resume audit-loader mypackage.data:make_loader --workers 0,2,4 --epochs 3 --batches 50

"""
    + EXIT_STATUS_HELP
)


def _worker_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected non-negative worker counts, got {text!r}")
    return list(dict.fromkeys(values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="the factory to audit, e.g. mypackage.data:make_dataset",
    )
    parser.add_argument(
        "--workers",
        type=_worker_list,
        default=[0, 2],
        metavar="0,2,4",
        help="comma-separated worker counts to run and compare; 0 is always included (default: 0,2)",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=2,
        metavar="E",
        help="epochs per setting (default: 2)",
    )
    parser.add_argument(
        "--batches",
        type=positive_int,
        metavar="N",
        help="at most N batches per epoch; the contract check then reads the first "
        "N x batch size samples (default: whole epochs and every sample)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        metavar="B",
        help="batch size when the factory returns a dataset (default: 8)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of Python, NumPy and torch before each setting (default: 0)",
    )


def run(args: argparse.Namespace) -> int:
    from ..audit import run_audit

    return run_audit(
        args.target,
        workers=args.workers,
        epochs=args.epochs,
        batches=args.batches,
        batch_size=args.batch_size,
        seed=args.seed,
        out=sys.stdout,
    )
