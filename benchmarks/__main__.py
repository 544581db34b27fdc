"""``python -m benchmarks``: run the benchmark suite and write benchmarks/RESULTS.md (see benchmarks/run.py)."""

from __future__ import annotations

import sys

from benchmarks.run import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m benchmarks"))
