"""Issue 22, item 5: the documents and the code cite files that exist.

A relative Markdown link in README.md or docs/ must name a file of the repository, and nothing
cites the planning tree this project was built from (``shared/docs/``, ``research/``), which is not
part of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
SOURCES = sorted(
    [
        *DOCS,
        *(REPO / "hook").rglob("*.py"),
        *(REPO / "packaging").rglob("*.yaml"),
        REPO / "packaging/config.yaml",
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_name_files_of_the_repository(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: broken links {broken}"


def test_nothing_cites_files_outside_the_repository() -> None:
    cited = [
        f"{p.relative_to(REPO)}: {m.group(0)}"
        for p in SOURCES
        for m in re.finditer(r"(shared/docs/|research/)[\w./-]*", p.read_text())
    ]
    assert not cited
