"""PyTorch Lightning integration (install the ``lightning`` extra).

- :class:`ResumeCallback`: pause a ``Trainer.fit`` on a signal and resume it
  bit-identically with ``fit(ckpt_path=...)``.
- :class:`DurableCheckpointIO`: a ``CheckpointIO`` plugin that writes every
  checkpoint durably and loads it verified and weights-only.
- :func:`load_from_checkpoint` and :func:`plain_lightning_checkpoint`: read those
  files as Lightning's ``load_from_checkpoint`` and a plain checkpoint dict.

Requires ``pytorch_lightning`` >= 2.5.3, the first release with Lightning's own
fixes to resumed loop counters (2.5.0) and to the double iteration on resume
(2.5.3). This is the ``pytorch_lightning`` package; the unified ``lightning``
package has its own class hierarchy and is not supported.
"""

from __future__ import annotations

MIN_PYTORCH_LIGHTNING = "2.5.3"

try:
    import pytorch_lightning as _pl
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainer_resume.adapters.lightning needs pytorch_lightning>="
        f"{MIN_PYTORCH_LIGHTNING}: pip install 'trainer-resume[lightning]'"
    ) from _exc

# packaging comes with pytorch_lightning, so it is imported once Lightning is known present.
from packaging.version import Version as _Version  # noqa: E402

if _Version(_pl.__version__).release < _Version(MIN_PYTORCH_LIGHTNING).release:
    raise ImportError(
        f"trainer_resume.adapters.lightning needs pytorch_lightning>={MIN_PYTORCH_LIGHTNING}, "
        f"found {_pl.__version__} (earlier releases lack Lightning's own fixes to resumed loop counters, 2.5.0, "
        "and to the double iteration on resume, 2.5.3)"
    )

from ...checkpoint_files.lightning import plain_lightning_checkpoint  # noqa: E402
from .callback import ResumeCallback  # noqa: E402
from .io import DurableCheckpointIO  # noqa: E402
from .loading import load_from_checkpoint  # noqa: E402
from .points import ResumePointsCallback  # noqa: E402

# The names docs/lightning.md documents; the constants stay in their own modules
# (checkpoint_files.lightning, callback) and the schema in trainer_resume.state.
__all__ = [
    "ResumeCallback",
    "ResumePointsCallback",
    "DurableCheckpointIO",
    "load_from_checkpoint",
    "plain_lightning_checkpoint",
]
