"""The README stays short and links every docs page; no relative link in the docs is broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 320

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The file's text without fenced code blocks, where brackets are code, not links."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto: ...
    ]


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub gives the file's headings."""
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_readme_is_at_most_320_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move the detail into a docs/ page and link it"
    )


def test_there_are_docs_pages():
    assert {"trainer.md", "cli.md", "errors.md"} <= {page.name for page in PAGES}


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.split("#")[0]).resolve() for target in relative_links(README)}
    unlinked = [page.name for page in PAGES if page.resolve() not in linked]
    assert not unlinked, f"link these docs pages from README.md: {unlinked}"


@pytest.mark.parametrize(
    "source", [README, *PAGES], ids=lambda path: path.relative_to(ROOT).as_posix()
)
def test_every_relative_link_resolves_to_a_file_and_heading(source):
    broken = []
    for target in relative_links(source):
        file_part, _, anchor = target.partition("#")
        destination = (source.parent / file_part).resolve() if file_part else source
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target} (no such heading in {destination.name})")
    assert not broken, f"broken links in {source.relative_to(ROOT)}: {broken}"
