"""A forked worker leaves what it inherited to its parent's garbage collector.

Objects the parent's garbage collector had not reached when a child forked (a cycle
that became garbage since the last collection) are garbage in the child too, and a
collection there runs their destructors in a process without the threads they refer
to: a ``torch.distributed`` process group left in a cycle after
``destroy_process_group()`` blocks the child forever in its destructor
(``~ProcessGroupGloo`` waits in ``pthread_cond_destroy`` for run-loop threads that exist
in the parent only). A child forked by a thread inside :func:`frozen_in_forked_children`
freezes everything it inherited (``gc.freeze()``, first thing in the child, in an
``os.register_at_fork`` hook): none of it is collected there, which also keeps the
memory it shares with its parent shared; what the child makes is collected as usual.
The parent's collector is left as it is.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_in_forked_children"]

_forking = threading.local()  # .active: this thread is inside the block


@contextmanager
def frozen_in_forked_children() -> Iterator[None]:
    """Children forked by the calling thread inside the block freeze what they inherit."""
    previous = getattr(_forking, "active", False)
    _forking.active = True
    try:
        yield
    finally:
        _forking.active = previous


def _after_fork_in_child() -> None:
    if getattr(_forking, "active", False):
        _forking.active = False  # the child's own children are not frozen through this block
        gc.freeze()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
