"""A paused run's config checked against this run's, and the refusal that names the fix.

One rule for the mixin and the Lightning adapter. The paused run's entries (its
signature, its canonical config, its ``config_ignore`` paths) come from the pause file;
this run's from :func:`~trainer_resume.signature.sign_config`.

- This run must leave out at least what the paused run left out (``config_ignore``):
  the file does not hold those values, so they cannot be compared. A run may leave
  out more: it declares that those keys do not affect training, and its own pauses
  record the longer list.
- The configs must then be equal, each with this run's paths left out. A pause file of
  an earlier release, which signed launch values resolved, is also accepted when this
  run's resolved values are the paused run's.

A refusal (``ConfigSignatureMismatchError``, 323) names the pause file, every differing
path (a handful, then a count), where an interpolated value comes from, which side an
added or removed key is on, and the ``config_ignore`` that would leave the keys out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..config_paths import config_paths, covering_paths, ignorable_path
from ..errors import CheckpointFormatError, ConfigSignatureMismatchError
from ..launch_values import HYDRA_LAUNCH_KEYS
from ..signature import (
    Difference,
    SignedConfig,
    canonical_config,
    config_differences,
    config_signature,
    is_launch_value,
    launch_text,
    show,
)

__all__ = ["check_config", "paused_ignore"]

_SHOWN = 5  # differences listed in a refusal; the others are counted


def paused_ignore(entry: Mapping[str, Any], location: str) -> tuple[str, ...]:
    """The ``config_ignore`` paths a pause entry records (none in a file written before them)."""
    paths = entry.get("config_ignore", [])
    if not isinstance(paths, (list, tuple)):
        raise CheckpointFormatError(f"{location}: entry 'config_ignore' is not a list of paths")
    try:
        return config_paths(paths)
    except (TypeError, ValueError) as error:
        raise CheckpointFormatError(f"{location}: entry 'config_ignore': {error}") from error


def check_config(entry: Mapping[str, Any], current: SignedConfig, location: str) -> None:
    """Refuse a pause whose config is not this run's.

    Args:
        entry: What the pause file records: ``config_signature`` (str), ``config`` (the
            canonical form, absent in older files) and ``config_ignore``.
        current: This run's signed config.
        location: The pause file, for the messages.

    Raises:
        ConfigSignatureMismatchError: the configs differ, or this run leaves out fewer
            paths than the paused run (323).
        CheckpointFormatError: the entries are malformed (321).
    """
    ignored = paused_ignore(entry, location)
    uncovered = covering_paths(current.exclude, ignored)
    if uncovered:
        raise ConfigSignatureMismatchError(
            f"{location} was paused with config_ignore={list(ignored)} and this run passes "
            f"config_ignore={list(current.ignore)}: the pause file does not hold the paused run's "
            f"{', '.join(uncovered)}, so they cannot be compared; pass at least the paused run's paths"
        )
    signature = entry.get("config_signature")
    if isinstance(signature, str) and signature in (current.signature, current.legacy_signature):
        return
    saved = entry.get("config")
    if saved is None:
        raise ConfigSignatureMismatchError(
            f"{location}: config signature {str(signature)[:16]}... != {current.signature[:16]}... "
            "(the pause file holds no config to name the difference)"
        )
    try:
        paused = canonical_config(saved, exclude=current.exclude)
    except (TypeError, ValueError) as error:
        raise CheckpointFormatError(
            f"{location}: entry 'config' is not a canonical config: {error}"
        ) from error
    if config_signature(paused, exclude=()) in (current.signature, current.legacy_signature):
        return  # the paths this run leaves out besides the paused run's were all that differed
    differences = config_differences(paused, current.canonical)
    earlier = "config_ignore" not in entry  # written before launch values were recognised
    raise ConfigSignatureMismatchError(_report(location, differences, current, earlier))


def _report(
    location: str, differences: list[Difference], current: SignedConfig, earlier: bool
) -> str:
    count = len(differences)
    lines = [
        f"{location}: the paused run's config differs from this run's at {count} "
        f"path{'s' if count != 1 else ''}:"
    ]
    lines.extend(f"  {_line(found, current)}" for found in differences[:_SHOWN])
    if count > _SHOWN:
        lines.append(f"  ... and {count - _SHOWN} more")
    if earlier and any(
        found.kind == "value" and is_launch_value(found.b) and not is_launch_value(found.a)
        for found in differences
    ):
        lines.append(
            "the pause file signed a launch value resolved, as earlier releases did: it resumes "
            "under the paused run's values (for Hydra, its run directory: hydra.run.dir=...)"
        )
    # Earlier releases signed every ${hydra:...} value as written; now only the launch's.
    unknown = [
        found
        for found in differences
        if found.kind == "value"
        and _signed_by_an_earlier_release(launch_text(found.a))
        and not is_launch_value(found.b)
        and found.path in current.sources
    ]
    if unknown:
        written = ", ".join(f"{found.path} ({launch_text(found.a)})" for found in unknown)
        lines.append(
            f"the pause file signed {written} as written, as earlier releases signed every "
            "${hydra:...} value; only the launch's directories, job name, number and id and "
            "working directory are signed so now, and the paused run's value is not in the "
            f"pause file: if it was this run's, pass config_ignore="
            f"{_ignorable(unknown, current.ignore)!r} to resume it"
        )
    paths = _ignorable(differences, current.ignore)
    if paths:
        lines.append(
            f"if these keys do not affect training, pass config_ignore={paths!r} (each path leaves "
            "out its subtree); otherwise run with the paused run's values"
        )
    return "\n".join(lines)


def _signed_by_an_earlier_release(text: str | None) -> bool:
    """A value signed as written that calls ``${hydra:...}`` for a key that is not the
    launch's: only earlier releases signed those so."""
    keys = _HYDRA_CALL.findall(text or "")
    return any(key.strip().strip("'\"") not in HYDRA_LAUNCH_KEYS for key in keys)


_HYDRA_CALL = re.compile(r"\$\{hydra:([^}]*)\}")


def _line(found: Difference, current: SignedConfig) -> str:
    where = found.path or "<root>"
    chain = current.sources.get(found.path)
    origin = "".join(f", from {expression}" for expression in chain) if chain else ""
    named = f"{where}{f' ({origin[2:]})' if origin else ''}"
    if found.kind == "only_a":
        return f"{named}: in the paused run, not in this one"
    if found.kind == "only_b":
        return f"{named}: in this run, not in the paused one"
    if found.kind == "order":
        return (
            f"{named}: keys in the order [{', '.join(found.a)}] in the paused run, "
            f"[{', '.join(found.b)}] in this run"
        )
    return f"{named}: {show(found.a)} in the paused run, {show(found.b)} in this run"


def _ignorable(differences: list[Difference], declared: tuple[str, ...]) -> list[str]:
    """This run's ``config_ignore`` with the differing paths added (ancestors only)."""
    paths = list(declared)
    for found in differences:
        path = ignorable_path(found.path)
        if path is not None and path not in paths:
            paths.append(path)
    if len(paths) == len(declared):
        return []
    return sorted(path for path in paths if not _under_another(path, paths))


def _under_another(path: str, paths: list[str]) -> bool:
    return any(other != path and not covering_paths([other], [path]) for other in paths)
