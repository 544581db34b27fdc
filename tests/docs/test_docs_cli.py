"""The command's --help texts and docs/cli.md say the same thing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import run_cli

from trainer_resume.cli import main

CLI_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
COMMANDS = ("demo", "inspect", "export", "audit-loader")


def page_section(command: str) -> str:
    """The page's text from the command's heading to the next heading of its level."""
    match = re.search(
        rf"^## `trainer-resume {command}`\n.*?(?=^## |\Z)", CLI_PAGE, flags=re.S | re.M
    )
    assert match, f"docs/cli.md has no section for {command}"
    return match.group(0)


def documented_usage(command: str) -> str:
    """The section's usage line (the first line of its first code block)."""
    match = re.search(r"^```text\n(usage: .*)\n", page_section(command), flags=re.M)
    assert match, f"the {command} section of docs/cli.md does not start with its usage line"
    return " ".join(match.group(1).split())


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text)) - {"--help"}


def documented_options(command: str) -> set[str]:
    """Options in the section's option table (not in its examples)."""
    rows = [line for line in page_section(command).splitlines() if line.startswith("| `")]
    return options("\n".join(rows))


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_of_the_console_script_lists_the_documented_commands(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    documented = set(re.findall(r"^## `trainer-resume ([a-z-]+)`", CLI_PAGE, flags=re.M))
    assert documented == set(COMMANDS)
    listed = set(re.findall(r"^    ([a-z-]+)", result.stdout, flags=re.M))
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_and_page_document_the_same_options(command, capsys):
    assert options(help_text(command, capsys)) == documented_options(command)


@pytest.mark.parametrize("command", COMMANDS)
def test_page_usage_line_is_the_help_usage_line(command, capsys):
    usage = " ".join(help_text(command, capsys).split("\n\n")[0].split())
    assert documented_usage(command) == usage


def test_every_exit_status_of_the_help_is_on_the_page(capsys):
    statuses = re.findall(r"^  (\d)  (\w+)", help_text("inspect", capsys), flags=re.M)
    assert [code for code, _ in statuses] == ["0", "1", "2", "3"]
    section = CLI_PAGE[CLI_PAGE.index("## Exit status") :]
    for code, first_word in statuses:
        assert re.search(rf"^\| {code} \| {first_word}", section, flags=re.M), f"exit status {code}"
