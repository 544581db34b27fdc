"""Order-sensitive config signatures and a readable first difference.

A resumed run must use the config of the paused run. ``config_signature`` hashes a
canonical form of the config that keeps key insertion order at every level: code
that builds modules, losses or augmentations by iterating a mapping registers
parameters and draws random numbers in key order, so a config whose keys were
sorted on the way (e.g. a JSON round trip with ``sort_keys``) is a different
config. ``config_difference`` names the first place where two configs differ.

The canonical form is plain JSON-able data: dicts with str keys (in order), lists,
str, int, finite float, bool and None. Values that are not plain data become a
*tagged value*, a dict with exactly one reserved key, so that they never equal a
plain string of the same text::

    Path("runs/a")            {"__path__": "runs/a"}          (as_posix)
    Color.RED                 {"__enum__": "pkg.mod.Color.RED"}
    torch.float16             {"__dtype__": "torch.float16"}
    torch.device("cuda:0")    {"__device__": "cuda:0"}
    torch.Generator           {"__generator__": {"device": "cpu", "state_sha256": "..."}}
    float("nan"), inf, -inf   {"__float__": "nan"} / "inf" / "-inf"
    a dataclass instance      {"__dataclass__": {"type": "pkg.mod.Cls", "fields": {...}}}

A mapping whose only key is a reserved key is read back as that tagged value (this
is what makes ``canonical_config`` idempotent); a mapping that uses a reserved key in
any other way is refused.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

import torch
from omegaconf import Container, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

__all__ = ["canonical_config", "config_signature", "config_difference", "SIGNATURE_FORMAT"]

SIGNATURE_FORMAT = "trainer_resume.config/1"

_PATH = "__path__"
_ENUM = "__enum__"
_DTYPE = "__dtype__"
_DEVICE = "__device__"
_GENERATOR = "__generator__"
_FLOAT = "__float__"
_DATACLASS = "__dataclass__"
_STRING_TAGS = frozenset({_PATH, _ENUM, _DTYPE, _DEVICE})
_TAGS = _STRING_TAGS | {_GENERATOR, _FLOAT, _DATACLASS}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_ROOT = "<root>"
# Deeper configs are refused: the walks here recurse, and Python's recursion limit
# must not turn a deep (or maliciously nested) config into a RecursionError.
MAX_CONFIG_DEPTH = 100
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")

_ACCEPTED = (
    "dict (str keys), list, tuple, str, int, float, bool, None, pathlib.Path, Enum, "
    "torch.dtype, torch.device, torch.Generator, a dataclass instance, or an OmegaConf config"
)


def canonical_config(config: Any, *, exclude: Collection[str] = ("load",)) -> Any:
    """Return the canonical, JSON-able form of a config.

    Key insertion order is kept at every level; lists and tuples both become lists;
    ``1``, ``1.0`` and ``True`` stay distinct (JSON keeps them apart); finite floats
    are kept exactly (JSON writes the shortest repr that round-trips); other values
    become tagged values (see the module docstring). OmegaConf configs are read with
    interpolations resolved; a structured OmegaConf config (from a dataclass) has the
    same form as the dataclass instance. A ``torch.Generator`` is represented by a
    digest of its *current* state: a generator that has produced numbers since is a
    different config. The function is idempotent, and canonical forms are accepted
    wherever a config is.

    Args:
        config: The config (any of the accepted types, nested).
        exclude: Top-level keys (or top-level dataclass fields) to leave out, e.g.
            the checkpoint to load, which legitimately differs between a run and its
            resumption. Nested keys of the same name are kept.

    Returns:
        Plain data: dicts (str keys, ordered), lists, str, int, finite float, bool, None.

    Raises:
        TypeError: a value or a mapping key has an unsupported type; the message
            names its path (e.g. ``model.layers[1].act``).
        ValueError: an OmegaConf value is missing (``???``) or its interpolation
            cannot be resolved, a reserved key is misused, or the config contains
            itself or nests mappings and lists deeper than ``MAX_CONFIG_DEPTH`` (100)
            levels; the message names the path.
    """
    return _canonical(config, "", _exclude_keys(exclude), set())


def config_signature(config: Any, *, exclude: Collection[str] = ("load",)) -> str:
    """Return the SHA-256 hex digest of the config's canonical form.

    The digest covers a JSON encoding of :func:`canonical_config` that keeps key
    order, so configs that differ only in key order have different signatures.

    Args:
        config: A config or a canonical form.
        exclude: Top-level keys to leave out (see :func:`canonical_config`).

    Raises:
        TypeError, ValueError: as :func:`canonical_config`.
    """
    canonical = canonical_config(config, exclude=exclude)
    payload = f"{SIGNATURE_FORMAT}\n{_encode(canonical)}"
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def config_difference(a: Any, b: Any, *, exclude: Collection[str] = ("load",)) -> str | None:
    """Describe the first difference between two configs, or return ``None``.

    ``None`` is returned exactly when the signatures are equal. The walk is depth
    first in ``a``'s order; at each mapping, missing keys and then key order are
    reported before differences inside the values; in a list, items are compared
    before lengths. Examples::

        "optimizer.lr: 0.1 vs 0.01"
        "key order differs at optimizer: [lr, betas] vs [betas, lr]"
        "model.layers[2]: missing in b"
        "seed: 1 vs 1.0"

    Args:
        a: A config or a canonical form (e.g. the one saved with a checkpoint).
        b: A config or a canonical form.
        exclude: Top-level keys to leave out (see :func:`canonical_config`).

    Raises:
        TypeError, ValueError: as :func:`canonical_config`.
    """
    return _difference(
        canonical_config(a, exclude=exclude), canonical_config(b, exclude=exclude), ""
    )


def _exclude_keys(exclude: Collection[str]) -> frozenset[str]:
    if isinstance(exclude, str) or not isinstance(exclude, Iterable):
        raise TypeError(f"exclude must be a collection of top-level key names, got {exclude!r}")
    keys = frozenset(exclude)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"exclude holds a non-str key {key!r}")
    return keys


def _join(path: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _where(path: str) -> str:
    return path or _ROOT


def _encode(canonical: Any) -> str:
    # Order-preserving (no sort_keys); non-finite floats are tagged, so strict JSON holds.
    return json.dumps(canonical, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _canonical(value: Any, path: str, exclude: frozenset[str], active: set[int]) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, enum.Enum):  # before int/str: IntEnum and str-mixin enums are tagged
        cls = type(value)
        name = value.name if value.name is not None else repr(value.value)
        return {_ENUM: f"{cls.__module__}.{cls.__qualname__}.{name}"}
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        number = float(value)
        if math.isfinite(number):
            return number
        return {_FLOAT: "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, PurePath):
        return {_PATH: value.as_posix()}
    if isinstance(value, torch.dtype):
        return {_DTYPE: str(value)}
    if isinstance(value, torch.device):
        return {_DEVICE: str(value)}
    if isinstance(value, torch.Generator):
        state = value.get_state().cpu().contiguous().numpy().tobytes()
        return {
            _GENERATOR: {
                "device": str(value.device),
                "state_sha256": hashlib.sha256(state).hexdigest(),
            }
        }

    if id(value) in active:
        raise ValueError(f"config value at {_where(path)} contains itself")
    if len(active) >= MAX_CONFIG_DEPTH:  # ``active`` holds the containers above this one
        raise ValueError(
            f"config value at {_where(path)[:200]} nests deeper than {MAX_CONFIG_DEPTH} levels"
        )
    active.add(id(value))
    try:
        if isinstance(value, DictConfig):
            object_type = OmegaConf.get_type(value)
            type_name = _type_name(object_type) if dataclasses.is_dataclass(object_type) else None
            return _mapping(
                list(value.keys()), _getter(value, path), path, exclude, active, type_name
            )
        if isinstance(value, Container) and isinstance(
            value, Sequence
        ):  # ListConfig (and TupleConfig)
            return [
                _canonical(
                    _omegaconf_item(value, index, path), f"{path}[{index}]", frozenset(), active
                )
                for index in range(len(value))
            ]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = [field.name for field in dataclasses.fields(value)]
            return _mapping(
                names,
                lambda name: getattr(value, name),
                path,
                exclude,
                active,
                _type_name(type(value)),
            )
        if isinstance(value, Mapping):
            return _mapping(list(value.keys()), _getter(value, path), path, exclude, active, None)
        if isinstance(value, (list, tuple)):
            return [
                _canonical(item, f"{path}[{index}]", frozenset(), active)
                for index, item in enumerate(value)
            ]
    finally:
        active.discard(id(value))
    raise TypeError(
        f"config value at {_where(path)} has unsupported type {type(value).__module__}.{type(value).__qualname__}; "
        f"use {_ACCEPTED}"
    )


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _getter(container: Mapping[Any, Any], path: str) -> Callable[[Any], Any]:
    if isinstance(container, DictConfig):
        return lambda key: _omegaconf_item(container, key, path)
    return container.__getitem__


def _omegaconf_item(container: Container, key: Any, path: str) -> Any:
    where = _join(path, key) if isinstance(container, DictConfig) else f"{path}[{key}]"
    try:
        return container[key]
    except MissingMandatoryValue as error:
        raise ValueError(f"config value at {where} is missing ('???'): {error}") from error
    except OmegaConfBaseException as error:  # interpolation that cannot be resolved, and similar
        raise ValueError(f"config value at {where} cannot be read: {error}") from error


def _mapping(
    keys: list[Any],
    get: Callable[[Any], Any],
    path: str,
    exclude: frozenset[str],
    active: set[int],
    dataclass_type: str | None,
) -> dict[str, Any]:
    for key in keys:
        if not isinstance(key, str) or isinstance(key, enum.Enum):
            raise TypeError(
                f"config key {key!r} in the mapping at {_where(path)} has type {type(key).__name__}; keys must be str"
            )
    if dataclass_type is None and any(key in _TAGS for key in keys):
        return _tagged(keys, get, path, exclude, active)
    fields = {
        str.__str__(key): _canonical(get(key), _join(path, key), frozenset(), active)
        for key in keys
        if key not in exclude
    }
    if dataclass_type is not None:
        return {_DATACLASS: {"type": dataclass_type, "fields": fields}}
    return fields


def _tagged(
    keys: list[str], get: Callable[[Any], Any], path: str, exclude: frozenset[str], active: set[int]
) -> dict[str, Any]:
    """Read back a tagged value written by ``_canonical`` (the reason canonical forms are inputs)."""
    reserved = [key for key in keys if key in _TAGS]
    if len(keys) != 1:
        raise ValueError(
            f"the mapping at {_where(path)} uses the reserved key {reserved[0]!r} next to other keys; "
            f"a mapping with a reserved key ({', '.join(sorted(_TAGS))}) must have no other key"
        )
    tag = keys[0]
    raw = get(tag)
    bad = ValueError(
        f"the mapping at {_where(path)} has the reserved key {tag!r} with a malformed value {raw!r}"
    )
    if tag in _STRING_TAGS:
        if not isinstance(raw, str):
            raise bad
        return {tag: str.__str__(raw)}
    if tag == _FLOAT:
        if not isinstance(raw, str) or raw not in _NON_FINITE:
            raise bad
        return {tag: str.__str__(raw)}
    if tag == _GENERATOR:
        if not isinstance(raw, (Mapping, DictConfig)) or list(raw.keys()) != [
            "device",
            "state_sha256",
        ]:
            raise bad
        if not all(isinstance(raw[key], str) for key in ("device", "state_sha256")):
            raise bad
        return {
            tag: {
                "device": str.__str__(raw["device"]),
                "state_sha256": str.__str__(raw["state_sha256"]),
            }
        }
    # _DATACLASS
    if not isinstance(raw, (Mapping, DictConfig)) or list(raw.keys()) != ["type", "fields"]:
        raise bad
    type_name, fields = raw["type"], raw["fields"]
    if not isinstance(type_name, str) or not isinstance(fields, (Mapping, DictConfig)):
        raise bad
    return _mapping(
        list(fields.keys()), _getter(fields, path), path, exclude, active, str.__str__(type_name)
    )


def _kind(node: Any) -> str:
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in _TAGS:
            return "dataclass" if _DATACLASS in node else "leaf"
        return "mapping"
    if isinstance(node, list):
        return "list"
    return "leaf"


def _show(node: Any) -> str:
    kind = _kind(node)
    if kind == "mapping":
        return f"a mapping of {len(node)} key(s)"
    if kind == "list":
        return f"a list of {len(node)} item(s)"
    if kind == "dataclass":
        return f"dataclass {node[_DATACLASS]['type']}"
    if isinstance(node, dict):
        tag, text = next(iter(node.items()))
        if tag == _PATH:
            return f"Path({text!r})"
        if tag == _ENUM:
            return f"enum {text}"
        if tag == _DTYPE:
            return text
        if tag == _DEVICE:
            return f"device({text!r})"
        if tag == _FLOAT:
            return text
        return f"Generator(device={text['device']!r}, state sha256 {text['state_sha256'][:16]}...)"
    return repr(node)


def _difference(a: Any, b: Any, path: str) -> str | None:
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b:
        return f"{_where(path)}: {_show(a)} vs {_show(b)}"
    if kind_a == "leaf":
        return None if _encode(a) == _encode(b) else f"{_where(path)}: {_show(a)} vs {_show(b)}"
    if kind_a == "dataclass":
        if a[_DATACLASS]["type"] != b[_DATACLASS]["type"]:
            return f"{_where(path)}: {_show(a)} vs {_show(b)}"
        return _difference(a[_DATACLASS]["fields"], b[_DATACLASS]["fields"], path)
    if kind_a == "list":
        for index, (item_a, item_b) in enumerate(zip(a, b)):
            found = _difference(item_a, item_b, f"{path}[{index}]")
            if found is not None:
                return found
        if len(a) != len(b):
            index = min(len(a), len(b))
            return f"{path}[{index}]: missing in {'b' if len(a) > len(b) else 'a'}"
        return None
    for key in a:
        if key not in b:
            return f"{_join(path, key)}: missing in b"
    for key in b:
        if key not in a:
            return f"{_join(path, key)}: missing in a"
    if list(a) != list(b):
        return f"key order differs at {_where(path)}: [{', '.join(a)}] vs [{', '.join(b)}]"
    for key in a:
        found = _difference(a[key], b[key], _join(path, key))
        if found is not None:
            return found
    return None
