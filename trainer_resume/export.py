"""Getting the weights out: a verified checkpoint written as a file the rest of the ecosystem reads.

:func:`export_checkpoint` verifies a trainer-resume file and writes either the
model's ``state_dict`` (exactly its keys, buffers included) or the whole state, as
a plain ``torch.save`` file or a ``.safetensors`` file, durably. The result opens
with ``torch.load(weights_only=True)``, ``safetensors.torch.load_file`` or, for a
Lightning file written whole, ``LightningModule.load_from_checkpoint``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ._atomic import TempFile
from ._module_names import is_module_state, strip_wrapper_names
from .checkpoint_files import (
    CHECKPOINT,
    FINISHED,
    LIGHTNING,
    LIGHTNING_PAUSE,
    PAUSE,
    is_trainer_resume_file,
    read_checkpoint_file,
    tensor_totals,
)
from .checkpoint_files.lightning import plain_checkpoint, save_plain_checkpoint
from .checks.pause_state import check_layout, object_states
from .errors import CheckpointFormatError
from .sharded.manifest import MANIFEST_NAME
from .storage import paths
from .storage.paths import save_plain_torch_file, write_file

__all__ = ["DEFAULT_OBJECT", "ExportResult", "export_checkpoint"]

DEFAULT_OBJECT = "model"  # the resume object taken as "the model" when none is named

ExportFormat = Literal["torch", "safetensors"]
ExportWhat = Literal["model", "all"]


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote.

    Attributes:
        out: The file written.
        kind: The kind of the source file (``"pause"``, ``"lightning pause"``,
            ``"lightning"``, ``"checkpoint"`` or ``"sharded pause"``).
        what: ``"model"`` or ``"all"``.
        format: ``"torch"`` or ``"safetensors"``.
        source: Where the exported state came from in the file: the resume object's
            name, ``"state_dict"`` for a Lightning file, ``"(whole file)"``.
        tensors: Number of distinct tensors written.
        tensor_bytes: Their size in bytes.
        file_bytes: Size of the written file.
    """

    out: str
    kind: str
    what: str
    format: str
    source: str
    tensors: int
    tensor_bytes: int
    file_bytes: int


def export_checkpoint(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: ExportFormat = "torch",
    what: ExportWhat = "model",
    object: str | None = None,
    key: bytes | None = None,
) -> ExportResult:
    """Verify the trainer-resume file ``path`` and write its weights (or whole state) to ``out``.

    "The model" is, for a pause file (or a ``save_checkpoint`` file holding a dict
    of states), the resume object named ``object``, else the one named ``"model"``,
    else the only entry that is a module ``state_dict`` (a flat mapping of names to
    tensors); for a Lightning file it is the LightningModule's ``state_dict``. With
    ``what="model"`` the output is a flat mapping with exactly the keys of the
    model's ``state_dict()``, buffers included, so ``model.load_state_dict(...)``
    takes it as it is.

    ``what="all"`` writes the whole verified state as a plain ``torch.save`` file;
    for a Lightning file that is a plain Lightning checkpoint, which
    ``LightningModule.load_from_checkpoint`` and ``Trainer.fit(ckpt_path=...)`` read
    without trainer-resume.

    The output is written durably (temp file next to ``out``, fsync, atomic
    replace, directory fsync). ``format="safetensors"`` needs the ``safetensors``
    package (``pip install "trainer-resume[export]"``); its serializer returns the
    whole file as one buffer, so the export holds the weights twice in memory.

    Args:
        path: A pause file, a Lightning file written by ``ResumeCallback`` or
            ``DurableCheckpointIO``, a ``save_checkpoint`` file, or a sharded pause
            directory (or its manifest): its model is gathered from the verified shards
            in this process, no process group needed (``what="model"`` only).
        out: The file to write.
        format: ``"torch"`` (a plain ``torch.save`` file) or ``"safetensors"``
            (``what="model"`` only: safetensors holds tensors and nothing else).
        what: ``"model"`` (the model's ``state_dict``) or ``"all"`` (the whole state).
        object: The name of the resume object that is the model.
        key: The signing key, when the file is signed; the signature is then verified.

    Returns:
        What was written.

    Raises:
        ValueError: A bad ``format`` / ``what`` or a combination that cannot be
            written; ``object`` is not in the file or names an object that is not a
            model (an optimizer: no tensor at its state's top level), or no single
            model can be chosen (the message lists the names); ``out`` is ``path`` itself or
            another trainer-resume file (a pause file, resume point or checkpoint),
            which the export would replace: nothing is written.
        TypeError: The chosen object is not a state_dict, or (safetensors) holds
            a value that is not a tensor.
        ImportError: ``format="safetensors"`` without the ``safetensors`` package.
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: ``path`` is not a trainer-resume file (a plain
            ``torch.save`` file needs no export), or a malformed pause file (321).
        CheckpointCorruptedError, CheckpointSignatureError, UnsafeCheckpointError:
            as :func:`trainer_resume.load_checkpoint` (322, 339, 328).
        CheckpointWriteError: writing ``out`` failed (327); a previous ``out`` is intact.
    """
    if format not in ("torch", "safetensors"):
        raise ValueError(f"format must be 'torch' or 'safetensors', got {format!r}")
    if what not in ("model", "all"):
        raise ValueError(f"what must be 'model' or 'all', got {what!r}")
    if format == "safetensors" and what == "all":
        raise ValueError(
            "safetensors holds a flat mapping of tensors, not a whole training state "
            "(step counters, RNG, loader positions); write the whole state in the torch "
            "format (format='torch', --format torch)"
        )
    if what == "all" and object is not None:
        raise ValueError("object names the model; it does not apply to what='all'")
    save_safetensors = _safetensors_writer() if format == "safetensors" else None
    source_path = paths.location(path)
    target = paths.location(out)
    _check_target(source_path, target)
    sharded = _sharded_pause_directory(source_path)
    if sharded is not None:
        return _export_sharded(sharded, target, format, what, object, key, save_safetensors)
    file = read_checkpoint_file(source_path, key=key, plain=False)
    if file.kind == FINISHED:
        raise CheckpointFormatError(
            f"{source_path} is the finished marker of a run: it holds no state"
        )
    if file.kind == PAUSE:
        check_layout(file.content, source_path)
    if what == "all":
        state: Any = file.content
        source = "(whole file)"
        if file.kind in (LIGHTNING, LIGHTNING_PAUSE):
            save_plain_checkpoint(plain_checkpoint(file.content, source_path), target)
        else:
            save_plain_torch_file(state, target)
    else:
        source, state = _model_state(file.kind, file.content, object, source_path)
        state = strip_wrapper_names(state)
        _write_weights(state, target, save_safetensors)
    return _written(target, file.kind, what, format, source, state)


def _write_weights(state: Mapping[str, Any], target: str, save_safetensors: Any) -> None:
    if save_safetensors is not None:
        save_safetensors(state, target)
    else:
        save_plain_torch_file(state, target)


def _written(
    target: str, kind: str, what: str, format: str, source: str, state: Any
) -> ExportResult:
    tensors, tensor_bytes = tensor_totals(state)
    return ExportResult(
        out=target,
        kind=kind,
        what=what,
        format=format,
        source=source,
        tensors=tensors,
        tensor_bytes=tensor_bytes,
        file_bytes=paths.size_of(target),
    )


SHARDED_PAUSE = "sharded pause"


def _sharded_pause_directory(source: str) -> str | None:
    """The sharded pause directory ``source`` is (or whose manifest it is), or ``None``."""
    if paths.is_url(source):
        return None
    if os.path.basename(source) == MANIFEST_NAME:
        source = os.path.dirname(os.path.abspath(source))
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, MANIFEST_NAME)):
        return source
    return None


def _export_sharded(
    directory: str,
    target: str,
    format: str,
    what: str,
    object: str | None,
    key: bytes | None,
    save_safetensors: Any,
) -> ExportResult:
    """A sharded pause's model, verified and gathered from its shards in this process."""
    from .sharded.read import open_pause  # imports torch.distributed.checkpoint

    if what == "all":
        raise ValueError(
            f"{directory} is a sharded pause: its whole state (every rank's shards of the models "
            "and optimizers) is what resume() restores in the sharded job; export its model "
            "(what='model', --what model), gathered from the shards"
        )
    pause = open_pause(directory, key=key)
    models = list(pause.manifest["models"])
    if object is None:
        object = DEFAULT_OBJECT if DEFAULT_OBJECT in models or len(models) != 1 else models[0]
    state = strip_wrapper_names(pause.model_state(object))
    _write_weights(state, target, save_safetensors)
    return _written(target, SHARDED_PAUSE, what, format, object, state)


def _check_target(source: str, target: str) -> None:
    """Refuse an ``out`` whose replacement would lose a trainer-resume file: the file
    being exported, or another one (a run's last pause would be gone)."""
    if paths.same_location(source, target) or _same_local_file(source, target):
        raise ValueError(
            f"the output {target} is the file being exported: an export replaces its "
            "output, and the verified file would be lost; choose another output path"
        )
    if is_trainer_resume_file(target):
        raise ValueError(
            f"the output {target} is a trainer-resume file (a pause file, resume point or "
            "checkpoint): an export replaces its output, and its state would be lost; "
            "choose another output path, or remove that file first"
        )


def _same_local_file(source: str, target: str) -> bool:
    """Two local paths of one file (a link, another spelling of the path)."""
    if paths.is_url(source) or paths.is_url(target):
        return False
    try:
        return os.path.samefile(source, target)
    except OSError:  # either one missing
        return False


def _model_state(
    kind: str, content: Any, name: str | None, path: str
) -> tuple[str, Mapping[str, Any]]:
    """``(where it came from, the model's state_dict)`` in a loaded file."""
    if kind in (LIGHTNING, LIGHTNING_PAUSE):
        if name is not None:
            raise ValueError(
                f"{path} is a Lightning checkpoint: its model is the LightningModule's state_dict; "
                "object does not apply"
            )
        return "state_dict", content["state_dict"]
    if kind == PAUSE:
        states = object_states(content)
        label = "resume objects"
    elif kind == CHECKPOINT and isinstance(content, Mapping):
        if name is None and is_module_state(content):
            return "(whole file)", content
        states = dict(content)
        label = "entries"
    else:
        raise ValueError(
            f"{path} holds a {type(content).__name__}, not a model's state_dict or a dict of states"
        )
    names = ", ".join(repr(str(n)) for n in states)
    if name is not None:
        if name not in states:
            raise ValueError(f"{path} has no object {name!r}; its {label}: {names}")
        chosen = name
    elif DEFAULT_OBJECT in states:
        chosen = DEFAULT_OBJECT
    else:
        modules = [n for n, state in states.items() if is_module_state(state)]
        if len(modules) != 1:
            found = "several module state_dicts" if modules else "no module state_dict"
            raise ValueError(
                f"{path} has no object named {DEFAULT_OBJECT!r} and {found}; name the model with "
                f"object=... (--object NAME); its {label}: {names}"
            )
        chosen = modules[0]
    state = states[chosen]
    if not isinstance(state, Mapping):
        raise TypeError(
            f"{path}: object {chosen!r} holds a {type(state).__name__}, not a state_dict"
        )
    if not any(isinstance(value, torch.Tensor) for value in state.values()):
        # An optimizer's, a scheduler's or a scaler's state: no tensor at its top level.
        modules = [repr(str(n)) for n, value in states.items() if is_module_state(value)]
        raise ValueError(
            f"{path}: object {chosen!r} is not a model: its state maps no name to a tensor "
            f"(its keys: {', '.join(repr(str(k)) for k in list(state)[:4])}); "
            f"the {label} that are models: {', '.join(modules) or 'none'}"
        )
    return str(chosen), state


def _safetensors_writer() -> Any:
    try:
        from safetensors.torch import save
    except ImportError as error:
        raise ImportError(
            "format='safetensors' needs the safetensors package: "
            "pip install 'trainer-resume[export]'"
        ) from error

    def write(state: Mapping[str, Any], target: str) -> None:
        data = save(_separate_tensors(state), metadata={"format": "pt"})

        def fill(handle: TempFile) -> None:
            handle.write(data)

        write_file(target, fill)

    return write


def _separate_tensors(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a state_dict as safetensors stores them: contiguous, one storage each.

    safetensors refuses tensors that share memory (tied weights): each later alias
    gets its own copy, so every key of the state_dict is kept.
    """
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"state_dict entry {name!r} is a {type(value).__name__}, not a tensor; "
                "safetensors holds tensors only: use the torch format (format='torch', "
                "--format torch)"
            )
        tensor = value.detach().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in storages:
            tensor = tensor.clone()
        elif pointer:
            storages.add(pointer)
        tensors[str(name)] = tensor
    return tensors
