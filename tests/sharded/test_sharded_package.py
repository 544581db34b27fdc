"""Importing the library leaves torch.distributed.checkpoint unimported until a sharded
pause is written or read; the package's one public name loads on first use."""

from __future__ import annotations

import subprocess
import sys

import trainer_resume.sharded


def test_importing_the_package_the_mixin_and_sharded_imports_no_dcp():
    code = (
        "import sys, trainer_resume, trainer_resume.mixin, trainer_resume.sharded; "
        "print(sorted(name for name in sys.modules if name.startswith('torch.distributed.checkpoint')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_weights_only_planner_is_the_public_name_and_loads_on_first_use():
    from trainer_resume.sharded.read import WeightsOnlyLoadPlanner

    assert trainer_resume.sharded.__all__ == ["WeightsOnlyLoadPlanner"]
    assert trainer_resume.sharded.WeightsOnlyLoadPlanner is WeightsOnlyLoadPlanner
