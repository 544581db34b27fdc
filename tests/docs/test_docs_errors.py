"""docs/errors.md lists the error catalogue of trainer_resume.errors exactly, and every public warning."""

from __future__ import annotations

import re
from pathlib import Path

import trainer_resume
from trainer_resume.errors import ERRORS_BY_CODE

ERRORS_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text(
    encoding="utf-8"
)


def table_rows(header: str) -> list[list[str]]:
    """The cells of each row of the page's table that starts with ``header``."""
    lines = ERRORS_PAGE.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_error_table_is_the_catalogue_code_class_and_message_in_code_order():
    documented = [
        (int(code), name.strip("`"), message)
        for code, name, message in table_rows("| code | class | message |")
    ]
    catalogue = [(code, cls.__name__, cls.message) for code, cls in sorted(ERRORS_BY_CODE.items())]
    assert documented == catalogue


def test_every_documented_error_class_is_importable_from_the_package():
    for code, name, _ in table_rows("| code | class | message |"):
        assert getattr(trainer_resume, name.strip("`"), None) is ERRORS_BY_CODE[int(code)]


def test_warning_table_names_every_public_warning_of_the_package():
    documented = {row[0].strip("`") for row in table_rows("| warning | says |")}
    public = {
        name
        for name in trainer_resume.__all__
        if isinstance(getattr(trainer_resume, name), type)
        and issubclass(getattr(trainer_resume, name), Warning)
    }
    assert documented == public


def test_the_page_states_the_message_format_of_the_errors():
    error = ERRORS_BY_CODE[323]("train.lr")
    assert str(error) == f"[323] {ERRORS_BY_CODE[323].message}: train.lr"
    assert re.search(r"`str\(error\)` is `\[code\] message: detail`", ERRORS_PAGE)
