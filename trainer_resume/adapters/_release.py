"""The one check that a framework is the release its adapter is tested with.

An adapter that reads a framework's internals pins the tested range in its extra and
refuses, at import, any other release it finds: those internals may have changed.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["tested_release"]


def tested_release(
    package: str, *, adapter: str, extra: str, tested: str, below: str, reads: str
) -> ModuleType:
    """Import ``package`` and refuse a release outside ``[tested, below)``.

    Args:
        package: The framework's import name (``"accelerate"``).
        adapter: The adapter's module under ``trainer_resume.adapters``.
        extra: The extra that installs the tested range.
        tested: The tested release (``"1.15"``); ``below``: the first one not tested.
        reads: What the adapter relies on, as in "it reads Accelerate internals (...)".

    Returns:
        The imported package.

    Raises:
        ImportError: the package is missing (naming the extra), or another release
            (naming what the adapter relies on and the range to install).
    """
    try:
        module = importlib.import_module(package)
    except ImportError as error:
        raise ImportError(
            f"trainer_resume.adapters.{adapter} needs {package} {tested}: "
            f"pip install 'trainer-resume[{extra}]'"
        ) from error
    # packaging comes with every framework that has an adapter here.
    from packaging.version import Version

    found = module.__version__
    if not Version(tested) <= Version(found) < Version(below):
        raise ImportError(
            f"trainer_resume.adapters.{adapter} is tested with {package} {tested} and found "
            f"{found}: {reads} that other releases may change; install "
            f"'{package}>={tested},<{below}'"
        )
    return module
