"""Issue 22, item 5: the documents and the code cite files that exist.

A relative Markdown link in README.md or docs/ must name a file of the repository, and nothing
cites the planning tree this project was built from (``shared/docs/``, ``research/``), which is not
part of it.
"""

from __future__ import annotations

import json
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


def _doctor_reference() -> dict[str, str]:
    text = (REPO / "docs/operators/troubleshoot.md").read_text()
    table = text.split("## `hook doctor`, line by line", 1)[1]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", table, re.M)}


def test_the_doctor_reference_names_every_line_doctor_prints(tmp_path: Path) -> None:
    """Issue 37 item 7: a doctor reference; a check added without its row fails here."""
    from hook.tools.doctor import run_doctor

    out, _ = run_doctor(tmp_path / "driver", [tmp_path / "cdi"], [tmp_path / "hooks"], tmp_path / "cfg.yaml",
                        "json", host_root=tmp_path, proc=tmp_path / "proc")  # fmt: skip
    printed = {c["name"] for c in json.loads(out)}
    source = "\n".join(p.read_text() for p in (REPO / "hook/tools").glob("doctor*.py"))
    named = set(re.findall(r"Check\(\s*\"([^\"]+)\"", source))
    named |= set(re.findall(r"^NAME = \"([^\"]+)\"", source, re.M))
    documented = set(_doctor_reference())
    assert printed and printed <= documented, printed - documented
    assert named <= documented, named - documented
    assert "containerd base spec (<handler>)" in documented


def test_the_symptom_table_runs_commands_that_exist() -> None:
    """Issue 37 item 7: every `hook X` the symptom table tells an operator to run is a command."""
    from click.testing import CliRunner

    from hook.cli import cli

    text = (REPO / "docs/operators/troubleshoot.md").read_text().split("## Symptom → command", 1)[1]
    table = text.split("\n## ", 1)[0].splitlines()
    rows = [ln for ln in table if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 12
    commands = {m for row in rows for m in re.findall(r"`(?:<prefix>/)?hook ([a-z]+)", row.split(" | ")[1])}
    assert {"doctor", "log", "settings", "metrics", "cdi"} <= commands
    for command in commands:
        res = CliRunner().invoke(cli, [command, "--help"])
        assert res.exit_code == 0, (command, res.output)


def test_the_readme_says_what_ci_run_installs_and_starts() -> None:
    """Issue 37 item 7: ./.ci/run apt-installs, and on systemd hosts starts, containerd; the README
    says so plainly, naming every package the script installs."""
    script = (REPO / ".ci/run").read_text()
    line = next(ln for ln in script.splitlines() if ln.startswith("apt-get install"))
    packages = [w for w in line.split(">")[0].split()[2:] if not w.startswith("-")]
    readme = (REPO / "README.md").read_text()
    said = readme.split("./.ci/run\n```", 1)[1].split("\n## ", 1)[0]
    assert "containerd" in packages and [p for p in packages if p not in said] == []
    assert "starts the system's own\n`containerd.service`" in said.replace("**", "")
    assert "/var/cache/oci-device-hook-tests" in said and "debcache" in script
