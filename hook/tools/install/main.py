"""Install, register, upgrade, roll back and uninstall the hook on a node (the DaemonSet's work).

Rule: the imperative shell around ``hook.tools.engines``. Each version lives in its own directory,
``<prefix>/versions/<version>``, with its own interpreter (the tree's bundled ``python/``, started
through its own loader, so the node's python3 and libc play no part) or, only when the operator
names one with ``--python``, on the node's Python; one symlink, ``<prefix>/current``, is switched
by renaming a new symlink over it, so a hook that has started keeps importing from the version it
started with (each version's launcher names that version's paths). The prefix is a setting
(``--prefix``): ``/usr/libexec/oci-device-hook`` by default, a writable, exec-able path such as
``/opt/oci-device-hook`` or ``/home/kubernetes/bin/oci-device-hook`` where ``/usr`` is read-only.
Nothing is registered before the new version's interpreter runs it inside the node's root.
Every change to an engine's config is recorded in ``<state>/install.json`` with what it replaced,
so uninstall undoes exactly that and nothing else. Engines are restarted only when asked.

Paths given as options are the node's paths (what the engine reads); ``--root`` says where the
node's filesystem is mounted (``/host`` in the DaemonSet) and ``chroot`` runs the node's Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hook.core.errors import HookError, InputError
from hook.tools import engines
from hook.tools.install.containerd import (
    containerd_wanted,
    engine_unit,
    register_handlers,
    restart_engine,
    restart_hint,
    restore_handlers,
)
from hook.tools.install.hooksd import hooks_files, is_ours, register_hooks_d
from hook.tools.install.layout import (
    bundled_version,
    check_paths,
    check_python,
    place_settings,
    prune,
    stage_version,
    switch,
    tree_version,
)
from hook.tools.install.node import DEFAULTS, PKG, PLAIN_PATH, InstallError, Node, say
from hook.tools.install.nriroute import ROUTES, choose
from hook.tools.install.state import (
    RECORD,
    leave_pass_throughs,
    named_by_tasks,
    purge_pass_throughs,
    read_list,
    read_record,
    task_dirs,
    write_list,
    write_record,
)

DPKG_LIST = "/var/lib/dpkg/info/oci-device-hook.list"


def _plain_paths(opts: argparse.Namespace) -> None:
    """The paths a launcher, the wrapper or a shim names unquoted or bakes in: plain and absolute."""
    python = opts.python or "/usr/bin/python3"
    for option, value in (("--prefix", opts.libexec), ("--python", python), ("--etc", opts.etc)):
        if not PLAIN_PATH.fullmatch(value):
            raise InstallError(option, value, "expected a plain absolute path")


def install(node: Node) -> int:
    opts = node.opts
    src = Path(opts.src)
    dpkg_owned = opts.libexec == DEFAULTS["libexec"]  # the .deb's files live there
    if dpkg_owned and node.path(DPKG_LIST).exists():
        why = "installed by dpkg on this node: `installer register` registers its engines"
        raise InstallError("dpkg", PKG, why)
    _plain_paths(opts)
    check_paths(node)
    python_version = check_python(node) if opts.python else f"{bundled_version(src)} (bundled)"
    version = tree_version(src)
    rec = read_record(node)
    if rec.get("containerd") and rec.get("libexec", opts.libexec) != opts.libexec:
        # containerd's shims keep the wrapper's path for as long as their containers live
        raise InstallError(
            "--libexec",
            opts.libexec,
            f"containerd runs the wrapper from {rec['libexec']}: an upgrade keeps "
            "that path (uninstall first to move it)",
        )
    stage_version(node, src, version)
    settings_changed = place_settings(node, version, Path(opts.settings) if opts.settings else None, src)
    switch(node, version)
    rec.update(version=version, python=python_version, libexec=opts.libexec, mode=opts.mode, etc=opts.etc)
    history = [v for v in rec.get("history", []) if v != version] + [version]
    rec["history"] = history[-10:]
    rec["hooks_files"] = register_hooks_d(node, src, rec)
    rec["hooks_file"] = rec["hooks_files"][0]
    write_record(node, rec)
    changed = False
    if containerd_wanted(node) and choose(node, rec):
        changed = register_handlers(node, rec)
    rec["versions"] = prune(node, opts.keep, rec["history"])
    write_record(node, rec)
    if changed and opts.restart_engine:
        restart_engine(node, engine_unit(node, rec))
    where = f"hooks.d ({', '.join(rec['hooks_files'])})" + (", containerd" if "containerd" in rec else "")
    note = f"; {settings_changed}" if settings_changed else ""
    restart = f" ({restart_hint(rec)})" if changed and not opts.restart_engine else ""
    say(f"installed {version} for Python {python_version}; registered with {where}{restart}{note}")
    return 0


def register(node: Node) -> int:
    """The engine step alone, for a hook installed by other means (the .deb ships the hooks.d
    file and the wrapper): containerd's handlers, recorded like an install's so ``unregister``
    (the .deb's prerm on remove) undoes exactly that. Each handler runs a shim under
    ``<prefix>/handlers/``, outside the package's file list: removing the package leaves them."""
    opts = node.opts
    if opts.engine == "hooks.d" or not containerd_wanted(node):
        say("no containerd on this node: nothing to register (hooks.d engines read the packaged file)")
        return 0
    rec = read_record(node)
    if not choose(node, rec):
        say("containerd: the NRI route alone; its handlers left as they are; start hook nri "
            "(systemctl enable --now oci-device-hook-nri, or the NRI DaemonSet)")
        return 0
    if rec.get("version") and not rec.get("registered_only"):
        raise InstallError(
            opts.state_dir, RECORD, "installed by the installer: `installer install` registers"
        )
    previous = rec.get("containerd") or {}
    if opts.containerd_config == DEFAULTS["containerd_config"] and previous.get("config"):
        opts.containerd_config = previous["config"]  # registering again (the .deb's postinst) keeps it
    if opts.etc == DEFAULTS["etc"] and rec.get("etc"):
        opts.etc = rec["etc"]
    _plain_paths(opts)
    rec.update(libexec=opts.libexec, registered_only=True, etc=opts.etc)
    changed = register_handlers(node, rec, shim_all=True)
    write_record(node, rec)
    if changed and opts.restart_engine:
        restart_engine(node, engine_unit(node, rec))
    files = ", ".join(f["path"] for f in rec["containerd"]["files"])
    restart = f" ({restart_hint(rec)})" if changed and not opts.restart_engine else ""
    say(
        f"registered containerd ({files}){restart}" if changed else f"containerd already registered ({files})"
    )
    return 0


def unregister(node: Node) -> int:
    """Undo ``register``: containerd's handlers back as they were, the record gone, and each shim a
    pass-through (containerd's shims of running tasks still run it; the package's removal, which
    calls this, does not delete them). A purge deletes the ones no task names any more."""
    opts = node.opts
    rec = read_record(node)
    state = rec.get("containerd")
    if not state or not rec.get("registered_only"):
        say("nothing registered by `installer register` on this node")
        return 0
    opts.etc = rec.get("etc") or opts.etc
    changed = restore_handlers(node, state)
    libexec = rec.get("libexec") or opts.libexec
    left = leave_pass_throughs(node, rec, libexec, packaged=True)
    for shim in state.get("shims", []):
        if shim not in left:
            node.path(shim, follow=False).unlink(missing_ok=True)
    node.path(f"{opts.state_dir}/{RECORD}", follow=False).unlink(missing_ok=True)
    if changed and opts.restart_engine:
        restart_engine(node, engine_unit(node, rec))
    left, dirs = _leftovers(node, rec, left, changed)
    for d in (node.path(f"{libexec}/handlers"), node.path(opts.state_dir)):
        with contextlib.suppress(OSError):
            d.rmdir()
    restart = f" ({restart_hint(rec)})" if changed and not opts.restart_engine else ""
    say(f"unregistered containerd{restart}")
    _say_left(node, left, dirs)
    return 0


def _say_left(node: Node, left: list[str], dirs: list[str]) -> None:
    if left:
        tasks = sum(named_by_tasks(node, left, dirs).values())
        say(
            f"left pass-throughs to the real runtime at {', '.join(left)}: containerd shims of containers "
            "created through the wrapper still run them; a purge deletes each once containerd runs its "
            f"restored config and no task names it ({tasks} under {node.opts.containerd_state} now)"
        )


def apply_settings(node: Node) -> int:
    """Re-apply ``--settings`` to the installed version (the DaemonSet's ConfigMap watch)."""
    rec = read_record(node)
    if not rec.get("version") or not node.opts.settings:
        raise InstallError(node.opts.state_dir, "version", "not installed, or no --settings given")
    done = place_settings(node, rec["version"], Path(node.opts.settings), Path(node.opts.src))
    if done:
        say(done)
    return 0


def uninstall(node: Node) -> int:
    opts = node.opts
    rec = read_record(node)
    if rec.get("registered_only"):  # the files are dpkg's: only the engine step is ours to undo
        why = "registered by `installer register`: `installer unregister` undoes it"
        raise InstallError(opts.state_dir, RECORD, why)
    hooks_file = node.path(f"{opts.hooks_dir}/{engines.HOOKS_NAME}", follow=False)
    if not rec and not node.path(opts.libexec).exists() and not hooks_file.exists():
        say(f"nothing to remove under {node.root}: not installed (no {opts.state_dir}/{RECORD}, "
             f"no {opts.libexec})")
        return 0
    libexec = rec.get("libexec") or opts.libexec  # the install's own prefix: no --prefix to undo it
    opts.etc = rec.get("etc") or opts.etc  # and its own settings (the wrapper's `runtime`, --purge)
    for path in {*hooks_files(rec), f"{opts.hooks_dir}/{engines.HOOKS_NAME}"}:
        target = node.path(path, follow=False)
        if target.exists() and is_ours(target, libexec):
            target.unlink()
    changed = False
    state = rec.get("containerd")
    if state:
        # the handlers first: a config that cannot be restored stops here with the wrapper still
        # deciding, never with a pass-through the config still names
        changed = restore_handlers(node, state)
    left = leave_pass_throughs(node, rec, libexec)
    if state:
        for shim in state.get("shims", []):
            if shim not in left:
                node.path(shim).unlink(missing_ok=True)
        if state.get("backup"):
            node.path(state["backup"]).unlink(missing_ok=True)
    base = node.path(libexec)
    for name in ("hook", "runtime", "installer", "current"):
        p = base / name
        if (p.is_symlink() or p.is_file()) and f"{libexec}/{name}" not in left:
            p.unlink()
    for name in ("versions", "handlers", "lib"):
        if name != "handlers" or not any(x.startswith(f"{libexec}/handlers/") for x in left):
            shutil.rmtree(base / name, ignore_errors=True)
    (node.path(opts.state_dir) / RECORD).unlink(missing_ok=True)
    if changed and opts.restart_engine:
        restart_engine(node, engine_unit(node, rec))
    if opts.purge:
        shutil.rmtree(node.path(opts.etc), ignore_errors=True)
    left, dirs = _leftovers(node, rec, left, changed)
    for d in (base / "handlers", base, node.path(opts.state_dir)):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: whatever else is there is not ours
    restart = f" ({restart_hint(rec)})" if changed and not opts.restart_engine else ""
    say(f"removed{' ' + rec['version'] if rec.get('version') else ''}{restart}")
    _say_left(node, left, dirs)
    return 0


def _leftovers(
    node: Node, rec: dict[str, Any], left: list[str], changed: bool
) -> tuple[list[str], list[str]]:
    """The pass-throughs left now and by earlier uninstalls, less what ``--purge`` deleted (those no
    task names, once containerd runs its restored config), recorded for a later purge."""
    earlier, when = read_list(node)
    since = time.time() if changed or when is None else when
    paths = sorted({*left, *earlier})
    dirs = task_dirs(node, rec)
    if node.opts.purge:
        paths = purge_pass_throughs(node, paths, dirs, since)
    write_list(node, paths, dirs, since)
    return paths, dirs


def status(node: Node) -> int:
    """The record; with ``--check`` or ``--write``, the drift verdict beside it (``drift.judge``),
    and with ``--check`` exit 1 when containerd does not run the hook for every handler."""
    rec = read_record(node)
    if not (node.opts.check or node.opts.write):
        print(json.dumps(rec, indent=2, sort_keys=True))
        return 0
    from hook.tools.install import drift

    verdict = drift.judge(node, rec)
    if node.opts.write:
        drift.write_status(node.opts.write, verdict)
    print(json.dumps({**rec, "drift": verdict}, indent=2, sort_keys=True))
    for problem in verdict["problems"]:
        say(f"drift: {problem}")
    return 1 if node.opts.check and not verdict["ok"] else 0


def repair(node: Node) -> int:
    """Register again where another tool rewrote containerd's config (the DaemonSet's loop, each
    poll): one line per repair; with ``--restart-engine`` containerd restarts to read it."""
    from hook.tools.install import drift

    rec = read_record(node)
    if not rec.get("containerd") and not rec.get("version"):
        return 0  # nothing the installer registered here: nothing to drift
    if rec.get("registered_only"):
        node.opts.etc = rec.get("etc") or node.opts.etc  # the shims bake the settings path in
    node.opts.libexec = rec.get("libexec") or node.opts.libexec
    done = drift.repair(node, rec, shim_all=bool(rec.get("registered_only")))
    if done and node.opts.restart_engine:
        restart_engine(node, engine_unit(node, rec))
    elif done:
        say(restart_hint(rec))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="installer", description="install oci-device-hook on a node")
    p.add_argument("action", choices=["install", "uninstall", "settings", "status", "register", "unregister",
                                      "teardown", "repair"])  # fmt: skip
    p.add_argument("--root", default="/", help="where the node's filesystem is mounted (DaemonSet: /host)")
    p.add_argument("--src", default="", help="the package's file tree (default: the one this runs from)")
    p.add_argument("--prefix", "--libexec", dest="libexec", default=DEFAULTS["libexec"],
                   help="where the hook goes on the node (a read-only /usr: /opt/oci-device-hook, ...)")
    p.add_argument("--hooks-dir", default=DEFAULTS["hooks_dir"])
    p.add_argument("--etc", default=DEFAULTS["etc"])
    p.add_argument("--state-dir", default=DEFAULTS["state_dir"])
    p.add_argument("--containerd-config", default=DEFAULTS["containerd_config"])
    p.add_argument("--containerd-state", default=DEFAULTS["containerd_state"], help="containerd's state dir")
    p.add_argument("--python", default="", help="run the hook on this node interpreter (>= 3.11) instead of "
                   "the bundled one")
    p.add_argument("--engine", choices=["auto", "hooks.d", "containerd", "all"], default="auto")
    p.add_argument("--mode", choices=["prestart", "precreate"], default="prestart", help="hooks.d stage")
    p.add_argument("--route", choices=list(ROUTES), default="wrapper", help="containerd: its handlers run "
                   "the wrapper (default), hook nri alone, or both (docs/operators/nri.md)")
    p.add_argument("--accept-unadjusted", action="store_true",
                   help="--route nri where containerd cannot refuse containers without the daemon")
    p.add_argument("--settings", default="", help="settings file to apply when it differs (a ConfigMap)")
    p.add_argument("--restart-engine", action="store_true", help="restart containerd when its config changed")
    p.add_argument("--keep", type=int, default=3, help="versions kept for rollback")
    p.add_argument("--purge", action="store_true", help="uninstall: also remove the settings directory; "
                   "both: each pass-through no task names, once containerd runs its restored config")
    p.add_argument("--proc", default="/proc", help="the node's procfs (which containerd runs, since when)")
    p.add_argument("--daemonset", default="oci-device-hook", help="teardown: NAMESPACE/NAME or NAME (Helm's)")
    p.add_argument("--timeout", type=float, default=600, help="teardown: seconds to wait for the rollout")
    p.add_argument("--api", default="", help="teardown: the API server (default: the pod's service env)")
    p.add_argument("--check", action="store_true", help="status: exit 1 on drift (not registered, or "
                   "registered after containerd started)")
    p.add_argument("--write", default="", help="status: also write the drift verdict to this file (the "
                   "installer's own path: hook metrics --registration, a readiness probe)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if not opts.src:
        # this file is <tree>/usr/libexec/oci-device-hook/lib/hook/tools/install/main.py
        opts.src = str(Path(os.path.realpath(__file__)).parents[7])
    node = Node(opts.root, opts)
    try:
        if opts.action == "install":
            return install(node)
        if opts.action == "uninstall":
            return uninstall(node)
        if opts.action == "settings":
            return apply_settings(node)
        if opts.action == "register":
            return register(node)
        if opts.action == "unregister":
            return unregister(node)
        if opts.action == "teardown":  # Helm's pre-delete hook (teardown.py): no node is touched
            from hook.tools.install.teardown import teardown

            ns, _, name = opts.daemonset.rpartition("/")
            return teardown(ns or os.environ.get("POD_NAMESPACE", "default"), name, opts.timeout, opts.api)
        if opts.action == "repair":
            return repair(node)
        return status(node)
    except (HookError, InputError) as exc:
        say(str(exc))
        return exc.exit_code
    except OSError as exc:
        say(f"{exc.filename or ''}: {exc.strerror or exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
