"""NVIDIA DALI integration (install the ``dali`` extra).

:class:`ResumableDALIIterator` iterates DALI pipelines like DALI's
``DALIGenericIterator`` and is returned from ``_resume_loaders()`` like any
resumable loader: the pause file holds DALI's checkpoint of every pipeline, and
``resume()`` rebuilds the pipelines from them. See ``docs/dali.md``.

Requires ``nvidia-dali`` >= 2.4 (``nvidia-dali-cuda120`` or another CUDA build), the
release this integration is tested with; it reads a few of DALI's internals, named in
:mod:`trainer_resume.adapters.dali.pipelines`.
"""

from __future__ import annotations

MIN_DALI = "2.4"

try:
    import nvidia.dali as _dali
    import nvidia.dali.plugin.pytorch as _dali_pytorch  # noqa: F401 - needed by the iterator
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainer_resume.adapters.dali needs NVIDIA DALI>="
        f"{MIN_DALI}: pip install 'trainer-resume[dali]'"
    ) from _exc

if tuple(int(part) for part in _dali.__version__.split(".")[:2]) < (2, 4):
    raise ImportError(
        f"trainer_resume.adapters.dali needs NVIDIA DALI>={MIN_DALI}, found {_dali.__version__}"
    )

from . import _fork  # noqa: E402, F401 - forked children never shut a pipeline down
from .iterator import ResumableDALIIterator  # noqa: E402

__all__ = ["MIN_DALI", "ResumableDALIIterator"]
