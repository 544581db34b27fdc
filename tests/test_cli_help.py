"""The command's --help texts and the README's command reference say the same thing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import run_cli

from trainer_resume.cli import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
COMMANDS = ("demo", "inspect", "export", "audit-loader")


def readme_section(command: str) -> str:
    """The README text from the command's heading to the next heading."""
    match = re.search(rf"^### `trainer-resume {command}\b.*?(?=^##)", README, flags=re.S | re.M)
    assert match, f"README has no section for {command}"
    return match.group(0)


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text)) - {"--help"}


def documented_options(command: str) -> set[str]:
    """Options in the section's heading and its option table (not in its examples)."""
    lines = readme_section(command).splitlines()
    return options("\n".join([lines[0], *(line for line in lines if line.startswith("| `"))]))


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_of_the_console_script_lists_the_readme_commands(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    documented = set(re.findall(r"^### `trainer-resume ([a-z-]+)", README, flags=re.M))
    assert documented == set(COMMANDS)
    listed = set(re.findall(r"^    ([a-z-]+)", result.stdout, flags=re.M))
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_and_readme_document_the_same_options(command, capsys):
    assert options(help_text(command, capsys)) == documented_options(command)


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_usage_line_matches_the_help_usage(command, capsys):
    heading = readme_section(command).splitlines()[0]
    usage = " ".join(help_text(command, capsys).split("\n\n")[0].split())
    positional = {
        "demo": "OVERRIDES",
        "inspect": "PATH",
        "export": "OUT",
        "audit-loader": "MODULE:FACTORY",
    }[command]
    assert positional in heading and positional in usage
    for option in options(usage):
        assert option in heading, (
            f"{option} of {command}'s usage is missing from the README heading"
        )


def test_every_exit_status_of_the_help_is_in_the_readme(capsys):
    statuses = re.findall(r"^  (\d)  (\w+)", help_text("inspect", capsys), flags=re.M)
    assert [code for code, _ in statuses] == ["0", "1", "2", "3"]
    for code, first_word in statuses:
        assert re.search(rf"^\| {code} \| {first_word}", README, flags=re.M), f"exit status {code}"
