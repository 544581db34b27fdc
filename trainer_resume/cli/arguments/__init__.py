"""Each subcommand's arguments and help, one module per subcommand.

A module here names its subcommand (``NAME``, ``HELP``, ``DESCRIPTION``, ``EPILOG``),
declares its arguments (``add_arguments``), takes what argparse leaves over where it
must (``take_unparsed``: only the demo's overrides) and runs it from the parsed
arguments (``run``), importing the subcommand's own modules only then: the parser is
built from these alone, so ``--help`` imports nothing a subcommand needs to run.
"""

from __future__ import annotations

from . import audit_loader, demo, export, inspect

COMMANDS = (demo, inspect, export, audit_loader)
