"""``hook cdi list | validate | resolve``: plain functions the CLI calls.

Rule: each command returns ``(stdout text, exit code)`` and prints nothing itself. ``validate``
reports every problem of every file, one line each (``FILE: FIELD: reason (rule)``), and exits 1
if any file is invalid; ``list`` prints every device, then every broken spec's problems, and exits
1 when there is one (a broken spec's devices are missing); ``resolve`` raises HookError for the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hook.core.errors import UsageError
from hook.sources.cdi import hostnodes
from hook.sources.cdi.edits import to_nodes_and_rules
from hook.sources.cdi.registry import Registry
from hook.sources.cdi.spec import spec_problems

__all__ = ["cmd_list", "cmd_validate", "cmd_resolve"]

_FORMATS = ("text", "json")


def _check_format(fmt: str) -> None:
    if fmt not in _FORMATS:
        raise UsageError("--format", "format", f"unknown format {fmt!r}: expected text or json")


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def cmd_list(spec_dirs: list[Path], fmt: str) -> tuple[str, int]:
    """Every resolvable device with the spec that defines it, then the per-file problems."""
    _check_format(fmt)
    registry = Registry.load(spec_dirs, cache_dir=None)
    rows = [(name, registry._index[name][1]) for name in sorted(registry._index)]
    code = 1 if registry.errors else 0  # a broken spec fails the listing: its devices are missing
    if fmt == "json":
        return _dump(
            {
                "devices": [{"name": n, "spec": s} for n, s in rows],
                "errors": {p: list(e) for p, e in registry.errors.items()},
            }
        ), code
    lines = [f"{name}\t{spec}" for name, spec in rows]
    lines += [f"error: {line}" for line in dict.fromkeys(x for e in registry.errors.values() for x in e)]
    return "".join(f"{line}\n" for line in lines), code


def cmd_validate(files: list[Path], fmt: str) -> tuple[str, int]:
    """Validate each file strictly; exit 1 if any is invalid."""
    _check_format(fmt)
    results: dict[str, list[dict[str, str]]] = {}
    for path in files:
        source = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            results[source] = [{"field": "", "reason": f"cannot read: {exc.strerror}", "rule": "read"}]
            continue
        _raw, problems = spec_problems(data, source)
        results[source] = [{"field": p.field, "reason": p.reason, "rule": p.rule} for p in problems]
    code = 1 if any(results.values()) else 0
    if fmt == "json":
        return _dump({"valid": code == 0, "files": results}), code
    lines = []
    for source, found in results.items():
        if not found:
            lines.append(f"{source}: ok")
        lines += [f"{source}: {p['field'] or '(document)'}: {p['reason']} ({p['rule']})" for p in found]
    return "".join(f"{line}\n" for line in lines), code


def cmd_resolve(names: list[str], spec_dirs: list[Path], driver_root: Path, fmt: str) -> tuple[str, int]:
    """The merged, host-filled edits for ``names`` and the nodes/rules a live plan would use."""
    _check_format(fmt)
    registry = Registry.load(spec_dirs, cache_dir=None)
    edits = hostnodes.fill(registry.resolve(names), driver_root)
    nodes, rules = to_nodes_and_rules(edits)
    if fmt == "json":
        return _dump(
            {
                "devices": list(dict.fromkeys(names)),
                "containerEdits": edits.to_json(),
                "nodes": [n.to_json() for n in nodes],
                "cgroup": [r.to_json() for r in rules],
            }
        ), 0
    lines = [f"devices: {', '.join(dict.fromkeys(names))}"]
    lines += [f"env {e}" for e in edits.env]
    lines += [f"node {n.path} {n.type} {n.major}:{n.minor} mode {n.file_mode:04o}" for n in nodes]
    lines += [f"cgroup allow {r.v1_line()}" for r in rules]
    lines += [f"mount {m.host_path} -> {m.container_path}" for m in edits.mounts]
    lines += [f"hook {h.hook_name} {h.path} {' '.join(h.args[1:])}".rstrip() for h in edits.hooks]
    return "".join(f"{line}\n" for line in lines), 0
