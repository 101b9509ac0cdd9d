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
import tomllib
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
SHIM_MARK = "# oci-device-hook: containerd runtime handler"
LIST = "pass-throughs"  # <state>/pass-throughs: what a purge may delete, read by the .deb's postrm (sh)
TASKS = "io.containerd.runtime.v2.task"
PLAIN = re.compile(r"[A-Za-z0-9_./+-]+")  # a word sh never splits


def real_runtime(node: Node, conf: str = "") -> str:
    """What the wrapper execs after its decision: the settings' ``runtime`` as the wrapper reads it
    (its one plain line; ``runc`` where the file or the line is missing); ``conf`` is the settings
    file a shim names, else ``--etc``'s."""
    path = node.path(conf or f"{node.opts.etc}/config.yaml")
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        data = b""
    m = re.search(rb"^runtime:[ \t]*(['\"]?)([A-Za-z0-9_./+-]+)\1[ \t]*(#.*)?$", data, re.M)
    return m.group(2).decode() if m else "runc"


def _assigned(text: str, name: str) -> str | None:
    m = re.search(rf"(?:^|\s){name}=(\S+) ", text, re.M)
    if m is None:
        return None
    words = shlex.split(m.group(1))
    return words[0] if len(words) == 1 else ""


def shim_real(node: Node, path: Path) -> str | None:
    """The binary a handler shim (or a pass-through left earlier) runs, or None where it is not ours.

    A shim without ``OCI_DEVICE_HOOK_REAL_RUNTIME`` runs the settings' ``runtime`` (of the settings
    file it names, else ``--etc``'s)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if PASS_THROUGH_MARK in text:
        m = re.search(r"^exec (\S+) \"\$@\"$", text, re.M)
        words = shlex.split(m.group(1)) if m else []
        return words[0] if len(words) == 1 else None
    if SHIM_MARK not in text or not re.search(r"(?:^|\s)exec \S+ \"\$@\"$", text, re.M):
        return None
    real = _assigned(text, "OCI_DEVICE_HOOK_REAL_RUNTIME")
    if real is None:
        return real_runtime(node, _assigned(text, "OCI_DEVICE_HOOK_CONFIG") or "")
    return real or None


def pass_through_script(real: str, uninstalled: str) -> str:
    """A wrapper reduced to ``exec`` of the real runtime: plain sh, no settings, no Python."""
    return (
        "#!/bin/sh\n"
        f"{PASS_THROUGH_MARK}, left by the uninstall ({uninstalled}).\n"
        "# containerd shims of containers created while the hook was installed keep this path as\n"
        "# their runtime binary (exec, kill, delete); it only runs the real runtime. A purge deletes\n"
        "# it once no task names it (containerd runs its restored config after its restart); a\n"
        "# later install or register puts the wrapper back here.\n"
        f'exec {sh_quote(real)} "$@"\n'
    )


def leave_pass_throughs(
    node: Node, rec: dict[str, Any], libexec: str, *, packaged: bool = False
) -> list[str]:
    """Replace the wrapper and every handler shim a containerd handler or a live shim may still name
    with a pass-through, each in one rename (a shim running it meanwhile sees the old or the new
    file, never none). Only where containerd was registered, or pass-throughs are already there.
    ``packaged``: the wrapper is the package's file (dpkg deletes it next), so only the shims that
    ``register`` made, outside the package's file list, are left."""
    base = node.path(libexec)
    state = rec.get("containerd") or {}
    wanted: dict[str, str] = {}
    for shim in state.get("shims", []):
        real = shim_real(node, node.path(shim))
        if real is not None:
            wanted[shim] = real
    handlers = base / "handlers"
    if handlers.is_dir():
        for p in sorted(handlers.iterdir()):
            real = shim_real(node, p)
            if real is not None:
                wanted.setdefault(f"{libexec}/handlers/{p.name}", real)
    runtime = base / "runtime"
    if not packaged and (state or wanted or shim_real(node, runtime) is not None):
        wanted[f"{libexec}/runtime"] = shim_real(node, runtime) or real_runtime(node)
    ours = set(wanted) | {f"{libexec}/runtime"}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for path, real in sorted(wanted.items()):
        if real in ours or not PLAIN.fullmatch(real):
            real = "runc"  # never a loop back to a file of ours, never a word sh would split
        # the path itself, not where it leads: `runtime` is a symlink into the version removed next
        atomic_write(node.path(path, follow=False), pass_through_script(real, stamp).encode(), 0o755)
    return sorted(wanted)


def task_dirs(node: Node, rec: dict[str, Any]) -> list[str]:
    """Where containerd's runc shims keep each task's ``options.json`` (its runtime binary):
    ``--containerd-state``, the registered config's own ``state``, and k3s's and rke2's state
    where one of theirs was registered."""
    dirs = [f"{node.opts.containerd_state.rstrip('/')}/{TASKS}"]
    state = rec.get("containerd") or {}
    files = [str(f.get("path", "")) for f in state.get("files", [])]
    if any(p.startswith("/var/lib/rancher/") for p in files):
        dirs.append(f"/run/k3s/containerd/{TASKS}")
    try:  # the root config's own `state` (ours are only BinaryName lines: it outlives the restore)
        own = tomllib.loads(node.path(str(state.get("config") or "/nonexistent")).read_text()).get("state")
    except (OSError, UnicodeDecodeError, ValueError, InstallError):
        own = None
    if isinstance(own, str) and own.startswith("/"):
        dirs.append(f"{own.rstrip('/')}/{TASKS}")
    return [d for d in dict.fromkeys(dirs) if PLAIN.fullmatch(d)]


def named_by_tasks(node: Node, paths: list[str], dirs: list[str]) -> dict[str, int]:
    """How many containerd tasks still run each of ``paths``: a leftover can go when its count is 0
    (and containerd runs its restored config)."""
    count = dict.fromkeys(paths, 0)
    for d in dirs:
        for opts in node.path(d).glob("*/*/options.json"):
            try:
                binary = json.loads(opts.read_text()).get("binary_name", "")
            except (OSError, ValueError, AttributeError):
                continue
            if binary in count:
                count[binary] += 1
    return count


def containerd_restarted(node: Node, since: float) -> bool:
    """Whether containerd runs a config restored at ``since``: every containerd process on the node
    started after it, or none runs. Until then its handlers may name a pass-through for a new
    container. False where ``--proc`` cannot tell."""
    proc = node.path(node.opts.proc)
    try:
        m = re.search(r"^btime (\d+)$", (proc / "stat").read_text(), re.M)
    except OSError:
        return False
    if m is None:
        return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            line = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        if line[line.find("(") + 1 : line.rfind(")")] != "containerd":
            continue
        fields = line[line.rfind(")") + 2 :].split()
        if len(fields) < 20 or int(m.group(1)) + int(fields[19]) / 100 <= since:  # starttime, USER_HZ
            return False
    return True


def purge_pass_throughs(node: Node, paths: list[str], dirs: list[str], since: float) -> list[str]:
    """Delete each pass-through no task names, once containerd runs its restored config (``since``);
    the others are kept (and returned)."""
    count = named_by_tasks(node, paths, dirs)
    restarted = containerd_restarted(node, since)
    kept = []
    for path in paths:
        target = node.path(path, follow=False)
        try:
            ours = PASS_THROUGH_MARK in target.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if ours and (count[path] or not restarted):
            kept.append(path)
        elif ours:
            target.unlink()
    return kept


def read_list(node: Node) -> tuple[list[str], float | None]:
    """The pass-throughs an earlier uninstall left, and when it restored containerd's config."""
    try:
        text = node.path(f"{node.opts.state_dir}/{LIST}").read_text()
    except (OSError, UnicodeDecodeError):
        return [], None
    paths = re.findall(r"^pass (\S+)$", text, re.M)
    when = re.search(r"^restored (\d+)$", text, re.M)
    return paths, float(when.group(1)) if when else None


def write_list(node: Node, paths: list[str], dirs: list[str], since: float) -> None:
    """``<state>/pass-throughs``: the leftovers, where tasks are and when the config was restored,
    one word per line, for a later purge (the .deb's postrm has no Python left when it purges)."""
    target = node.path(f"{node.opts.state_dir}/{LIST}")
    if not paths:
        target.unlink(missing_ok=True)
        return
    lines = [f"restored {int(since) + 1}", *(f"tasks {d}" for d in dirs)]  # rounded up: the safe side
    lines += [f"pass {p}" for p in paths if PLAIN.fullmatch(p)]
    atomic_write(target, ("".join(f"{ln}\n" for ln in lines)).encode(), 0o644)
