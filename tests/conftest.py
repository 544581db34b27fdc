"""Suite-wide settings: how many processes ``-n auto`` (pyproject's addopts) runs tests in."""

from __future__ import annotations

import os

import pytest

# Many tests start processes of their own (ranks, loader workers, a paused and a resumed
# run): more than this many test processes only makes them wait for one another.
_MAX_TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, _MAX_TEST_PROCESSES))
