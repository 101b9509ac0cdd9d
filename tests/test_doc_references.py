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
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
SOURCES = sorted(
    [
        *DOCS,
        *(REPO / "hook").rglob("*.py"),
        *(REPO / "packaging").rglob("*.yaml"),
        REPO / "packaging/config.yaml",
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
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


def test_operators_guide_opens_with_a_containerd_node_in_five_commands() -> None:
    """Issue 29 item 8: the containerd happy path first, in five commands that exist."""
    text = (REPO / "docs/operators.md").read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("A containerd node in five commands\n")
    block = first.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.split("#", 1)[0].strip()]
    assert len(commands) == 5
    assert commands[0].startswith("packaging/build-deb") and (REPO / "packaging/build-deb").is_file()
    assert "installer register" in commands[2] and commands[4].endswith("hook doctor")


def test_operators_guide_tells_one_uninstall_story() -> None:
    """Issue 29 item 8: the .deb and the installer are removed, and purged, by one procedure."""
    text = (REPO / "docs/operators/install.md").read_text()
    sections = re.split(r"\n## ", text)
    uninstall = [s for s in sections if "Uninstall" in s.splitlines()[0]]
    assert len(uninstall) == 1, [s.splitlines()[0] for s in uninstall]
    story = uninstall[0]
    steps = ("dpkg -r", "installer uninstall", "dpkg -P", "--purge", "pass-through", "Restart containerd")
    assert [step for step in steps if step not in story] == []
    lifecycle = next(s for s in sections if s.startswith("7. "))
    assert "pass-through" not in lifecycle and "section 5" in lifecycle
