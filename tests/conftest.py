"""Suite-wide settings: how many processes ``-n auto`` (pyproject's addopts) runs tests in,
the framework releases the run reports, and no process group left for a later test's
forked children."""

from __future__ import annotations

import gc
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest

# Many tests start processes of their own (ranks, loader workers, a paused and a resumed
# run): more than this many test processes only makes them wait for one another.
_MAX_TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, _MAX_TEST_PROCESSES))


# The frameworks the adapters read, as installed: CI installs their newest releases, and the
# log of every run says which ones its tests ran against.
_FRAMEWORKS = (
    "torch",
    "accelerate",
    "transformers",
    "pytorch-lightning",
    "nvidia-dali-cuda120",
)


def _framework_versions() -> str:
    found = []
    for name in _FRAMEWORKS:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return "frameworks: " + ", ".join(found)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Files with multi-process tests first, each file's tests in their order: ``--dist
    # loadfile`` hands out whole files in this order, and a long file handed out last
    # would leave the other test processes idle while it runs.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


def pytest_report_header(config: pytest.Config) -> str:
    return _framework_versions()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    # Also under -q, which leaves the header out.
    if config.get_verbosity() < 0:
        terminalreporter.write_line(_framework_versions())


def _gloo_threads() -> int:
    """The threads of gloo process groups alive in this process (Linux; 0 elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().startswith(("pt_gloo", "gloo"))
        except OSError:  # the thread ended meanwhile
            pass
    return count


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    # A process group a test destroyed but left in a reference cycle (DDP and FSDP
    # modules make them) lives on, with its threads, until a collection; a child a later
    # test forks would inherit it as garbage and, collecting it, block in its destructor.
    before = _gloo_threads()
    yield
    if _gloo_threads() > before:
        gc.collect()
