"""The pure NVIDIA modules import no I/O modules (style rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PURE = ("model", "migminors", "ids", "nodes", "snapshot")
FORBIDDEN = {"os", "pathlib", "subprocess", "ctypes", "fcntl", "pynvml", "click", "logging", "shutil", "io"}
PKG = Path(__file__).resolve().parents[2] / "hook" / "sources" / "nvidia"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports(module: str) -> None:
    imported = _imports(PKG / f"{module}.py")
    assert not {name.split(".")[0] for name in imported} & FORBIDDEN
    impure = {"hook.sources.nvidia." + m for m in ("procfs", "nvml", "inventory", "hostcheck")}
    assert not imported & impure


def test_module_sizes() -> None:
    for path in PKG.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno < 50, f"{path.name}:{node.name}"
