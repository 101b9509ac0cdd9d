"""The install record and what an uninstall leaves: pass-throughs where containerd's shims still look.

Rule: ``<state>/install.json`` records every change with what it replaced, so uninstall undoes
exactly that. A path containerd may still run (the wrapper, a handler shim) is never deleted while
the engine or a live task names it: it becomes a pass-through, plain sh that only execs the real
runtime.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

from hook.tools.install.node import InstallError, Node, atomic_write, json_ok, sh_quote

RECORD = "install.json"


def read_record(node: Node) -> dict[str, Any]:
    path = node.path(f"{node.opts.state_dir}/{RECORD}")
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InstallError(str(path), "", f"unreadable install record ({exc})") from None
    return obj if isinstance(obj, dict) else {}


def write_record(node: Node, rec: dict[str, Any]) -> None:
    data = json.dumps(rec, indent=2, sort_keys=True) + "\n"
    atomic_write(node.path(f"{node.opts.state_dir}/{RECORD}"), data.encode(), verify=json_ok)


PASS_THROUGH_MARK = "# oci-device-hook pass-through"


def real_runtime(node: Node) -> str:
    """What the wrapper execs after its decision: the settings' ``runtime`` as the wrapper reads it
    (its one plain line; ``runc`` where the file or the line is missing)."""
    path = node.path(node.opts.etc) / "config.yaml"
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        data = b""
    m = re.search(rb"^runtime:[ \t]*(['\"]?)([A-Za-z0-9_./+-]+)\1[ \t]*(#.*)?$", data, re.M)
    return m.group(2).decode() if m else "runc"


def shim_real(path: Path) -> str | None:
    """The binary a handler shim (or a pass-through left earlier) runs, or None where it is not ours."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    m = re.search(r"^OCI_DEVICE_HOOK_REAL_RUNTIME=(\S+) exec ", text, re.M) or re.search(
        r"^exec (\S+) \"\$@\"$", text, re.M
    )
    if not m or not (PASS_THROUGH_MARK in text or "oci-device-hook: containerd runtime handler" in text):
        return None
    words = shlex.split(m.group(1))
    return words[0] if len(words) == 1 else None


def pass_through_script(real: str, uninstalled: str) -> str:
    """A wrapper reduced to ``exec`` of the real runtime: plain sh, no settings, no Python."""
    return (
        "#!/bin/sh\n"
        f"{PASS_THROUGH_MARK}, left by `installer uninstall` ({uninstalled}).\n"
        "# containerd shims of containers created while the hook was installed keep this path as\n"
        "# their runtime binary (exec, kill, delete); it only runs the real runtime. Delete it once\n"
        "# containerd runs its restored config and every task started before the uninstall is gone;\n"
        "# a later install puts the wrapper back here.\n"
        f'exec {sh_quote(real)} "$@"\n'
    )


def leave_pass_throughs(node: Node, rec: dict[str, Any], libexec: str) -> list[str]:
    """Replace the wrapper and every handler shim a containerd handler or a live shim may still name
    with a pass-through, each in one rename (a shim running it meanwhile sees the old or the new
    file, never none). Only where containerd was registered, or pass-throughs are already there."""
    base = node.path(libexec)
    state = rec.get("containerd") or {}
    wanted: dict[str, str] = {}
    for shim in state.get("shims", []):
        real = shim_real(node.path(shim))
        if real is not None:
            wanted[shim] = real
    handlers = base / "handlers"
    if handlers.is_dir():
        for p in sorted(handlers.iterdir()):
            real = shim_real(p)
            if real is not None:
                wanted.setdefault(f"{libexec}/handlers/{p.name}", real)
    runtime = base / "runtime"
    if state or wanted or shim_real(runtime) is not None:
        wanted[f"{libexec}/runtime"] = shim_real(runtime) or real_runtime(node)
    ours = set(wanted)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for path, real in sorted(wanted.items()):
        if real in ours or not re.fullmatch(r"[A-Za-z0-9_./+-]+", real):
            real = "runc"  # never a loop back to a file of ours, never a word sh would split
        # the path itself, not where it leads: `runtime` is a symlink into the version removed next
        atomic_write(node.path(path, follow=False), pass_through_script(real, stamp).encode(), 0o755)
    return sorted(wanted)


def tasks_naming(node: Node, paths: list[str]) -> int:
    """How many containerd tasks (runc shim ``options.json`` under ``--containerd-state``) still run
    one of ``paths``: the leftovers can go when this is 0 and containerd runs its restored config."""
    task_dir = node.path(node.opts.containerd_state) / "io.containerd.runtime.v2.task"
    count = 0
    for opts in task_dir.glob("*/*/options.json"):
        try:
            binary = json.loads(opts.read_text()).get("binary_name", "")
        except (OSError, ValueError, AttributeError):
            continue
        count += binary in paths
    return count
