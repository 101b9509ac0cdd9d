"""Style anchors, checkable rule 1: the functional core imports no I/O, and only the shell prints or exits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / "hook"
CORE = (
    "core/decide.py",
    "core/requests.py",
    "core/reqtypes.py",
    "core/accel.py",
    "core/asks.py",
    "core/kubeasks.py",
    "core/plan.py",
    "core/rules.py",
    "core/report.py",
    "adapters/specwriter.py",
    "adapters/allowlist.py",
    "core/cdinames.py",
    "core/crunsd.py",
    "routes/runtimeargs/readings.py",
    "routes/runtimeargs/values.py",
    "routes/runtimeargs/runc.py",
    "routes/runtimeargs/crun.py",
)
FORBIDDEN = {"os", "pathlib", "subprocess", "ctypes", "fcntl", "pynvml", "click", "logging"}
# install: the installer's; serve: the decider's own start and stop lines; wrapper: the runtime
# wrapper's decision (exits when it refuses)
SHELL = {
    "cli.py",
    "entry.py",
    "routes/live.py",
    "routes/precreate.py",
    "__main__.py",
    "tools/install/main.py",
    "tools/install/node.py",  # say(): the installer's one-line messages
    "routes/serve.py",
    "routes/wrapper.py",
    "routes/nri/daemon.py",  # `hook nri`: one stderr line when registered, dropped, or a late narrowing
    "tools/metricsserve.py",  # `hook metrics --serve`: one stderr line when listening, one per failed scrape
    "routes/act.py",  # the one apply-and-log step: writes the decision's stderr text and exit
}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io(module: str) -> None:
    names = imports(HOOK / module)
    assert names, module
    assert not {n.split(".")[0] for n in names} & FORBIDDEN
    assert not {n for n in names if n == "hook.adapters.apply" or n.startswith("hook.adapters.apply.")}


def _outputs(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"print() at line {node.lineno}")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in ("exit", "stderr", "stdout")
        ):
            found.append(f"sys.{node.attr} at line {node.lineno}")
    return found


ALL = sorted(str(p.relative_to(HOOK)) for p in HOOK.rglob("*.py"))


@pytest.mark.parametrize("module", [m for m in ALL if m not in SHELL])
def test_only_the_shell_prints_or_exits(module: str) -> None:
    assert _outputs(HOOK / module) == []


def test_the_scan_sees_the_shell() -> None:
    assert set(ALL) >= SHELL | set(CORE)
    assert _outputs(HOOK / "entry.py")
    assert any("sys.exit" in o for o in _outputs(HOOK / "entry.py"))  # run(), which __main__ calls
    assert "run()" in (HOOK / "__main__.py").read_text()
