"""OmegaConf hyper-parameters in weights-only checkpoints.

``save_hyperparameters(cfg)`` with an OmegaConf ``DictConfig`` makes Lightning store
the config object and its class (``hparams_type``) in every checkpoint: pickled
objects that ``torch.load(weights_only=True)`` refuses. Before a file is written,
:func:`plain_hyperparameters` replaces them by plain containers
(``OmegaConf.to_container(cfg, resolve=False)``, so interpolations survive) and
records which entries were configs under :data:`HPARAMS_TYPES_KEY`; after a file
is read, :func:`rebuilt_hyperparameters` turns them back into ``DictConfig`` /
``ListConfig`` objects with ``OmegaConf.create``, which is what Lightning's own
loading expects. Config flags (read-only, struct) are not kept.
"""

from __future__ import annotations

from typing import Any

from omegaconf import Container, DictConfig, ListConfig, OmegaConf

__all__ = [
    "HPARAMS_TYPES_KEY",
    "hyperparameter_entries",
    "plain_hyperparameters",
    "rebuilt_hyperparameters",
]

HPARAMS_TYPES_KEY = "trainer_resume_hparams_types"

# (where Lightning stores the values, where it stores their class): the module's, the datamodule's.
_ENTRIES = (
    ("hyper_parameters", "hparams_type"),
    ("datamodule_hyper_parameters", "datamodule_hparams_type"),
)
_CONFIG_TYPES: dict[str, type[Container]] = {"DictConfig": DictConfig, "ListConfig": ListConfig}


def _plain(value: Any, path: list[Any], found: list[list[Any]]) -> Any:
    # Containers anywhere in the hyper-parameters (save_hyperparameters({"run": cfg}) too).
    if isinstance(value, Container):
        found.append([list(path), "DictConfig" if isinstance(value, DictConfig) else "ListConfig"])
        return OmegaConf.to_container(value, resolve=False)
    if type(value) is dict:
        return {key: _plain(item, [*path, key], found) for key, item in value.items()}
    return value


def plain_hyperparameters(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Return ``checkpoint`` with OmegaConf hyper-parameters as plain containers.

    Configs are converted wherever they sit in the hyper-parameters (the whole
    hyper-parameters, or values of a dict). The checkpoint itself is not changed; a
    shallow copy is returned when something was converted.
    """
    converted: dict[str, Any] = {}
    configs: dict[str, list[list[Any]]] = {}
    for values_key, _ in _ENTRIES:
        if values_key not in checkpoint:
            continue
        found: list[list[Any]] = []
        plain = _plain(checkpoint[values_key], [], found)
        if found:
            converted[values_key] = plain
            configs[values_key] = found
    if not converted:
        return checkpoint
    plain_checkpoint = dict(checkpoint)
    for values_key, type_key in _ENTRIES:
        if values_key in converted:
            plain_checkpoint[values_key] = converted[values_key]
            # The config class itself; rebuilt from the recorded type on load.
            plain_checkpoint.pop(type_key, None)
    plain_checkpoint[HPARAMS_TYPES_KEY] = configs
    return plain_checkpoint


def rebuilt_hyperparameters(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Turn hyper-parameters stored by :func:`plain_hyperparameters` back into OmegaConf configs.

    Changes ``checkpoint`` in place and returns it; a checkpoint without
    :data:`HPARAMS_TYPES_KEY` is returned unchanged.
    """
    configs = checkpoint.pop(HPARAMS_TYPES_KEY, None)
    if not isinstance(configs, dict):
        return checkpoint
    for values_key, type_key in _ENTRIES:
        for path, name in configs.get(values_key, ()):
            if name not in _CONFIG_TYPES or values_key not in checkpoint:
                continue
            if not path:
                checkpoint[values_key] = OmegaConf.create(checkpoint[values_key])
                checkpoint[type_key] = _CONFIG_TYPES[name]
                continue
            parent = checkpoint[values_key]
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = OmegaConf.create(parent[path[-1]])
    return checkpoint


def hyperparameter_entries(*objects: Any) -> dict[str, Any]:
    """The hyper-parameter entries Lightning's checkpoint will hold for ``objects``.

    ``objects`` are the module and the datamodule (either may be ``None``).

    The same choice as Lightning's ``dump_checkpoint``: an OmegaConf config as it
    is, anything else as a dict, under each object's own checkpoint keys.
    """
    entries: dict[str, Any] = {}
    for obj in objects:
        hparams = getattr(obj, "hparams", None) if obj is not None else None
        if not hparams:
            continue
        if isinstance(hparams, Container):
            entries[obj.CHECKPOINT_HYPER_PARAMS_KEY] = hparams
            entries[obj.CHECKPOINT_HYPER_PARAMS_TYPE] = type(hparams)
        else:
            entries[obj.CHECKPOINT_HYPER_PARAMS_KEY] = dict(hparams)
    return entries
