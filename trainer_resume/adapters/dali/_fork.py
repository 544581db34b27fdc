"""DALI pipelines in a forked child process: left alone there, never shut down.

A pipeline's backend runs threads of the process that built it. A child forked from
that process (a ``DataLoader`` worker under the ``fork`` start method, any
``os.fork()``) has none of them, and shutting the backend down there waits for them
forever: ``Pipeline.__del__`` does when the child frees a pipeline (one the parent
held only through garbage, or through objects the child drops), and so does the
backend's own destructor. After a fork, each live pipeline is detached from its
backend in the child, and the backend is kept alive for the child's lifetime, so the
child never touches it; the parent's pipelines are unaffected.

DALI internals used (DALI 2.4): ``Pipeline._pipes`` (weak references to the live
pipelines) and ``Pipeline._pipe`` (the backend).
"""

from __future__ import annotations

import ctypes
import os

from nvidia.dali.pipeline import Pipeline

__all__ = ["detach_backends_in_child"]


def detach_backends_in_child() -> None:
    """Detach every live pipeline from its backend, which stays alive (run in a forked child)."""
    for reference in list(getattr(Pipeline, "_pipes", ())):
        pipeline = reference()
        backend = getattr(pipeline, "_pipe", None)
        if backend is None:
            continue
        # One reference never released: the backend's destructor would wait for threads
        # this process does not have, at any point up to and including interpreter exit.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))
        pipeline._pipe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=detach_backends_in_child)
