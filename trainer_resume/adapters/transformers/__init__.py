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

from .._release import tested_release

TRANSFORMERS_VERSIONS = (">=5.24", "<5.25")  # the tested range, as in the extra

tested_release(
    "transformers",
    adapter="transformers",
    extra="transformers",
    tested="5.24",
    below="5.25",
    reads=(
        "it overrides Trainer internals (_run_epoch, _maybe_log_save_evaluate, "
        "_init_training_state and the loss bookkeeping)"
    ),
)

from .trainer import ResumableTrainer  # noqa: E402

__all__ = ["ResumableTrainer", "TRANSFORMERS_VERSIONS"]
