"""The demo's config: the bundled (or given) YAML plus OmegaConf dot-list overrides."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ...example import default_config_text
from .._common import UsageError, type_phrase

__all__ = ["DemoConfigError", "load_demo_config"]

_MISSING = object()


class DemoConfigError(UsageError):
    """The config file or an override cannot be used (message names the file or key)."""


def _kind(value: object) -> str:
    if isinstance(value, DictConfig):
        return "a mapping"
    if isinstance(value, ListConfig):
        return "a list"
    return type_phrase(value)


def _compatible(old: object, new: object) -> bool:
    if old is None:
        return True
    if isinstance(old, (DictConfig, ListConfig)):
        return type(new) is type(old)
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new)
    if isinstance(old, float):
        return isinstance(new, (int, float))
    return type(new) is type(old)


def load_demo_config(path: str | None, overrides: Sequence[str]) -> DictConfig:
    """Load the config and apply the overrides.

    Raises:
        DemoConfigError: unreadable file, an override not in ``key=value`` form, a key
            the config does not have, or a value of another type than the config's.
    """
    try:
        if path is None:
            config = OmegaConf.create(default_config_text())
        else:
            config = OmegaConf.load(path)
    except FileNotFoundError as error:
        if path is None:
            raise DemoConfigError(
                f"the bundled demo config is missing from this installation ({error})"
            ) from error
        raise DemoConfigError(f"config file not found: {path}") from None
    except (OSError, OmegaConfBaseException, ValueError) as error:
        raise DemoConfigError(f"cannot read config {path or 'demo.yaml'}: {error}") from error
    if not isinstance(config, DictConfig):
        raise DemoConfigError(f"config {path} is not a mapping")
    # Struct mode turns a misspelt key into an error instead of a silently added setting.
    OmegaConf.set_struct(config, True)
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise DemoConfigError(
                f"override {item!r} is not in key=value form (e.g. train.steps=60)"
            )
    try:
        requested = OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as error:
        raise DemoConfigError(f"cannot parse overrides: {error}") from error
    for item in overrides:
        key = item.partition("=")[0]
        old = OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False)
        if old is _MISSING:
            raise DemoConfigError(f"unknown config key {key!r} (override {item!r})")
        new = OmegaConf.select(requested, key)
        if not _compatible(old, new):
            raise DemoConfigError(
                f"config key {key!r} is {_kind(old)} ({old!r}); the override gives {_kind(new)} ({new!r})"
            )
    try:
        merged = OmegaConf.merge(config, requested)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None)
        raise DemoConfigError(f"unknown config key {key!r}" if key else str(error)) from error
    return cast(DictConfig, merged)  # merging into a DictConfig always gives one
