"""Dotted paths into a config: how a difference prints one, and what ``config_ignore`` takes.

A path is mapping keys (or dataclass fields) joined by dots (``"paths.output_dir"``); a
key that is not a plain name is written in brackets, quoted (``"['a.b'].c"``), and a
list item by its index (``"layers[2]"``), as a difference names it. ``config_ignore``
and ``exclude`` take the paths of keys: one that goes through a list index is refused
(a list is left out whole), and a string without a dot or a bracket is one key,
whatever its characters.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

__all__ = ["config_paths", "covering_paths", "ignorable_path", "join", "path_trie"]

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")
# A list index (group 1) or a quoted key in brackets, in a printed path.
_BRACKET_TOKEN = re.compile(r"(\[\d+\])|\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]")
_BRACKETED = re.compile(r"\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]")
_DOTTED = re.compile(r"[^.\[\]]+")


def join(path: str, key: str) -> str:
    """``path`` extended by the mapping key ``key``, as a difference prints it."""
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def config_paths(paths: Collection[str], *, name: str = "config_ignore") -> tuple[str, ...]:
    """Check dotted config paths; return each printed as differences print it, sorted.

    A path is mapping keys (or dataclass fields) joined by dots (``"paths.output_dir"``);
    a key that is not a plain name goes in brackets, quoted (``"['a.b'].c"``). A string
    without a dot or a bracket is one key, whatever its characters. A path cannot go
    through a list (a list is left out whole).

    Raises:
        TypeError: ``paths`` is a str or not a collection of str.
        ValueError: a path is malformed or indexes a list.
    """
    if isinstance(paths, str) or not isinstance(paths, Iterable):
        raise TypeError(f"{name} must be a collection of dotted paths, got {paths!r}")
    printed = set()
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"{name} holds a non-str path {path!r}")
        printed.add(_print(_segments(path, name)))
    return tuple(sorted(printed))


def covering_paths(paths: Collection[str], covered: Collection[str]) -> list[str]:
    """The paths of ``covered`` that no path of ``paths`` leaves out (itself or an ancestor)."""
    trie = path_trie(paths, "paths")
    missing = []
    for path in covered:
        node: Any = trie
        for key in _segments(path, "paths"):
            node = node.get(key, {}) if isinstance(node, dict) else node
        if node is not True:
            missing.append(path)
    return missing


def ignorable_path(path: str) -> str | None:
    """The part of a difference's path that ``config_ignore`` can name: up to its first list index.

    ``"callbacks[1].patience"`` -> ``"callbacks"``; ``None`` for the root or a top-level
    list item.
    """
    for token in _BRACKET_TOKEN.finditer(path):
        if token.group(1):  # a list index
            return path[: token.start()] or None
    return path or None


def _segments(path: str, name: str) -> tuple[str, ...]:
    if "." not in path and "[" not in path:
        return (path,)
    segments: list[str] = []
    position = 0
    while position < len(path):
        if path[position] == "[":
            match = _BRACKETED.match(path, position)
            inner = match.group(1) if match else ""
            if not match or inner[:1] not in ("'", '"'):
                raise ValueError(
                    f"{name} path {path!r}: a bracket must hold a quoted key ({path!r} "
                    "may index a list: a path cannot go through a list, leave the list out whole)"
                )
            try:
                segments.append(str(ast.literal_eval(inner)))
            except (ValueError, SyntaxError) as error:
                raise ValueError(f"{name} path {path!r}: {inner} is not a quoted key") from error
            position = match.end()
        else:
            if segments:
                if path[position] != ".":
                    raise ValueError(f"{name} path {path!r} is malformed at {path[position:]!r}")
                position += 1
            match = _DOTTED.match(path, position)
            if not match:
                raise ValueError(f"{name} path {path!r} has an empty key")
            segments.append(match.group(0))
            position = match.end()
    return tuple(segments)


def _print(segments: Sequence[str]) -> str:
    path = ""
    for key in segments:
        path = join(path, key)
    return path


def path_trie(paths: Collection[str], name: str) -> dict[str, Any]:
    """Nested keys of the paths; ``True`` where a path ends (its subtree left out)."""
    if isinstance(paths, str) or not isinstance(paths, Iterable):
        raise TypeError(
            f"{name} must be a collection of top-level keys or dotted paths, got {paths!r}"
        )
    trie: dict[str, Any] = {}
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"{name} holds a non-str key {path!r}")
        *parents, last = _segments(path, name)
        node: Any = trie
        for key in parents:
            node = node.setdefault(key, {})
            if node is True:
                break
        else:
            node[last] = True
    return trie
