"""Whether this Python can hang a loader worker forked under gloo's threads.

CPython before 3.11.8 (and 3.10) can hang a child forked while another thread creates a
thread state (gh-112275), which gloo's threads do as they let go of DDP's works. A DDP
loop whose loader forks its workers at every epoch then hangs now and then (the
Accelerate DDP test did, twice, in CI). There the test loops fork their workers once,
before the first backward (``persistent_workers=True``), as docs/distributed.md tells
users of such a Python to do; on a fixed Python they fork them at every epoch.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["FORK_HANGS_UNDER_GLOO", "worker_options"]

FORK_HANGS_UNDER_GLOO = sys.version_info < (3, 11, 8)


def worker_options(workers: int) -> dict[str, Any]:
    """A DDP test loop's loader options for ``workers`` workers: forked once where a fork
    can hang (:data:`FORK_HANGS_UNDER_GLOO`), at every epoch elsewhere."""
    return {"num_workers": workers, "persistent_workers": workers > 0 and FORK_HANGS_UNDER_GLOO}
