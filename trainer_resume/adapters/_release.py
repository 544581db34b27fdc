"""The one policy for the framework releases an adapter works with.

An adapter reads a framework's internals: private methods it calls or overrides,
attributes of the framework's objects, calls the framework makes into an override,
keys of the framework's checkpoints. Each adapter names every one of them, with the
shape it relies on (:class:`Name`, :class:`Function`, :class:`Attribute`,
:class:`Refers`), and :func:`check_release` checks them when the adapter is imported:

- a release below the adapter's floor, or one in which an internal is missing or has
  another shape, is refused: ``FrameworkReleaseError`` (352, an ``ImportError`` too),
  naming each such internal, the tested releases that have it and what to install;
- a release newer than the newest one tested warns once (``UntestedReleaseWarning``)
  and works: every internal is there as the adapter relies on it.

The extras declare the floor only, never a cap, so a new release reaches users at once;
CI installs the newest releases and runs the adapters' resume tests on them, which see
what no check of shapes can: a changed behaviour behind an unchanged name.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import importlib
import inspect
import re
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import FrameworkReleaseError, UntestedReleaseWarning

__all__ = [
    "ACCELERATE",
    "DALI",
    "FABRIC",
    "LIGHTNING",
    "TRANSFORMERS",
    "Attribute",
    "Framework",
    "Function",
    "Internal",
    "Name",
    "Refers",
    "check_release",
]


@dataclasses.dataclass(frozen=True)
class Framework:
    """A framework an adapter reads, and the releases it is tested with.

    Attributes:
        package: The import name (``"pytorch_lightning"``).
        distribution: The name pip installs (``"pytorch-lightning"``).
        floor: The first release supported, the extras' lower bound.
        tested: The newest release the adapter's tests passed on; its later patch
            releases count as tested.
        below_floor: What a release below the floor lacks, when that is more than an
            internal the check names (a fix in the framework's own behaviour).
    """

    package: str
    distribution: str
    floor: str
    tested: str
    below_floor: str = ""

    @property
    def tested_range(self) -> str:
        """``"1.15.0 to 1.16.0"``, or the one release when the floor is the newest tested."""
        if _release(self.floor) == _release(self.tested):
            return self.tested
        return f"{self.floor} to {self.tested}"

    @property
    def tested_requirement(self) -> str:
        """The pip requirement that installs a tested release: ``"accelerate>=1.15.0,<1.17"``."""
        major, minor = _release(self.tested)[:2]
        return f"{self.distribution}>={self.floor},<{major}.{minor + 1}"


ACCELERATE = Framework("accelerate", "accelerate", floor="1.15.0", tested="1.16.0")
TRANSFORMERS = Framework("transformers", "transformers", floor="5.24.0", tested="5.25.0")
LIGHTNING = Framework(
    "pytorch_lightning",
    "pytorch-lightning",
    floor="2.5.3",
    tested="2.6.6",
    below_floor=(
        "earlier releases lack Lightning's own fixes to resumed loop counters (2.5.0) and to "
        "the double iteration on resume (2.5.3)"
    ),
)
# Lightning Fabric, the lightning_fabric package pytorch-lightning installs (of its release).
FABRIC = Framework("lightning_fabric", "pytorch-lightning", floor="2.5.3", tested="2.6.6")
DALI = Framework("nvidia.dali", "nvidia-dali-cuda120", floor="2.4.0", tested="2.4.0")

# (package, release) pairs already warned about: once per process.
_WARNED: set[tuple[str, str]] = set()
_ABSENT = object()  # no such attribute


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version, at least three parts: ``"5.26.dev0"`` -> ``(5, 26, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    release = tuple(int(part) for part in match.group(0).split("."))
    return release + (0,) * (3 - len(release))


# ------------------------------------------------------------------------- internals


class Internal:
    """One thing of a framework an adapter relies on, named by ``"module:Qualified.name"``."""

    def __init__(self, path: str) -> None:
        module, separator, qualname = path.partition(":")
        if not separator or not module or not qualname:
            raise ValueError(f"an internal is named 'module:Qualified.name', got {path!r}")
        self.module = module
        self.qualname = qualname

    @property
    def name(self) -> str:
        """The dotted name: ``"accelerate.state.GradientState._add_dataloader"``."""
        return f"{self.module}.{self.qualname}"

    def problem(self, scans: _Scans | None = None) -> str | None:
        """What is wrong with it in the installed release, or ``None``.

        Args:
            scans: The code already read in this check (read afresh when ``None``).
        """
        try:
            return self._problem(scans if scans is not None else _Scans())
        except LookupError as missing:
            return str(missing)

    def _problem(self, scans: _Scans) -> str | None:
        _resolve(self.module, self.qualname)
        return None

    def shape(self) -> str:
        """The shape relied on, in words (empty: only that it exists)."""
        return ""

    def __str__(self) -> str:
        shape = self.shape()
        return f"{self.name}: {shape}" if shape else self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.module}:{self.qualname})"


class Name(Internal):
    """A class, function or constant the adapter imports or compares with."""


class Function(Internal):
    """A function or method the adapter calls, overrides or binds arguments to.

    Args:
        path: ``"module:Class.method"`` or ``"module:function"``.
        positional: How many positional arguments the adapter passes when it calls it
            (``self`` not counted); ``None``: it does not call it with arguments of its own
            (an override that hands its arguments on), so no call is checked.
        keywords: The keyword arguments the adapter passes; each must be a named parameter.
        parameters: Parameters the adapter reads or replaces by name among the bound
            arguments; each must be a named parameter.
    """

    def __init__(
        self,
        path: str,
        *,
        positional: int | None = None,
        keywords: Sequence[str] = (),
        parameters: Sequence[str] = (),
    ) -> None:
        super().__init__(path)
        self.positional = positional
        self.keywords = tuple(keywords)
        self.parameters = tuple(parameters)

    def _call(self) -> str:
        """The call the adapter makes, in words (empty: it makes none of its own)."""
        if self.positional is None and not self.keywords:
            return ""
        count = self.positional or 0
        call = f"with {count} positional argument{'' if count == 1 else 's'}"
        if self.keywords:
            call += f" and {', '.join(f'{keyword}=' for keyword in self.keywords)}"
        return call

    def shape(self) -> str:
        parts = ["callable", self._call()]
        if self.parameters:
            parts.append(f"with the parameters {', '.join(self.parameters)}")
        return " ".join(part for part in parts if part)

    def _problem(self, scans: _Scans) -> str | None:
        function = _resolve(self.module, self.qualname)
        if not callable(function):
            return f"{self.name} is not callable"
        try:
            signature = _call_signature(self.module, self.qualname, function)
        except (TypeError, ValueError):  # no signature to read (a builtin): calls are the test
            return None
        named = [
            parameter.name
            for parameter in signature.parameters.values()
            if parameter.kind
            in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        # A keyword the adapter passes must be a parameter, not swallowed by ``**kwargs``.
        unnamed = [name for name in (*self.keywords, *self.parameters) if name not in named]
        if unnamed:
            return f"{self.name}{signature} has no parameter {', '.join(map(repr, unnamed))}"
        if not self._call():
            return None
        try:
            signature.bind(*range(self.positional or 0), **dict.fromkeys(self.keywords))
        except TypeError:
            return f"{self.name}{signature} cannot be called {self._call()}"
        return None


class Attribute(Internal):
    """An attribute the adapter reads (or sets) on the framework's objects.

    It is there when the class has it (a property, a class attribute, a dataclass field)
    or when the framework's code assigns it to objects (``self.step = 0``).

    Args:
        path: ``"module:Class.attribute"``.
        settable: The adapter assigns it: a property must have a setter.
        set_by: ``"module"``, ``"module:Class"`` or ``"module:Class.method"`` whose code
            assigns it, when that is not the class itself (an attribute another class puts
            on its objects).
    """

    def __init__(self, path: str, *, settable: bool = False, set_by: str | None = None) -> None:
        super().__init__(path)
        self.settable = settable
        self.set_by = set_by

    def shape(self) -> str:
        return "an attribute the adapter sets" if self.settable else "an attribute"

    def _problem(self, scans: _Scans) -> str | None:
        owner_name, _, attribute = self.qualname.rpartition(".")
        if not owner_name:
            raise ValueError(f"{self.name}: an attribute is named 'module:Class.attribute'")
        owner = _resolve(self.module, owner_name)
        static = _static_attribute(owner, attribute)
        if static is not _ABSENT:
            if self.settable and isinstance(static, property) and static.fset is None:
                return f"{self.name} is a property without a setter"
            return None
        if dataclasses.is_dataclass(owner) and attribute in {
            field.name for field in dataclasses.fields(owner)
        }:
            return None
        if self.set_by is None:
            writer: Any = owner
        else:
            module, _, qualname = self.set_by.partition(":")
            writer = _resolve(module, qualname) if qualname else _import(module)
        if attribute in scans.assigned(writer):
            return None
        return f"{self.name} is missing"


class Refers(Internal):
    """The framework's own code refers to names the adapter relies on it using.

    Used for the calls the framework makes into a method the adapter overrides or
    replaces, for the state a framework function decides from, and for the keys of a
    checkpoint the adapter rewrites: each name must appear in the function's code (an
    attribute or global it uses, or a string constant).

    Args:
        path: ``"module:Class.method"`` (a property: its accessors) or ``"module:function"``.
        *names: The names its code must refer to.
    """

    def __init__(self, path: str, *names: str) -> None:
        super().__init__(path)
        if not names:
            raise ValueError(f"{path}: name what its code refers to")
        self.names = names

    def shape(self) -> str:
        return f"its code refers to {', '.join(self.names)}"

    def _problem(self, scans: _Scans) -> str | None:
        found = _code_names(_resolve(self.module, self.qualname))
        if found is None:
            return f"{self.name} has no Python code to read"
        absent = [name for name in self.names if name not in found]
        if absent:
            return f"{self.name} no longer refers to {', '.join(absent)}"
        return None


# ------------------------------------------------------------------------- the check


def check_release(
    framework: Framework, *, adapter: str, extra: str, internals: Sequence[Internal]
) -> types.ModuleType:
    """Import ``framework`` for an adapter, check each internal it reads, warn for a newer release.

    Args:
        framework: What is imported and the releases tested.
        adapter: The adapter's module under ``trainer_resume.adapters``.
        extra: The extra that installs the framework.
        internals: Everything of the framework the adapter relies on.

    Returns:
        The imported package.

    Raises:
        ImportError: the framework is not installed (naming the extra).
        FrameworkReleaseError: a release below the floor, or one that lacks an internal
            or changed its shape (352; an ``ImportError`` too).

    Warns:
        UntestedReleaseWarning: once per process and release, for a release newer than
            the newest tested one whose internals all passed.
    """
    who = f"trainer_resume.adapters.{adapter}"
    try:
        module = importlib.import_module(framework.package)
    except ImportError as error:
        raise ImportError(
            f"{who} needs {framework.distribution}>={framework.floor}: "
            f"pip install 'trainer-resume[{extra}]'"
        ) from error
    found = str(module.__version__)
    dist = framework.distribution
    if _release(found) < _release(framework.floor):
        reason = f" ({framework.below_floor})" if framework.below_floor else ""
        raise FrameworkReleaseError(
            f"{who} needs {dist} {framework.floor} or later and found {found}{reason}: "
            f"pip install -U '{dist}>={framework.floor}'"
        )
    scans = _Scans()
    problems = [problem for problem in (item.problem(scans) for item in internals) if problem]
    if problems:
        raise FrameworkReleaseError(
            f"{who} relies on internals of {dist} that {dist} {found} lacks or has changed: "
            f"{'; '.join(problems)}. {dist} {framework.tested_range}, the releases it is tested "
            f"with, have them: pip install '{framework.tested_requirement}', or a trainer-resume "
            f"release that supports {dist} {found}"
        )
    newest = _release(framework.tested)[:2]
    if _release(found)[:2] > newest and (framework.package, found) not in _WARNED:
        _WARNED.add((framework.package, found))
        warnings.warn(
            f"{who} is tested with {dist} {framework.tested_range} and found {found}: every "
            f"internal it reads is there with the shape it relies on, so it works; a change in "
            f"what they do is not checked. Check your resume against an uninterrupted run "
            f"(trainer_resume.testing.assert_training_resume), or pip install "
            f"'{framework.tested_requirement}'",
            UntestedReleaseWarning,
            stacklevel=2,
        )
    return module


# ------------------------------------------------------------------------- helpers


def _import(module: str) -> types.ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise LookupError(f"module {module} is missing") from error


def _resolve(module: str, qualname: str) -> Any:
    value: Any = _import(module)
    where = module
    for part in qualname.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise LookupError(f"{where}.{part} is missing") from None
        where = f"{where}.{part}"
    return value


def _static_attribute(owner: Any, name: str) -> Any:
    """What ``owner`` (or a base) defines under ``name`` without running it, or ``_ABSENT``."""
    return inspect.getattr_static(owner, name, _ABSENT)


def _call_signature(module: str, qualname: str, function: Any) -> inspect.Signature:
    """The signature as the adapter calls it: without ``self`` for a method of a class."""
    signature = inspect.signature(function)
    owner_name, _, name = qualname.rpartition(".")
    if owner_name:
        owner = _resolve(module, owner_name)
        static = _static_attribute(owner, name) if isinstance(owner, type) else _ABSENT
        # A plain function of a class (decorated or not) is called bound: ``self`` is
        # passed by the call. Static and class methods are read without it already.
        if (
            static is not _ABSENT
            and not isinstance(static, (staticmethod, classmethod))
            and inspect.isfunction(inspect.unwrap(static))
        ):
            parameters = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=parameters)
    return signature


def _functions(value: Any) -> Iterator[types.FunctionType]:
    """The Python functions behind a function, method, property or decorated function."""
    if isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            if accessor is not None:
                yield from _functions(accessor)
        return
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, functools.cached_property):
        value = value.func
    if inspect.ismethod(value):
        value = value.__func__
    seen = set()
    while value is not None and id(value) not in seen:
        seen.add(id(value))
        if inspect.isfunction(value):
            yield value
        value = getattr(value, "__wrapped__", None)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code of every function, class body and comprehension inside it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes(constant)


class _Scans:
    """The code of the framework read during one check, each class or module once."""

    def __init__(self) -> None:
        self._assigned: dict[int, tuple[Any, frozenset[str]]] = {}

    def assigned(self, writer: Any) -> frozenset[str]:
        """Every attribute name the code of a class (and its bases) or a module assigns."""
        # Keyed by identity, holding the writer: a class need not be hashable.
        entry = self._assigned.get(id(writer))
        if entry is None:
            entry = self._assigned[id(writer)] = (writer, _assigned_attributes(writer))
        return entry[1]


def _assigned_attributes(writer: Any) -> frozenset[str]:
    if isinstance(writer, type):
        namespaces = [vars(klass) for klass in writer.__mro__ if klass is not object]
    elif isinstance(writer, types.ModuleType):
        namespaces = [vars(writer)] + [
            vars(value)
            for value in vars(writer).values()
            if isinstance(value, type) and value.__module__ == writer.__name__
        ]
    else:
        namespaces = [{"function": writer}]
    names: set[str] = set()
    for namespace in namespaces:
        for value in list(namespace.values()):
            for function in _functions(value):
                for code in _codes(function.__code__):
                    names.update(
                        instruction.argval
                        for instruction in dis.get_instructions(code)
                        if instruction.opname == "STORE_ATTR"
                    )
    return frozenset(names)


def _code_names(value: Any) -> set[str] | None:
    """The names and string constants the code of a function (or property) refers to."""
    functions = list(_functions(value))
    if not functions:
        return None
    names: set[str] = set()
    for function in functions:
        for code in _codes(function.__code__):
            names.update(code.co_names)
            names.update(_strings(code.co_consts))
    return names


def _strings(constants: Any) -> Iterator[str]:
    """The strings among code constants, also inside tuples (the keys of a dict display)."""
    for constant in constants:
        if isinstance(constant, str):
            yield constant
        elif isinstance(constant, (tuple, frozenset)):
            yield from _strings(constant)
