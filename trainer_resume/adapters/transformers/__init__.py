"""Hugging Face ``transformers`` Trainer integration (install the ``transformers`` extra).

:class:`ResumableTrainer` is a ``transformers.Trainer`` with an exact pause and resume:
swap the class, pass ``pause_path``, and a SIGTERM pauses ``train()`` at the next
optimizer-step end; running the same command again continues bit-identically. See
``docs/transformers.md``.

Requires ``transformers`` 5.24 (``>=5.24,<5.25``): the trainer reads and overrides
Trainer internals (named in :mod:`trainer_resume.adapters.transformers.trainer` and
:mod:`trainer_resume.adapters.transformers.loop_state`), tested against that release only.
"""

from __future__ import annotations

TRANSFORMERS_VERSIONS = (">=5.24", "<5.25")  # the tested range, as in the extra

try:
    import transformers as _transformers
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainer_resume.adapters.transformers needs transformers 5.24: "
        "pip install 'trainer-resume[transformers]'"
    ) from _exc

# packaging comes with transformers, so it is imported once transformers is known present.
from packaging.version import Version as _Version  # noqa: E402

if not _Version("5.24") <= _Version(_transformers.__version__) < _Version("5.25"):
    raise ImportError(
        f"trainer_resume.adapters.transformers is tested with transformers 5.24 and found "
        f"{_transformers.__version__}: it overrides Trainer internals (_run_epoch, "
        "_maybe_log_save_evaluate, _init_training_state and the loss bookkeeping) that other "
        "releases may change; install 'transformers>=5.24,<5.25'"
    )

from .trainer import ResumableTrainer  # noqa: E402

__all__ = ["ResumableTrainer", "TRANSFORMERS_VERSIONS"]
