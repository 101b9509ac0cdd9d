"""``hook cdi`` commands and the import rules of the CDI package."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hook.core.errors import InputError, UsageError
from hook.tools.cdicmd import cmd_list, cmd_resolve, cmd_validate

from .helpers import FIXTURES, base_spec, device, write_spec

REPO = Path(__file__).resolve().parents[2]


def test_validate_ok_and_problems(tmp_path: Path) -> None:
    good = write_spec(tmp_path, "good.json", base_spec())
    bad = write_spec(tmp_path, "bad.json", base_spec(kind="x", devices=[device("d", env=["NOEQ"])]))
    text, code = cmd_validate([good, bad], "text")
    assert code == 1
    assert text.splitlines() == [
        f"{good}: ok",
        f"{bad}: kind: invalid kind 'x': expected vendor/class (kind)",
        f"{bad}: devices[0].containerEdits.env[0]: "
        "invalid environment variable 'NOEQ': expected NAME=VALUE (env)",
    ]
    assert cmd_validate([good], "text") == (f"{good}: ok\n", 0)
    data = json.loads(cmd_validate([bad, tmp_path / "missing.json"], "json")[0])
    assert data["valid"] is False and data["files"][str(bad)][0]["rule"] == "kind"
    assert data["files"][str(tmp_path / "missing.json")][0]["rule"] == "read"


def test_list(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.json", base_spec())
    write_spec(tmp_path, "b.json", "{")
    text, code = cmd_list([tmp_path], "text")
    assert code == 1  # issue 29 item 4: a broken spec fails the listing (its devices are missing)
    assert text.splitlines()[0] == f"vendor.com/dev=d0\t{tmp_path / 'a.json'}"
    assert text.splitlines()[1].startswith(f"error: {tmp_path / 'b.json'}: cannot parse")
    data, code = cmd_list([tmp_path], "json")
    assert code == 1 and list(json.loads(data)["errors"]) == [str(tmp_path / "b.json")]
    assert json.loads(data)["devices"] == [{"name": "vendor.com/dev=d0", "spec": str(tmp_path / "a.json")}]
    (tmp_path / "b.json").unlink()
    assert cmd_list([tmp_path], "text") == (f"vendor.com/dev=d0\t{tmp_path / 'a.json'}\n", 0)
    with pytest.raises(UsageError):
        cmd_list([tmp_path], "yaml")


def test_resolve_fills_from_driver_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    try:
        os.mknod(root / "dev" / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    os.chmod(root / "dev" / "nvidia0", 0o666)
    specs = tmp_path / "specs"
    write_spec(
        specs,
        "g.json",
        base_spec(
            kind="nvidia.com/gpu",
            cdiVersion="0.5.0",
            devices=[device("0", deviceNodes=[{"path": "/dev/nvidia0"}])],
        ),
    )
    data = json.loads(cmd_resolve(["nvidia.com/gpu=0"], [specs], root, "json")[0])
    assert data["nodes"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0}
    ]
    assert data["cgroup"] == [{"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]
    text, code = cmd_resolve(["nvidia.com/gpu=0"], [specs], root, "text")
    assert code == 0 and "cgroup allow c 195:0 rwm" in text
    with pytest.raises(InputError, match=r"unresolvable CDI devices nvidia\.com/gpu=1"):
        cmd_resolve(["nvidia.com/gpu=1"], [specs], root, "text")


def test_validate_fixtures_are_valid() -> None:
    files = sorted(FIXTURES.rglob("*.yaml"))
    assert len(files) >= 3
    assert cmd_validate(files, "text")[1] == 0


def _imports(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    "name", ["core/cdinames.py", "sources/cdi/edits.py", "sources/cdi/schema.py", "sources/cdi/version.py"]
)
def test_core_modules_import_no_io(name: str) -> None:
    forbidden = {"os", "pathlib", "subprocess", "ctypes", "fcntl", "logging", "yaml"}
    assert not _imports(REPO / "hook" / name) & forbidden


def test_names_imports_only_re() -> None:
    assert _imports(REPO / "hook" / "core" / "cdinames.py") <= {"re", "collections", "hook", "__future__"}


def test_json_spec_does_not_import_yaml(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.json", base_spec())
    code = (
        "import sys; from pathlib import Path; from hook.sources.cdi.registry import Registry; "
        f"r = Registry.load([Path({str(tmp_path)!r})]); r.resolve(['vendor.com/dev=d0']); "
        "print('yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


CDI_MODULES = sorted((REPO / "hook" / "sources" / "cdi").glob("*.py"))


@pytest.mark.parametrize("module", CDI_MODULES, ids=lambda p: p.name)
def test_module_size_and_docstring(module: Path) -> None:
    text = module.read_text()
    assert len(text.splitlines()) <= 400
    tree = ast.parse(text)
    assert ast.get_docstring(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno < 50, node.name  # type: ignore[operator]
