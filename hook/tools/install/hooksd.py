"""hooks.d registration (CRI-O, podman): the prestart file, and the precreate file in precreate mode.

Rule: the file is named to sort after NVIDIA's hook file (``hook.tools.engines.hooks_file_name``),
names this install's own paths, and is removed by uninstall only where it still names them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hook.tools import engines
from hook.tools.install.node import DEFAULTS, OTHER_HOOKS_DIRS, Node, atomic_write, json_ok


def _hooks_doc(node: Node, src: Path, stage: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (src / "usr/share/containers/oci/hooks.d" / engines.HOOKS_NAME).read_text()
    )
    hook = doc["hook"]
    hook["path"] = f"{node.opts.libexec}/hook"
    if stage == "precreate":
        doc["stages"] = ["precreate"]
        hook["args"] = ["hook", "precreate"]
    if node.opts.etc != DEFAULTS["etc"]:
        hook["args"] = [*hook["args"], "--config", f"{node.opts.etc}/config.yaml"]
    return doc


def register_hooks_d(node: Node, src: Path, rec: dict[str, Any]) -> list[str]:
    """The prestart file (named to sort after NVIDIA's), and in precreate mode the precreate file
    beside it: the prestart hook then sees the decided marker and does nothing more."""
    dirs = dict.fromkeys([node.opts.hooks_dir, *OTHER_HOOKS_DIRS])
    present = [p.name for d in dirs if node.path(d).is_dir() for p in node.path(d).iterdir()]
    files = {f"{node.opts.hooks_dir}/{engines.hooks_file_name(present)}": "prestart"}
    if node.opts.mode == "precreate":
        files[f"{node.opts.hooks_dir}/{engines.PRECREATE_NAME}"] = "precreate"
    for path, stage in files.items():
        data = (json.dumps(_hooks_doc(node, src, stage), indent=2) + "\n").encode()
        atomic_write(node.path(path), data, verify=json_ok)
    for old in hooks_files(rec):
        if old not in files:
            node.path(old, follow=False).unlink(missing_ok=True)
    return list(files)


def hooks_files(rec: dict[str, Any]) -> list[str]:
    return [str(p) for p in rec.get("hooks_files") or ([rec["hooks_file"]] if rec.get("hooks_file") else [])]


def is_ours(path: Path, libexec: str) -> bool:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str((doc.get("hook") or {}).get("path", "")).startswith(libexec + "/")
