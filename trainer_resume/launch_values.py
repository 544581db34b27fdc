"""The values of an OmegaConf config that describe the launch, not the training.

Hydra makes a new run directory on every launch (``${hydra:runtime.output_dir}``,
``${now:%Y-%m-%d_%H-%M-%S}``), so a config that holds such a value, directly or
through a chain of interpolations (``trainer.default_root_dir: ${paths.output_dir}``,
``paths.output_dir: ${hydra:runtime.output_dir}``), differs on every launch of the same
command. :func:`launch_values` finds those values and renders each one with its launch
calls kept as written: every other interpolation (a node reference, ``oc.env``, a
resolver of your own) is resolved as OmegaConf resolves it, so
``${oc.env:DATA}/${now:%H}`` renders as ``/data/${now:%H}``. Of Hydra's values only
those of the launch are (:data:`HYDRA_LAUNCH_KEYS`: the run's directories, the job's
name, number and id, the working directory), read through the resolver or by a
reference into a top-level ``hydra`` node; any other (``${hydra:runtime.choices.model}``,
the config group option the run was composed with) is signed by its value.

How: the config is copied without resolving (``OmegaConf.to_container``), each launch
call in the copy's text is replaced by a call of a resolver of this module's own, which
returns the call's text between two private-use characters and notes that it ran, and
the copy is resolved by OmegaConf. The user's config, its resolver cache and the
registered resolvers other than this module's own are left as they were; a value
whose rendering fails for any reason is not a launch value (it is then signed by its
resolved value: a relaunch is refused, never silently accepted).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import Container, DictConfig, OmegaConf

__all__ = ["HYDRA_LAUNCH_KEYS", "LAUNCH_RESOLVERS", "LaunchValues", "launch_values"]

# The resolvers of the launch: Hydra's (for the keys below) and the time.
LAUNCH_RESOLVERS = frozenset({"hydra", "now"})
HYDRA_NODE = "hydra"
# The keys of Hydra's config that describe the launch: the run's directories, the job's
# name, number and id, the working directory. Every other key (``runtime.choices.model``,
# the config group option the run was composed with; ``overrides.task``;
# ``job.config_name``) describes the training and is signed by its value.
HYDRA_LAUNCH_KEYS = frozenset(
    {
        "runtime.output_dir",
        "runtime.cwd",
        "run.dir",
        "sweep.dir",
        "sweep.subdir",
        "job.name",
        "job.num",
        "job.id",
    }
)
_RESOLVER = "trainer_resume.launch"
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters around a rendered launch call
_MAX_CHAIN = 8

Segments = tuple[Any, ...]  # keys (str) and list indices (int) from the config's top


@dataclass
class LaunchValues:
    """What :func:`launch_values` found, by ``(id(parent container), key)`` of each node.

    Attributes:
        rendered: Each launch value, rendered with its launch calls as written.
        chains: Each interpolated node's expression, then those of the nodes it
            references, in order (``("${paths.output_dir}", "${hydra:runtime.output_dir}")``).
    """

    rendered: dict[tuple[int, Any], str] = field(default_factory=dict)
    chains: dict[tuple[int, Any], tuple[str, ...]] = field(default_factory=dict)


class _Rendering(threading.local):
    texts: list[str] | None = None
    ran = False


_RENDERING = _Rendering()


def _launch_call(index: int) -> str:
    texts = _RENDERING.texts
    if texts is None or not isinstance(index, int) or not 0 <= index < len(texts):
        raise ValueError(f"${{{_RESOLVER}:...}} is used by trainer_resume while it signs a config")
    _RENDERING.ran = True
    return f"{_OPEN}{texts[index]}{_CLOSE}"


def launch_values(config: Container) -> LaunchValues:
    """Find the launch values of an OmegaConf config and the chains of its interpolations.

    Args:
        config: The config as given (its own top is the top of the paths; references
            to nodes outside it are left to OmegaConf and make no launch value).
    """
    found = LaunchValues()
    try:
        _find(config, found)
    except Exception:  # noqa: BLE001 - see the module docstring: no launch values then
        found.rendered.clear()
    finally:
        _RENDERING.texts = None
    return found


def _find(config: Container, found: LaunchValues) -> None:
    raw = OmegaConf.to_container(config, resolve=False)
    nodes = list(_interpolations(config, raw, ()))
    texts = _Texts({segments: text for segments, _, _, text in nodes})
    top_hydra = isinstance(raw, dict) and HYDRA_NODE in raw
    for segments, container, key, text in nodes:
        found.chains[(id(container), key)] = _chain(segments, text, texts, set())
    calls: list[str] = []
    for segments, _, _, text in nodes:
        _store(raw, segments, _rewritten(text, segments, calls, top_hydra))
    if not calls:
        return
    if not OmegaConf.has_resolver(_RESOLVER):
        _register(_RESOLVER, _launch_call)
    _RENDERING.texts = calls
    copy = OmegaConf.create(raw)
    for segments, container, key, _ in nodes:
        value = _rendered(copy, segments)
        if value is not None:
            found.rendered[(id(container), key)] = value


def _register(name: str, resolver: Any) -> None:
    # omegaconf 2.4 renamed register_new_resolver (now deprecated) to register_resolver,
    # a name that before 2.4 registered resolvers of the old kind (arguments as strings).
    register = OmegaConf.register_resolver
    if "replace" not in inspect.signature(register).parameters:
        register = OmegaConf.register_new_resolver
    register(name, resolver, replace=True)


def _interpolations(
    container: Container, raw: Any, segments: Segments
) -> Iterator[tuple[Segments, Container, Any, str]]:
    """Every interpolated node below ``container``: its path, parent, key and text."""
    if isinstance(container, DictConfig):
        keys: list[Any] = list(container.keys())
    elif isinstance(container, Sequence):  # ListConfig (and TupleConfig)
        keys = list(range(len(container)))
    else:
        return
    for key in keys:
        here = (*segments, key)
        text = raw[key]
        if OmegaConf.is_interpolation(container, key):
            if isinstance(text, str):
                yield here, container, key, text
            continue
        if isinstance(text, (dict, list)) and not (not segments and key == HYDRA_NODE):
            child = container[key]  # not an interpolation: the child container itself
            if isinstance(child, Container):
                yield from _interpolations(child, text, here)


def _rendered(copy: Container, segments: Segments) -> str | None:
    node: Any = copy
    _RENDERING.ran = False
    try:
        for key in segments:
            node = node[key]
    except Exception:  # noqa: BLE001 - a value OmegaConf cannot resolve is reported where it is read
        return None
    launched = _RENDERING.ran or (isinstance(node, str) and _OPEN in node)
    if not launched or not isinstance(node, str):
        return None
    return node.replace(_OPEN, "").replace(_CLOSE, "")


def _store(raw: Any, segments: Segments, text: str) -> None:
    for key in segments[:-1]:
        raw = raw[key]
    raw[segments[-1]] = text


# ------------------------------------------------------------------ expressions


def _parse(text: str) -> Any:
    from omegaconf import grammar_parser

    try:
        return grammar_parser.parse(text)
    except Exception:  # noqa: BLE001 - not an expression OmegaConf reads: nothing to find in it
        return None


def _children(context: Any) -> list[Any]:
    return list(context.getChildren()) if hasattr(context, "getChildren") else []


def _kind(context: Any) -> str:
    return type(context).__name__


def _rewritten(text: str, segments: Segments, calls: list[str], top_hydra: bool) -> str:
    """``text`` with each launch call (outermost) replaced by a call of ``_launch_call``."""
    tree = _parse(text)
    if tree is None:
        return text
    spans: list[tuple[int, int]] = []
    pending = [tree]
    while pending:
        context = pending.pop()
        kind = _kind(context)
        if kind == "InterpolationResolverContext" and _is_launch_call(context):
            spans.append((context.start.start, context.stop.stop + 1))
            continue
        if kind == "InterpolationNodeContext" and top_hydra:
            target = _target(context, segments)
            if target and target[0] == HYDRA_NODE and _hydra_key(target[1:]):
                spans.append((context.start.start, context.stop.stop + 1))
                continue
        pending.extend(_children(context))
    for start, stop in sorted(spans, reverse=True):
        calls.append(text[start:stop])
        text = f"{text[:start]}${{{_RESOLVER}:{len(calls) - 1}}}{text[stop:]}"
    return text


def _is_launch_call(context: Any) -> bool:
    """Whether a resolver call describes the launch: ``${now:...}``, or ``${hydra:KEY}``
    with one of :data:`HYDRA_LAUNCH_KEYS` written out (a key computed from the config is
    not known here, so it is signed by its value)."""
    name = _resolver_name(context)
    if name not in LAUNCH_RESOLVERS:
        return False
    if name != "hydra":
        return True
    arguments = [child for child in _children(context) if _kind(child) == "SequenceContext"]
    elements = _children(arguments[0]) if len(arguments) == 1 else []
    if len(elements) != 1 or _holds_interpolation(elements[0]):
        return False
    key = elements[0].getText().strip()
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
        key = key[1:-1]
    return _hydra_key(tuple(key.split(".")))


def _hydra_key(keys: Segments) -> bool:
    return ".".join(map(str, keys)) in HYDRA_LAUNCH_KEYS


def _holds_interpolation(context: Any) -> bool:
    pending = [context]
    while pending:
        node = pending.pop()
        if _kind(node) == "InterpolationContext":
            return True
        pending.extend(_children(node))
    return False


def _resolver_name(context: Any) -> str | None:
    for child in _children(context):
        if _kind(child) == "ResolverNameContext":
            if any(_kind(part) == "InterpolationContext" for part in _children(child)):
                return None  # a name computed from the config: not one of Hydra's
            return child.getText()
    return None


def _target(context: Any, segments: Segments) -> Segments | None:
    """The path a node reference (``${a.b}``, ``${..c[0]}``) points to, or None."""
    dots = 0
    keys: list[Any] = []
    for child in _children(context):
        kind = _kind(child)
        if kind == "ConfigKeyContext":
            if any(_kind(part) == "InterpolationContext" for part in _children(child)):
                return None  # a key computed from the config
            keys.append(child.getText())
        elif child.getText() == "." and not keys:
            dots += 1
    if dots:
        if dots > len(segments):
            return None
        base = segments[: len(segments) - dots]
    else:
        base = ()
    return (*base, *keys)


def _chain(segments: Segments, text: str, texts: _Texts, seen: set[Segments]) -> tuple[str, ...]:
    """``text``, then the expressions of the interpolated nodes it references, depth first."""
    seen.add(segments)
    found = [text]
    tree = _parse(text)
    pending = [tree] if tree is not None else []
    targets: list[Segments] = []
    while pending:
        context = pending.pop(0)
        if _kind(context) == "InterpolationNodeContext":
            target = _target(context, segments)
            if target is not None:
                targets.append(_matched(target, texts.paths))
            continue
        pending = _children(context) + pending
    for target in targets:
        if target in texts.by_path and target not in seen and len(found) < _MAX_CHAIN:
            for expression in _chain(target, texts.by_path[target], texts, seen):
                if expression not in found:
                    found.append(expression)
    return tuple(found[:_MAX_CHAIN])


class _Texts:
    """The interpolated nodes' texts by path, and their paths with every segment as text."""

    def __init__(self, by_path: dict[Segments, str]) -> None:
        self.by_path = by_path
        self.paths = {tuple(map(str, segments)): segments for segments in by_path}


def _matched(target: Segments, paths: dict[tuple[str, ...], Segments]) -> Segments:
    # A list index is written as text in an expression (``${a[0]}``); the paths hold ints.
    return paths.get(tuple(map(str, target)), target)
