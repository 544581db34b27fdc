"""Lightning checkpoints as plain data: recognising them and writing them for Lightning's own tools.

A Lightning checkpoint is the dict ``Trainer.save_checkpoint`` writes
(``"state_dict"``, ``"pytorch-lightning_version"``, ``"global_step"``, ``"epoch"``,
``"loops"``, ``"optimizer_states"``...). trainer-resume stores it in its verified
file format (``DurableCheckpointIO``, ``ResumeCallback``'s pause file, which adds
the ``"trainer_resume"`` entry), which ``torch.load`` and
``LightningModule.load_from_checkpoint`` cannot open. :func:`write_plain_checkpoint`
verifies such a file and writes the same dict as a plain ``torch.save`` file that
they can; :func:`plain_lightning_checkpoint` returns the dict Lightning itself would
have written (OmegaConf hyper-parameters rebuilt as configs), for loading in memory.

This module does not import ``pytorch_lightning``: the files are plain data, so the
command line can describe and convert them where Lightning is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..durable import load_checkpoint
from ..errors import CheckpointFormatError
from ..storage.paths import save_plain_torch_file
from .hparams import rebuilt_hyperparameters

__all__ = [
    "LIGHTNING_PAUSE_FORMAT",
    "PAUSE_KEY",
    "is_lightning_checkpoint",
    "plain_checkpoint",
    "plain_lightning_checkpoint",
    "save_plain_checkpoint",
    "write_plain_checkpoint",
]

PAUSE_KEY = "trainer_resume"  # the entry a pause file adds to Lightning's checkpoint
LIGHTNING_PAUSE_FORMAT = "trainer_resume.lightning_pause/1"
_VERSION_KEY = (
    "pytorch-lightning_version"  # written by every Trainer.save_checkpoint / dump_checkpoint
)


def is_lightning_checkpoint(content: Any) -> bool:
    """Whether ``content`` is a checkpoint dict written by a Lightning ``Trainer``."""
    return isinstance(content, Mapping) and _VERSION_KEY in content and "state_dict" in content


def plain_checkpoint(content: Any, source: str) -> dict[str, Any]:
    """Return the loaded Lightning checkpoint ``content`` as the dict Lightning reads.

    Everything is kept, the pause entry included (plain data: Lightning ignores it,
    and ``ResumeCallback`` still resumes exactly from the plain file).

    Raises:
        CheckpointFormatError: ``content`` is not a Lightning checkpoint (321).
    """
    if not is_lightning_checkpoint(content):
        raise CheckpointFormatError(
            f"{source} is not a Lightning checkpoint (no {_VERSION_KEY!r} and 'state_dict' entries)"
        )
    return dict(content)


def save_plain_checkpoint(checkpoint: Mapping[str, Any], out: str | os.PathLike[str]) -> None:
    """Write ``checkpoint`` to ``out`` as a plain ``torch.save`` file, durably.

    Temp file next to ``out``, fsync, atomic replace, directory fsync: a failure
    leaves the previous ``out`` intact.

    Raises:
        CheckpointWriteError: writing failed (327); the cause is chained.
    """
    save_plain_torch_file(checkpoint, out)


def write_plain_checkpoint(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, key: bytes | None = None
) -> None:
    """Verify the trainer-resume Lightning file ``path``; write it to ``out`` as a plain checkpoint.

    The result loads with ``torch.load(out, weights_only=True)``,
    ``LightningModule.load_from_checkpoint(out)`` and ``Trainer.fit(ckpt_path=out)``
    without trainer-resume.

    Args:
        path: A pause file of ``ResumeCallback`` or a file written by ``DurableCheckpointIO``.
        out: The plain checkpoint to write (replaced atomically).
        key: The signing key, when the file is signed; its signature is then verified.

    Raises:
        CheckpointFormatError: ``path`` is not a trainer-resume Lightning file (321).
        CheckpointCorruptedError, CheckpointSignatureError, UnsafeCheckpointError:
            as :func:`trainer_resume.load_checkpoint` (322, 339, 328).
        CheckpointWriteError: writing ``out`` failed (327).
    """
    source = os.fspath(path)
    save_plain_checkpoint(plain_checkpoint(load_checkpoint(source, key=key), source), out)


def plain_lightning_checkpoint(
    path: str | os.PathLike[str], *, key: bytes | None = None, map_location: Any = "cpu"
) -> dict[str, Any]:
    """Read a pause file or ``DurableCheckpointIO`` file as the checkpoint dict Lightning wrote.

    The file is verified (its signature too, with ``key``) and loaded weights-only;
    OmegaConf hyper-parameters, stored as plain containers, are rebuilt as
    ``DictConfig``/``ListConfig`` with their ``hparams_type``, as Lightning's own
    checkpoint holds them. Everything else is kept, the pause entry included.

    Args:
        path: The file.
        key: The signing key the file was written with, if any.
        map_location: As for ``torch.load``.

    Returns:
        Lightning's checkpoint dict (``state_dict``, ``optimizer_states``, ``loops``...).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: not a trainer-resume Lightning file (321).
        CheckpointCorruptedError, CheckpointSignatureError, UnsafeCheckpointError:
            as :func:`trainer_resume.load_checkpoint` (322, 339, 328).
    """
    source = os.fspath(path)
    loaded = load_checkpoint(source, map_location=map_location, key=key)
    return rebuilt_hyperparameters(plain_checkpoint(loaded, source))
