"""Cost of a durable, verified save compared with a plain ``torch.save`` + fsync.

Each measurement runs in a fresh child process: it builds a float32 state dict of
``--size-mib`` MiB, records its peak RSS (the baseline), saves the state once to
``--dir`` and reports the time and how far the peak RSS rose above the baseline.
A streaming save stays near zero; a save that serializes into memory first would
rise by about the state size.

    python -m benchmarks.durable_save --size-mib 1024 --repeats 3

Prints a table and writes benchmarks/out/durable_save.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TENSOR_MIB = 128
METHODS = {
    "torch.save(path) + fsync": "torch_path",
    "torch.save(file) + fsync": "torch_file",
    "save_checkpoint": "durable",
    "save_checkpoint(key=...)": "durable_signed",
    # Control: serializing into memory first must show up as ~state size above baseline.
    "torch.save(BytesIO) + write + fsync": "in_memory",
}
REFERENCE = "torch.save(path) + fsync"


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes vs KiB


def _build_state(size_mib: int) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"step": 1000}
    remaining = size_mib << 20
    index = 0
    while remaining > 0:
        nbytes = min(TENSOR_MIB << 20, remaining)
        # empty + fill_ touches every page without a temporary the size of the tensor
        state[f"layer{index}.weight"] = torch.empty(nbytes // 4, dtype=torch.float32).fill_(
            index + 0.5
        )
        remaining -= nbytes
        index += 1
    return state


def _child(method: str, size_mib: int, target: str) -> None:
    import torch

    from trainer_resume.durable import save_checkpoint

    state = _build_state(size_mib)
    baseline = _peak_rss_mib()
    start = time.perf_counter()
    if method == "torch_path":
        torch.save(state, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    elif method == "torch_file":
        with open(target, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
    elif method == "in_memory":
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with open(target, "wb") as file:
            file.write(buffer.getbuffer())
            file.flush()
            os.fsync(file.fileno())
    elif method == "durable":
        save_checkpoint(state, target)
    elif method == "durable_signed":
        save_checkpoint(state, target, key=b"benchmark signing key")
    else:
        raise ValueError(f"unknown method {method!r}")
    seconds = time.perf_counter() - start
    peak = _peak_rss_mib()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "baseline_rss_mib": baseline,
                "peak_rss_above_baseline_mib": peak - baseline,
                "file_bytes": os.path.getsize(target),
            }
        )
    )


def _measure(method: str, size_mib: int, directory: Path) -> dict[str, Any]:
    target = directory / f"bench-{method}.pt"
    command = [
        sys.executable,
        "-m",
        "benchmarks.durable_save",
        "--child",
        method,
        "--size-mib",
        str(size_mib),
        "--dir",
        str(directory),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{method} child failed:\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        target.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mib", type=int, default=1024, help="state size in MiB (default 1024)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="measurements per method (default 3)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where files are written (default: a temp dir under the current directory)",
    )
    parser.add_argument("--child", choices=sorted(METHODS.values()), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        _child(args.child, args.size_mib, str(args.dir / f"bench-{args.child}.pt"))
        return

    owned = args.dir is None
    directory = (
        Path(tempfile.mkdtemp(prefix=".durable-save-bench-", dir=os.getcwd()))
        if owned
        else args.dir
    )
    directory.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in METHODS}
    try:
        for repeat in range(args.repeats):
            order = (
                list(METHODS) if repeat % 2 == 0 else list(reversed(METHODS))
            )  # no method always goes first
            for name in order:
                runs[name].append(_measure(METHODS[name], args.size_mib, directory))
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)

    reference = statistics.median(run["seconds"] for run in runs[REFERENCE])
    results = {}
    for name, measured in runs.items():
        median = statistics.median(run["seconds"] for run in measured)
        results[name] = {
            "seconds": [run["seconds"] for run in measured],
            "median_seconds": median,
            "ratio_to_reference": median / reference,
            "max_peak_rss_above_baseline_mib": max(
                run["peak_rss_above_baseline_mib"] for run in measured
            ),
            "baseline_rss_mib": statistics.median(run["baseline_rss_mib"] for run in measured),
            "file_bytes": measured[0]["file_bytes"],
        }

    print(
        f"state: {args.size_mib} MiB float32 in {TENSOR_MIB} MiB tensors; "
        f"{args.repeats} fresh-process runs per method; files in {directory}"
    )
    header = f"{'method':<36}{'median s':>10}{'ratio':>8}{'peak RSS above baseline':>26}{'state MiB':>11}"
    print(header)
    print("-" * len(header))
    for name, result in results.items():
        print(
            f"{name:<36}{result['median_seconds']:>10.2f}{result['ratio_to_reference']:>8.2f}"
            f"{result['max_peak_rss_above_baseline_mib']:>22.1f} MiB{args.size_mib:>11}"
        )

    import torch

    out = Path(__file__).resolve().parent / "out" / "durable_save.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "durable_save",
                "size_mib": args.size_mib,
                "repeats": args.repeats,
                "reference": REFERENCE,
                "directory": str(directory),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
