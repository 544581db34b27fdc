"""The command's parser is built from the subcommands' argument modules alone: --help
imports none of the modules a subcommand runs."""

from __future__ import annotations

import subprocess
import sys

RUN_MODULES = ("demo", "inspect", "describe", "describe_sharded", "export", "audit")


def test_building_the_parser_imports_no_module_a_subcommand_runs():
    code = (
        "import sys; from trainer_resume.cli import build_parser; build_parser(); "
        f"print([name for name in {RUN_MODULES!r} if 'trainer_resume.cli.' + name in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip() == "[]"
