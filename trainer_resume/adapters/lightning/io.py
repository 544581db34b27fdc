"""Durable, verified checkpoint files for PyTorch Lightning.

:class:`DurableCheckpointIO` is a Lightning ``CheckpointIO`` plugin that writes every
checkpoint the Trainer saves (``ModelCheckpoint``'s, ``Trainer.save_checkpoint``'s)
through :func:`trainer_resume.durable.save_checkpoint` and reads it back through
:func:`trainer_resume.durable.load_checkpoint`: temp file in the target directory,
fsync, atomic replace, directory fsync on write; marker, length and SHA-256 checked
before a single byte is unpickled, and unpickling is weights-only, on read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_fabric.utilities.cloud_io import get_filesystem

from ...checkpoint_files.hparams import plain_hyperparameters, rebuilt_hyperparameters
from ...checks.weights_only import refused_entry
from ...durable import load_checkpoint, save_checkpoint, validate_key
from ...errors import CheckpointFormatError, UnsafeCheckpointError
from ...storage import paths
from ...storage.urls import set_storage_options

__all__ = [
    "DurableCheckpointIO",
    "PauseFileReader",
    "RunFiles",
    "check_loadable",
    "lightning_checkpoint",
]

log = logging.getLogger(__name__)


class DurableCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that never loses the last good checkpoint.

    Use it as ``Trainer(plugins=[DurableCheckpointIO()])``. A crash or ``SIGKILL``
    while a checkpoint is being written leaves the previous file at that path
    intact. Loading is always weights-only. OmegaConf hyper-parameters
    (``save_hyperparameters(cfg)`` with a ``DictConfig``) are stored as plain
    containers and rebuilt as OmegaConf configs on load; any other object outside
    the weights-only set is refused with ``UnsafeCheckpointError`` (328) when the
    file is *written*, naming the entry, so that no file is written that could not
    be loaded.

    Files are written in trainer-resume's checkpoint format (a verified header in
    front of a ``torch.save`` archive), so read them with this plugin or with
    :func:`trainer_resume.durable.load_checkpoint`, not with a bare ``torch.load``.
    A path may be an fsspec URL (``s3://...``): the object appears whole or not at all
    (docs/cloud-storage.md).

    Args:
        key: Optional signing key (bytes, at least 16). Every file is then signed
            and loading verifies the signature, so tampering is detected, not only
            accidental damage.

    Raises:
        TypeError, ValueError: ``key`` is not bytes of at least 16.
    """

    def __init__(self, *, key: bytes | None = None) -> None:
        super().__init__()
        self._key = validate_key(key)

    @property
    def key(self) -> bytes | None:
        """The signing key given at construction (files written next to these use it too)."""
        return self._key

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """Write ``checkpoint`` to ``path`` durably; the previous file survives any failure.

        Raises:
            StorageURLError: ``path`` is a URL whose scheme nothing installed reads (353).
            (``storage_options`` apply to every path under ``path``'s URL from then on.)
            UnsafeCheckpointError: ``checkpoint`` holds an object that weights-only
                loading would refuse (328); nothing was written.
            CheckpointWriteError: Writing failed (327); the previous file is intact.
        """
        target = _path(path)
        if storage_options is not None:
            set_storage_options(target, storage_options)
        plain = plain_hyperparameters(checkpoint)
        check_loadable(plain, where=target)
        # Lightning's own IO creates the directory too; ModelCheckpoint relies on it.
        paths.make_parent_directory(target)
        save_checkpoint(plain, target, key=self._key)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Verify and load a checkpoint written by this plugin.

        Args:
            path: The checkpoint file.
            map_location: Passed to ``torch.load``; ``None`` loads onto the CPU (as
                Lightning's default IO does).
            weights_only: ``None`` or ``True``. Loading is always weights-only;
                ``False`` is refused rather than silently ignored.

        Raises:
            ValueError: ``weights_only=False`` was asked for.
            FileNotFoundError: ``path`` does not exist.
            CheckpointFormatError: Not a trainer-resume checkpoint, or it does not
                hold a dict (321).
            CheckpointCorruptedError: Truncated or altered bytes (322).
            CheckpointSignatureError: A key is set and the signature is missing or wrong (339).
            UnsafeCheckpointError: The file holds objects outside the weights-only set (328).
        """
        if weights_only is False:
            raise ValueError(
                f"{type(self).__name__} loads weights-only and never unpickles arbitrary objects; "
                "store plain values in the checkpoint or allow specific classes with "
                "torch.serialization.add_safe_globals"
            )
        target = _path(path)
        location = "cpu" if map_location is None else map_location
        return lightning_checkpoint(
            load_checkpoint(target, map_location=location, key=self._key), target
        )

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Remove a checkpoint file, as Lightning's ``TorchCheckpointIO`` does."""
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)
            log.debug(f"Removed checkpoint: {path}")


# What a fit checks of a checkpoint Lightning is about to restore: (checkpoint, path).
RestoreCheck = Callable[[dict[str, Any], str], None]


class RunFiles:
    """The run's own files a fit may resume from: read durably, each with its key.

    A file already read and verified (a resume point chosen by its contents) is
    handed over once, so it is not read a second time, nor lost if a running
    writer's retention removes it in between.
    """

    def __init__(self) -> None:
        self._files: dict[str, tuple[bytes | None, dict[str, Any] | None]] = {}

    def add(
        self,
        path: str | os.PathLike[str],
        *,
        key: bytes | None,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        """Read ``path`` durably with ``key``; ``checkpoint``: its contents, already verified."""
        self._files[_file_key(path)] = (key, checkpoint)

    def clear(self) -> None:
        self._files.clear()

    def take(
        self, path: str | os.PathLike[str]
    ) -> tuple[bytes | None, dict[str, Any] | None] | None:
        """``(key, checkpoint read before)`` of a run file (the checkpoint only once), else ``None``."""
        try:
            real = _file_key(path)
        except TypeError:
            return None
        entry = self._files.get(real)
        if entry is not None and entry[1] is not None:
            self._files[real] = (entry[0], None)
        return entry


class PauseFileReader(CheckpointIO):
    """The checkpoint IO of a fit with a ``ResumeCallback``: the run's files read durably,
    every loaded checkpoint checked before Lightning restores anything from it.

    :class:`~trainer_resume.adapters.lightning.ResumeCallback` installs it around the
    trainer's own IO (a :class:`DurableCheckpointIO` included) for the duration of
    ``fit``: ``fit(ckpt_path=<pause file or resume point>)`` reads the verified file,
    the user's ``ModelCheckpoint`` files keep the format of the user's own IO, and
    whatever Lightning loads is refused (``check``) while the LightningModule is
    still untouched: Lightning restores the module before any callback hears of the
    checkpoint.
    """

    def __init__(
        self, inner: CheckpointIO, files: RunFiles, check: RestoreCheck | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self._files = files
        self._check = check

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """Delegate to the trainer's own IO."""
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Read a run file durably, anything else through the trainer's own IO; then check it."""
        entry = self._files.take(path)
        if entry is not None:
            key, read_before = entry
            if read_before is not None:
                checkpoint = lightning_checkpoint(read_before, os.fspath(path))
            else:
                checkpoint = DurableCheckpointIO(key=key).load_checkpoint(
                    path, map_location=map_location, weights_only=weights_only
                )
        else:
            # Only what Lightning passed is handed on: before 2.6 its IO takes no weights_only.
            options: dict[str, Any] = {}
            if map_location is not None:
                options["map_location"] = map_location
            if weights_only is not None:
                options["weights_only"] = weights_only
            checkpoint = self.inner.load_checkpoint(path, **options)
        if self._check is not None:
            self._check(checkpoint, os.fspath(path))
        return checkpoint

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delegate to the trainer's own IO."""
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        """Delegate to the trainer's own IO."""
        self.inner.teardown()


def lightning_checkpoint(checkpoint: Any, target: str) -> dict[str, Any]:
    """A loaded file as Lightning takes it: a dict, OmegaConf hyper-parameters rebuilt.

    Raises:
        CheckpointFormatError: the file holds no dict (321).
    """
    # Not only Trainer checkpoints pass through here (ddp_spawn hands over bare
    # state dicts), but every caller expects a dict.
    if not isinstance(checkpoint, dict):
        raise CheckpointFormatError(
            f"{target} holds a {type(checkpoint).__name__}, not the dict a Lightning checkpoint is"
        )
    return rebuilt_hyperparameters(checkpoint)


def check_loadable(checkpoint: Any, *, where: str) -> None:
    """Refuse, before writing, a checkpoint that weights-only loading would refuse.

    Args:
        checkpoint: The checkpoint (or part of one) about to be written.
        where: The file it is for, named in the message.

    Raises:
        UnsafeCheckpointError: naming the first refused entry and its class (328).
    """
    found = refused_entry(checkpoint, "checkpoint")
    if found is not None:
        raise UnsafeCheckpointError(
            f"{where}: {found}, which a weights-only load refuses; store plain values "
            "(tensors, numbers, str, lists, dicts) or allow the class with "
            "torch.serialization.add_safe_globals"
        )


def _path(path: str | os.PathLike[str]) -> str:
    """A local path (``file://`` removed) or a URL whose scheme is installed (353)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    return paths.location(text)


def _file_key(path: str | os.PathLike[str]) -> str:
    """One name per file: a URL as given, a local path resolved."""
    where = _path(path)
    return where if paths.is_url(where) else os.path.realpath(where)
