"""Whether a pause path lies in the run directory a Hydra app made for this launch.

Hydra names a run's directory by the launch time by default
(``outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}``, the template's
``${paths.log_dir}/.../runs/${now:...}``), so it is new on every launch: a pause or
resume point written there is never found by the requeued job, which starts over.
:func:`warn_if_in_launch_directory` says so where the path is given, before training
starts; a run directory without ``${now:...}`` (``hydra.run.dir=runs/${oc.env:SLURM_JOB_ID}``)
is the same on a requeue and is not warned about.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from .errors import UnsavedStateWarning
from .storage.urls import is_url, local_path

__all__ = ["launch_directory", "warn_if_in_launch_directory"]


def launch_directory() -> str | None:
    """This launch's Hydra output directory when its name holds the launch time, else ``None``
    (not in a Hydra app, or a directory that a requeue finds again)."""
    module = sys.modules.get("hydra.core.hydra_config")  # no Hydra app without it imported
    if module is None:
        return None
    try:
        from omegaconf import OmegaConf

        hydra_config = module.HydraConfig
        if not hydra_config.initialized():
            return None
        config = hydra_config.get()
        multirun = str(getattr(config.mode, "name", config.mode)) == "MULTIRUN"
        named = OmegaConf.to_container(config.sweep if multirun else config.run, resolve=False)
        output = config.runtime.output_dir
    except Exception:  # noqa: BLE001 - a Hydra without these fields: nothing to say
        return None
    if not isinstance(named, dict) or "${now:" not in str(named.get("dir", "")):
        return None
    return str(output) if output else None


def warn_if_in_launch_directory(path: Any, what: str) -> None:
    """Warn (``UnsavedStateWarning``) when local ``path`` lies in :func:`launch_directory`.

    Args:
        path: The pause path or resume-point directory given.
        what: What it is, for the message (``"the pause path"``).
    """
    if not isinstance(path, (str, os.PathLike)):
        return
    local = local_path(os.fspath(path))
    if is_url(local):
        return
    directory = launch_directory()
    if directory is None:
        return
    inside = os.path.abspath(local)
    root = os.path.abspath(directory)
    if inside != root and not inside.startswith(root + os.sep):
        return
    warnings.warn(
        UnsavedStateWarning(
            f"{what} {os.fspath(path)} lies in this launch's Hydra run directory {directory}, "
            "which Hydra names by the launch time: a requeued job runs in a new one and "
            "will not find it, and starts over. Put it outside the run directory "
            "(${paths.root_dir}/pauses/..., one per sweep job)."
        ),
        stacklevel=3,
    )
