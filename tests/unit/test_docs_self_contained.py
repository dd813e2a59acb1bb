"""The docs stand on their own (issue 28, item 7): they cited "DESIGN §3/§4/§7/§8", a page
that is not in the repository, and a path on the machine they were written on. Relative
links between the pages must point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "examples").glob("**/*.md")])
SOURCES = sorted((ROOT / "taskq").rglob("*.py"))
OUTSIDE = re.compile(r"DESIGN(\.md)? ?§?\d|DESIGN\.md|/work/|\.\./shared/")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", PAGES + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_or_docstring_cites_a_document_outside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")

    cited = [line for line in text.splitlines() if OUTSIDE.search(line)]

    assert cited == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(path: Path) -> None:
    targets = [t for t in LINK.findall(path.read_text(encoding="utf-8"))
               if "://" not in t and not t.startswith("mailto:")]

    missing = [t for t in targets if not (path.parent / t).exists()]

    assert missing == []
