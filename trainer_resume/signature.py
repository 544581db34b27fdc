"""Order-sensitive config signatures, run-specific keys left out, and readable differences.

A resumed run must use the config of the paused run. ``config_signature`` hashes a
canonical form of the config that keeps key insertion order at every level: code
that builds modules, losses or augmentations by iterating a mapping registers
parameters and draws random numbers in key order, so a config whose keys were
sorted on the way (e.g. a JSON round trip with ``sort_keys``) is a different
config. ``config_difference`` names the first place where two configs differ;
``config_differences`` lists every one, for the refusal of a resume.

What is not signed:

- the paths given to ``exclude`` (by default the top-level ``load``, the checkpoint
  to load), dotted paths into nested mappings (``"logger"``, ``"paths.output_dir"``,
  ``"['odd key'].x"``), each with its whole subtree;
- in an OmegaConf config, the values that describe the launch rather than the
  training (see :mod:`trainer_resume.launch_values`): a value that comes, directly or
  through interpolations, from Hydra's ``${hydra:...}`` or ``${now:...}`` is signed as
  written, every other interpolation (``oc.env`` included) resolved, so the same
  command resumes although Hydra made a new run directory; the top-level ``hydra``
  node is not signed.

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
    a launch value            {"__launch__": "${hydra:runtime.output_dir}/ckpt"}

A mapping whose only key is a reserved key is read back as that tagged value (this
is what makes ``canonical_config`` idempotent); a mapping that uses a reserved key in
any other way is refused. A config without launch values has the canonical form, and
so the signature, it had before launch values were recognised.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import PurePath
from typing import Any

import torch
from omegaconf import Container, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from .config_paths import config_paths, covering_paths, join, path_trie
from .errors import UnsavedStateWarning
from .launch_values import HYDRA_NODE, LaunchValues, launch_values

__all__ = [
    "SIGNATURE_FORMAT",
    "Difference",
    "SignedConfig",
    "canonical_config",
    "config_difference",
    "config_differences",
    "config_signature",
    "is_launch_value",
    "launch_text",
    "show",
    "sign_config",
]

SIGNATURE_FORMAT = "trainer_resume.config/1"

_PATH = "__path__"
_ENUM = "__enum__"
_DTYPE = "__dtype__"
_DEVICE = "__device__"
_GENERATOR = "__generator__"
_FLOAT = "__float__"
_DATACLASS = "__dataclass__"
_LAUNCH = "__launch__"
_STRING_TAGS = frozenset({_PATH, _ENUM, _DTYPE, _DEVICE, _LAUNCH})
_TAGS = _STRING_TAGS | {_GENERATOR, _FLOAT, _DATACLASS}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_ROOT = "<root>"
# Deeper configs are refused: the walks here recurse, and Python's recursion limit
# must not turn a deep (or maliciously nested) config into a RecursionError.
MAX_CONFIG_DEPTH = 100
_DEFAULT_EXCLUDE = ("load",)

_ACCEPTED = (
    "dict (str keys), list, tuple, str, int, float, bool, None, pathlib.Path, Enum, "
    "torch.dtype, torch.device, torch.Generator, a dataclass instance, or an OmegaConf config"
)


def canonical_config(config: Any, *, exclude: Collection[str] = _DEFAULT_EXCLUDE) -> Any:
    """Return the canonical, JSON-able form of a config.

    Key insertion order is kept at every level; lists and tuples both become lists;
    ``1``, ``1.0`` and ``True`` stay distinct (JSON keeps them apart); finite floats
    are kept exactly (JSON writes the shortest repr that round-trips); other values
    become tagged values (see the module docstring). OmegaConf configs are read with
    interpolations resolved, except launch values (``${hydra:...}``, ``${now:...}``
    and what is interpolated from them), which are kept as written, and the top-level
    ``hydra`` node, which is left out; a structured OmegaConf config (from a
    dataclass) has the same form as the dataclass instance. A ``torch.Generator`` is
    represented by a digest of its *current* state: a generator that has produced
    numbers since is a different config. The function is idempotent, and canonical
    forms are accepted wherever a config is.

    Args:
        config: The config (any of the accepted types, nested).
        exclude: Paths to leave out with their subtrees: a top-level key (``"load"``,
            the checkpoint to load, which legitimately differs between a run and its
            resumption) or a dotted path of mapping keys or dataclass fields
            (``"logger.level"``; a key that is not a plain name in brackets:
            ``"['a.b'].c"``). Keys of the same name elsewhere are kept.

    Returns:
        Plain data: dicts (str keys, ordered), lists, str, int, finite float, bool, None.

    Raises:
        TypeError: a value or a mapping key has an unsupported type; the message
            names its path (e.g. ``model.layers[1].act``).
        ValueError: an OmegaConf value is missing (``???``) or its interpolation
            cannot be resolved, a reserved key is misused, the config contains
            itself or nests mappings and lists deeper than ``MAX_CONFIG_DEPTH`` (100)
            levels (the message names the path), or an ``exclude`` path is malformed.
    """
    return _Walk(path_trie(exclude, "exclude"), launch=True).canonical(config)


def config_signature(config: Any, *, exclude: Collection[str] = _DEFAULT_EXCLUDE) -> str:
    """Return the SHA-256 hex digest of the config's canonical form.

    The digest covers a JSON encoding of :func:`canonical_config` that keeps key
    order, so configs that differ only in key order have different signatures.

    Args:
        config: A config or a canonical form.
        exclude: Paths to leave out (see :func:`canonical_config`).

    Raises:
        TypeError, ValueError: as :func:`canonical_config`.
    """
    return _digest(canonical_config(config, exclude=exclude))


def config_difference(a: Any, b: Any, *, exclude: Collection[str] = _DEFAULT_EXCLUDE) -> str | None:
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
        exclude: Paths to leave out (see :func:`canonical_config`).

    Raises:
        TypeError, ValueError: as :func:`canonical_config`.
    """
    differences = config_differences(
        canonical_config(a, exclude=exclude), canonical_config(b, exclude=exclude), limit=1
    )
    if not differences:
        return None
    found = differences[0]
    where = _where(found.path)
    if found.kind == "order":
        return f"key order differs at {where}: [{', '.join(found.a)}] vs [{', '.join(found.b)}]"
    if found.kind == "only_a":
        return f"{where}: missing in b"
    if found.kind == "only_b":
        return f"{where}: missing in a"
    return f"{where}: {show(found.a)} vs {show(found.b)}"


# ------------------------------------------------------------- signed configs


@dataclasses.dataclass(frozen=True)
class SignedConfig:
    """A run's config as a pause records it and a resume checks it.

    Attributes:
        canonical: The canonical form, ``exclude`` left out.
        signature: Its digest.
        ignore: The paths the run declared run-specific (``config_ignore``), printed as
            :func:`config_paths` prints them; stored in the pause file.
        exclude: Every path left out: ``ignore`` and those always left out (``load``).
        sources: Path -> the expressions an interpolated OmegaConf value comes from,
            its own first (``("${paths.output_dir}", "${hydra:runtime.output_dir}")``).
        legacy_signature: The signature this config had before launch values were
            recognised (launch values resolved, the ``hydra`` node signed), when it
            differs and can be computed; a pause file written then still resumes
            under the same values.
        absent: The paths of ``ignore`` the config does not have (they leave nothing
            out: a misspelt path, say).
    """

    canonical: Any
    signature: str
    ignore: tuple[str, ...]
    exclude: tuple[str, ...]
    sources: Mapping[str, tuple[str, ...]]
    legacy_signature: str | None = None
    absent: tuple[str, ...] = ()


def sign_config(
    config: Any, *, ignore: Collection[str] = (), always: Collection[str] = _DEFAULT_EXCLUDE
) -> SignedConfig:
    """Sign a run's config, leaving out ``ignore`` (declared) and ``always`` (implicit).

    Raises:
        TypeError, ValueError: as :func:`canonical_config`; ``ignore`` is not a
            collection of paths of mapping keys (see :func:`config_paths`).
    """
    declared = config_paths(ignore, name="config_ignore")
    exclude = tuple(dict.fromkeys([*config_paths(always, name="exclude"), *declared]))
    walk = _Walk(path_trie(exclude, "exclude"), launch=True)
    canonical = walk.canonical(config)
    signature = _digest(canonical)
    legacy = None
    if walk.launch_found:
        try:
            earlier = _Walk(path_trie(exclude, "exclude"), launch=False).canonical(config)
        except (TypeError, ValueError):  # e.g. ${hydra:...} outside a Hydra app
            pass
        else:
            legacy = _digest(earlier)
    absent = tuple(covering_paths(sorted(walk.left_out), declared))
    return SignedConfig(canonical, signature, declared, exclude, walk.sources, legacy, absent)


def warn_if_ignoring_nothing(signed: SignedConfig, *, stacklevel: int) -> None:
    """Warn (``UnsavedStateWarning``, at once) when ``config_ignore`` names paths the
    config does not have: a misspelt path leaves the key it meant in the signature, and a
    resume whose config differs there is refused."""
    if not signed.absent:
        return
    warnings.warn(
        UnsavedStateWarning(
            f"config_ignore names {', '.join(repr(p) for p in signed.absent)}, which the config "
            "does not have: nothing is left out there, so a resume whose config differs at the "
            "key meant is refused (323); spell the path as a difference prints it (dotted "
            "mapping keys, e.g. 'paths.output_dir')"
        ),
        stacklevel=stacklevel + 1,
    )


def _digest(canonical: Any) -> str:
    payload = f"{SIGNATURE_FORMAT}\n{_encode(canonical)}"
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def _where(path: str) -> str:
    return path or _ROOT


def _encode(canonical: Any) -> str:
    # Order-preserving (no sort_keys); non-finite floats are tagged, so strict JSON holds.
    return json.dumps(canonical, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


# ------------------------------------------------------------------ the walk


class _Launch(str):
    """A launch value read from an OmegaConf config: signed as written."""


class _Walk:
    """One canonicalization: what is left out, the launch values found, the sources seen."""

    def __init__(self, exclude: dict[str, Any], *, launch: bool) -> None:
        self.exclude = exclude
        self.launch = launch  # False: as before launch values were recognised
        self.launch_found = False
        self.sources: dict[str, tuple[str, ...]] = {}
        self.left_out: set[str] = set()  # the excluded paths met in the config
        self._active: set[int] = set()
        self._found = LaunchValues()

    def canonical(self, config: Any) -> Any:
        return self._value(config, "", self.exclude, False)

    def _value(self, value: Any, path: str, exclude: Any, in_omegaconf: bool) -> Any:
        if isinstance(value, _Launch):
            return {_LAUNCH: str.__str__(value)}
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

        if id(value) in self._active:
            raise ValueError(f"config value at {_where(path)} contains itself")
        if len(self._active) >= MAX_CONFIG_DEPTH:  # the containers above this one
            raise ValueError(
                f"config value at {_where(path)[:200]} nests deeper than {MAX_CONFIG_DEPTH} levels"
            )
        self._active.add(id(value))
        try:
            return self._container(value, path, exclude, in_omegaconf)
        finally:
            self._active.discard(id(value))

    def _container(self, value: Any, path: str, exclude: Any, in_omegaconf: bool) -> Any:
        if isinstance(value, Container) and not in_omegaconf and self.launch:
            # The top of an OmegaConf config: its launch values, and its hydra node left out.
            found = launch_values(value)
            self._found.rendered.update(found.rendered)
            self._found.chains.update(found.chains)
            if isinstance(value, DictConfig) and HYDRA_NODE in value:
                exclude = {**exclude, HYDRA_NODE: True} if isinstance(exclude, dict) else exclude
                self.launch_found = True
        if isinstance(value, DictConfig):
            object_type = OmegaConf.get_type(value)
            type_name = _type_name(object_type) if dataclasses.is_dataclass(object_type) else None
            return self._mapping(
                list(value.keys()), self._item_of(value, path), path, exclude, True, type_name
            )
        if isinstance(value, Container) and isinstance(value, Sequence):  # ListConfig, TupleConfig
            read = self._item_of(value, path)
            return [
                self._value(read(index), f"{path}[{index}]", {}, True)
                for index in range(len(value))
            ]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = [field.name for field in dataclasses.fields(value)]
            return self._mapping(
                names,
                lambda name: getattr(value, name),
                path,
                exclude,
                False,
                _type_name(type(value)),
            )
        if isinstance(value, Mapping):
            return self._mapping(list(value.keys()), value.__getitem__, path, exclude, False, None)
        if isinstance(value, (list, tuple)):
            return [
                self._value(item, f"{path}[{index}]", {}, False) for index, item in enumerate(value)
            ]
        raise TypeError(
            f"config value at {_where(path)} has unsupported type {type(value).__module__}.{type(value).__qualname__}; "
            f"use {_ACCEPTED}"
        )

    def _item_of(self, container: Container, path: str) -> Callable[[Any], Any]:
        def read(key: Any) -> Any:
            where = join(path, key) if isinstance(container, DictConfig) else f"{path}[{key}]"
            chain = self._found.chains.get((id(container), key))
            if chain is not None:
                self.sources[where] = chain
            rendered = self._found.rendered.get((id(container), key))
            if rendered is not None:
                self.launch_found = True
                return _Launch(rendered)
            try:
                return container[key]
            except MissingMandatoryValue as error:
                raise ValueError(f"config value at {where} is missing ('???'): {error}") from error
            except (
                OmegaConfBaseException
            ) as error:  # interpolation that cannot be resolved, and similar
                raise ValueError(f"config value at {where} cannot be read: {error}") from error

        return read

    def _mapping(
        self,
        keys: list[Any],
        get: Callable[[Any], Any],
        path: str,
        exclude: Any,
        in_omegaconf: bool,
        dataclass_type: str | None,
    ) -> dict[str, Any]:
        for key in keys:
            if not isinstance(key, str) or isinstance(key, enum.Enum):
                raise TypeError(
                    f"config key {key!r} in the mapping at {_where(path)} has type "
                    f"{type(key).__name__}; keys must be str"
                )
        if dataclass_type is None and any(key in _TAGS for key in keys):
            return self._tagged(keys, get, path, exclude)
        exclude = exclude if isinstance(exclude, dict) else {}
        if exclude:
            self.left_out.update(join(path, key) for key in keys if exclude.get(key) is True)
        fields = {
            str.__str__(key): self._value(
                get(key), join(path, key), exclude.get(key, {}), in_omegaconf
            )
            for key in keys
            if exclude.get(key) is not True
        }
        if dataclass_type is not None:
            return {_DATACLASS: {"type": dataclass_type, "fields": fields}}
        return fields

    def _tagged(
        self, keys: list[str], get: Callable[[Any], Any], path: str, exclude: Any
    ) -> dict[str, Any]:
        """Read back a tagged value written by the walk (the reason canonical forms are inputs)."""
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
        omegaconf = isinstance(fields, DictConfig)
        get_field = self._item_of(fields, path) if omegaconf else fields.__getitem__
        return self._mapping(
            list(fields.keys()), get_field, path, exclude, omegaconf, str.__str__(type_name)
        )


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# ------------------------------------------------------------- differences


@dataclasses.dataclass(frozen=True)
class Difference:
    """One place where two canonical forms differ.

    ``kind`` is ``"value"`` (``a`` and ``b`` are the two values), ``"only_a"`` /
    ``"only_b"`` (the key or list item is on one side only; its value in ``a`` or
    ``b``) or ``"order"`` (the same keys in another order; ``a`` and ``b`` list them).
    """

    path: str
    kind: str
    a: Any = None
    b: Any = None


def config_differences(a: Any, b: Any, *, limit: int | None = None) -> list[Difference]:
    """Every difference between two canonical forms, in :func:`config_difference`'s order.

    Args:
        a, b: Canonical forms (from :func:`canonical_config`, or read back from a file).
        limit: Stop after this many.
    """
    found: list[Difference] = []
    _differences(a, b, "", found, limit)
    return found


def _kind(node: Any) -> str:
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in _TAGS:
            return "dataclass" if _DATACLASS in node else "leaf"
        return "mapping"
    if isinstance(node, list):
        return "list"
    return "leaf"


def show(node: Any) -> str:
    """A canonical value as a difference shows it (``0.1``, ``'relu'``, ``Path('a')``...)."""
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
        if tag in (_DTYPE, _FLOAT, _LAUNCH):
            return text
        if tag == _DEVICE:
            return f"device({text!r})"
        return f"Generator(device={text['device']!r}, state sha256 {text['state_sha256'][:16]}...)"
    return repr(node)


def is_launch_value(node: Any) -> bool:
    """Whether a canonical value is a launch value, signed as written."""
    return isinstance(node, dict) and len(node) == 1 and _LAUNCH in node


def launch_text(node: Any) -> str | None:
    """The text a canonical launch value was signed as, else ``None``."""
    return node[_LAUNCH] if is_launch_value(node) and isinstance(node[_LAUNCH], str) else None


def _differences(a: Any, b: Any, path: str, found: list[Difference], limit: int | None) -> None:
    if limit is not None and len(found) >= limit:
        return
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b or (
        kind_a == "dataclass" and a[_DATACLASS]["type"] != b[_DATACLASS]["type"]
    ):
        found.append(Difference(path, "value", a, b))
        return
    if kind_a == "leaf":
        if _encode(a) != _encode(b):
            found.append(Difference(path, "value", a, b))
        return
    if kind_a == "dataclass":
        _differences(a[_DATACLASS]["fields"], b[_DATACLASS]["fields"], path, found, limit)
        return
    if kind_a == "list":
        for index, (item_a, item_b) in enumerate(zip(a, b)):
            _differences(item_a, item_b, f"{path}[{index}]", found, limit)
        for index in range(min(len(a), len(b)), max(len(a), len(b))):
            side = "only_a" if len(a) > len(b) else "only_b"
            value_a, value_b = (a[index], None) if side == "only_a" else (None, b[index])
            found.append(Difference(f"{path}[{index}]", side, value_a, value_b))
        if limit is not None:
            del found[limit:]
        return
    for key in a:
        if key not in b:
            found.append(Difference(join(path, key), "only_a", a[key], None))
    for key in b:
        if key not in a:
            found.append(Difference(join(path, key), "only_b", None, b[key]))
    shared = [key for key in a if key in b]
    if shared != [key for key in b if key in a]:
        found.append(Difference(path, "order", list(a), list(b)))
    for key in shared:
        _differences(a[key], b[key], join(path, key), found, limit)
    if limit is not None:
        del found[limit:]
