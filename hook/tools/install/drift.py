"""Registration drift: does the containerd this node runs still run the hook, and repair where not.

Rule: judged from the node, never from our record alone. A registration drifts two ways: another
tool (the GPU operator's toolkit, an image's first boot) rewrites a config file so a runc-type
handler no longer names the wrapper or a shim; or the file was registered after containerd started
(containerd reads its config once, at start), so what runs is not what the file says. ``judge``
says which, per handler; ``repair`` registers again on top of what the other tool wrote (that text
becomes the one an uninstall restores), and only the first kind can be repaired by a write: the
second needs containerd restarted (``--restart-engine``, or by hand).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hook.tools import ctdconfig, ctdprocess, engines
from hook.tools.install.node import Node, read_in_root, say, sha
from hook.tools.install.state import write_record

__all__ = ["judge", "repair", "write_status"]


def _ours(libexec: str) -> tuple[str, str]:
    return f"{libexec}/runtime", f"{libexec}/handlers/"


def _roots(rec: dict[str, Any]) -> list[str]:
    from hook.tools.install.containerd import state_files

    entries = state_files(rec.get("containerd") or {})
    return list(dict.fromkeys(str(e.get("root") or e["path"]) for e in entries))


def _handlers(node: Node, root: str, libexec: str) -> tuple[dict[str, bool], list[str]]:
    """Per runc-type handler of ``root`` (and its imports, as containerd reads them): whether it
    runs the wrapper or one of our shims; and the files read (for their change times)."""
    read, listdir = read_in_root(node)
    files, version = ctdconfig.load(root, read, listdir)
    merged = ctdconfig.binaries(files, version)
    wrapper, shims = _ours(libexec)
    runc = {n: h for n, h in merged.items() if h.runtime_type in engines.RUNC_TYPES}
    found = {n: h.binary == wrapper or h.binary.startswith(shims) for n, h in runc.items()}
    return found or {"runc": False}, [f.path for f in files if f.exists]  # none: containerd's own runc


def _restart_needed(node: Node, root: str, paths: list[str]) -> str:
    """Words saying a containerd that loads ``root`` (the same directory: k3s renders its template
    beside the file it runs) started before the newest of ``paths`` changed; '' when none did."""
    proc = node.path(node.opts.proc)
    newest = max(((node.path(p).stat().st_mtime, p) for p in paths), default=(0.0, ""))
    here = root.rsplit("/", 1)[0]
    for daemon in ctdprocess.running(proc):
        if daemon.config.rsplit("/", 1)[0] != here or not daemon.started:
            continue
        if daemon.started + ctdprocess.START_SLACK < newest[0]:
            return f"{newest[1]} changed after containerd ({daemon.where}) started: restart needed"
    return ""


def judge(node: Node, rec: dict[str, Any]) -> dict[str, Any]:
    """``{"ok", "registered": {"containerd": {handler: bool}}, "problems": [...], "rewritten": [...]}``:
    ``registered`` is true per handler only where the file names us and containerd started after
    it changed; ``rewritten`` the root configs another tool rewrote (``repair`` registers those)."""
    registered: dict[str, bool] = {}
    problems: list[str] = []
    rewritten: list[str] = []
    libexec = str(rec.get("libexec") or node.opts.libexec)
    for root in _roots(rec) if rec.get("containerd") else []:
        try:
            found, paths = _handlers(node, root, libexec)
        except Exception as exc:  # a file another tool broke: not registered, said in one line
            registered["runc"] = False
            problems.append(f"{root}: cannot judge the registration: {exc}")
            rewritten.append(root)
            continue
        lost = sorted(n for n, ok in found.items() if not ok)
        if lost:
            problems.append(f"{root}: handler(s) {', '.join(lost)} no longer run the hook (the file was "
                            f"rewritten since it was registered)")  # fmt: skip
            rewritten.append(root)
        stale = _restart_needed(node, root, paths)
        if stale:
            problems.append(f"{root}: registered, {stale}")
        registered.update({n: ok and not stale for n, ok in found.items()})
    hooks = _hooks_d(node, rec, libexec, problems)
    out = {"ok": not problems, "problems": problems, "rewritten": rewritten, "time": int(time.time())}
    engines_seen = {"containerd": registered, "hooks.d": hooks}
    return {**out, "registered": {e: h for e, h in engines_seen.items() if h}}


def _hooks_d(node: Node, rec: dict[str, Any], libexec: str, problems: list[str]) -> dict[str, bool]:
    """The hooks.d files the installer wrote (CRI-O and podman read them at each container): each
    still there and naming this install's hook, by file name; a problem line for each that is not."""
    from hook.tools.install.hooksd import hooks_files, is_ours

    found = {}
    for path in hooks_files(rec) if rec.get("version") else []:
        ok = is_ours(node.path(path, follow=False), libexec)
        found[path.rsplit("/", 1)[-1]] = ok
        if not ok:
            why = f"gone, or no longer names {libexec}/hook (hooks.d engines do not run it)"
            problems.append(f"{path}: {why}")
    return found


def repair(node: Node, rec: dict[str, Any], *, shim_all: bool) -> list[str]:
    """Register again in the root configs another tool rewrote; what was repaired (one line each).
    The rewritten text becomes each file's new baseline: its backup is what an uninstall restores,
    so the other tool's work survives our removal."""
    from hook.tools.install.containerd import register_handlers, state_files

    verdict = judge(node, rec)
    done = _repair_hooks_d(node, rec, verdict)
    if not verdict["rewritten"]:
        return done
    state = rec["containerd"]
    entries = state_files(state)
    for entry in entries:
        try:
            now = sha(node.path(entry["path"]).read_bytes())
        except OSError:
            continue  # gone: register_handlers makes it again where containerd needs it
        if now != entry.get("sha256"):  # another tool's text: the new baseline
            entry.update(backup="", edits=[], created=False, sha256=now)
    rec["containerd"] = {**state, "files": entries}
    write_record(node, rec)
    register_handlers(node, rec, shim_all=shim_all)
    write_record(node, rec)
    fixed = [p for p in verdict["problems"] if any(p.startswith(f"{r}:") for r in verdict["rewritten"])]
    for line in fixed:
        say(f"repaired: {line}; registered again")
    return done + fixed


def _repair_hooks_d(node: Node, rec: dict[str, Any], verdict: dict[str, Any]) -> list[str]:
    """The installer's hooks.d files written again where one is gone or names another hook (an
    install's own step, with the install's mode and the package tree it runs from)."""
    from hook.tools.install.hooksd import register_hooks_d

    lost = [p for p in verdict["problems"] if "(hooks.d engines do not run it)" in p]
    if not lost:
        return []
    node.opts.mode = rec.get("mode") or node.opts.mode
    rec["hooks_files"] = register_hooks_d(node, Path(node.opts.src), rec)
    rec["hooks_file"] = rec["hooks_files"][0]
    write_record(node, rec)
    for line in lost:
        say(f"repaired: {line}; written again")
    return lost


def write_status(path: str, verdict: dict[str, Any]) -> None:
    """The verdict for ``hook metrics --registration`` and a readiness probe, replaced in one
    rename (a reader sees the old file or the new one); a path in the installer's own filesystem."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(verdict, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
