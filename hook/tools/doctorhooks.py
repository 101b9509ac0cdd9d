"""``hook doctor``'s hooks.d lines (CRI-O, podman): which file is in effect, and its order after NVIDIA's.

Rule: a file is judged as an engine reads it: the same name in a later directory replaces an
earlier one, and a stage's hooks run in the order of their file names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hook.tools.checks import HOOK_PATH, LIBEXEC, Check

HOOKS_FILE = "oci-device-hook.json"


LATE_HOOKS_FILE = "zz-oci-device-hook.json"  # the installer's name where NVIDIA's hooks.d file is present


DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"


HOOK_STAGES = frozenset({"prestart", "createRuntime"})


def _effective_hooks_file(hooks_dirs: Sequence[Path]) -> Path | None:
    """The file an engine would use: same file name in a later directory replaces an earlier one."""
    found: Path | None = None
    for directory in hooks_dirs:
        candidates = [directory / HOOKS_FILE, directory / LATE_HOOKS_FILE]  # the installer's two names
        if directory.is_dir():
            candidates += sorted(directory.glob("*.json"))
        for path in candidates:
            if path.is_file() and (path.name in (HOOKS_FILE, LATE_HOOKS_FILE) or _points_at_hook(path)):
                found = path
                break
    return found


def _points_at_hook(path: Path) -> bool:
    try:
        hook = json.loads(path.read_text()).get("hook", {})
    except (OSError, ValueError, AttributeError):
        return False
    stages = json.loads(path.read_text()).get("stages") or []
    live = isinstance(stages, list) and bool(HOOK_STAGES & set(stages))  # not a precreate-only file
    return isinstance(hook, dict) and hook.get("path") == HOOK_PATH and live


def _hooks_problem(path: Path) -> str:
    """'' when the hooks.d file is usable, else what an engine would reject or skip."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path}: not readable JSON ({exc})"
    hook = doc.get("hook") if isinstance(doc, dict) else None
    if not isinstance(hook, dict) or doc.get("version") != "1.0.0":
        return f"{path}: expected version 1.0.0 with a hook object"
    target = hook.get("path")
    if not isinstance(target, str) or not os.access(target, os.X_OK) or not Path(target).is_file():
        return f"{path}: hook.path {target!r} is not an executable file"
    stages = doc.get("stages")
    if not isinstance(stages, list) or not HOOK_STAGES & set(stages):
        return f"{path}: stages {stages!r} name neither prestart nor createRuntime"
    if not doc.get("when"):
        return f"{path}: no 'when' condition, so the hook never matches"
    return ""


def check_hooks(hooks_dirs: Sequence[Path]) -> Check:
    """The hooks.d file is installed in an engine's hooks directory and points at the hook."""
    fix = f"install nvidia-hook.json as {DEFAULT_HOOKS_DIR}/{HOOKS_FILE} (see docs/operators.md)"
    path = _effective_hooks_file(hooks_dirs)
    if path is None:
        return Check("hooks.d", False, f"no {HOOKS_FILE} in {', '.join(map(str, hooks_dirs))}", fix)
    problem = _hooks_problem(path)
    if problem:
        return Check("hooks.d", False, problem, fix)
    return Check("hooks.d", True, f"{path} → {json.loads(path.read_text())['hook']['path']}")


def _hooks_docs(hooks_dirs: Sequence[Path]) -> dict[str, Any]:
    """File name → decoded hooks.d JSON as an engine sees them (a later dir's file replaces one
    of the same name)."""
    docs: dict[str, Any] = {}
    for directory in hooks_dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            try:
                docs[path.name] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
    return docs


def check_hooks_order(hooks_dirs: Sequence[Path], libexec: str = LIBEXEC) -> Check:
    """CRI-O/podman: which stage (mode) our hooks.d file registers, and that it runs after
    NVIDIA's hook in a stage they share (engines order a stage's hooks by file name)."""
    from hook.tools.engines import hooks_order

    docs = _hooks_docs(hooks_dirs)
    ours = [n for n, d in docs.items() if isinstance(d, dict) and _is_our_hook(d, libexec)]
    if not ours:
        return Check("hooks.d order", True, "not registered through hooks.d (nothing to order)")
    stages = sorted({str(s) for n in ours for s in docs[n].get("stages") or ()})
    mode = ", ".join(f"{s} ({'spec level' if s == 'precreate' else 'live'})" for s in stages)
    order = hooks_order(docs, [HOOK_PATH, *(str(docs[n]["hook"]["path"]) for n in ours)])
    for stage, names in order.items():
        mine = [i for i, n in enumerate(names) if n in ours]
        theirs = [i for i, n in enumerate(names) if n not in ours]
        if mine and theirs and min(mine) < max(theirs):
            return Check(
                "hooks.d order",
                False,
                f"{stage}: {' then '.join(names)}: ours runs before NVIDIA's hook",
                "reinstall (the installer names the file zz-oci-device-hook.json when NVIDIA's is present)",
            )
    after = " after NVIDIA's hook" if any(len(v) > 1 for v in order.values()) else ""
    return Check("hooks.d order", True, f"{', '.join(ours)}: {mode}{after}")


def _is_our_hook(doc: dict[str, Any], libexec: str) -> bool:
    hook = doc.get("hook")
    path = hook.get("path") if isinstance(hook, dict) else None
    return path in (HOOK_PATH, f"{libexec}/hook")
