"""``hook doctor``'s containerd lines: do the runc handlers of the config containerd runs name the wrapper?

Rule: the judge is containerd's own ``config dump`` where the binary is there, else the config and
its imports under both merge rules (``hook.tools.ctdconfig``); base runtime specs are judged for
the order of our hook after NVIDIA's.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from hook.tools import ctdprocess
from hook.tools.checks import HOOK_PATH, LIBEXEC, Check

CONTAINERD_BINARIES = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/bin/containerd")








def _host_reader() -> tuple[Any, Any]:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None

    def listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    return read, listdir


def containerd_binary() -> str | None:
    """The node's containerd, whose own ``config dump`` says what it runs with."""
    return next((b for b in CONTAINERD_BINARIES if os.access(b, os.X_OK)), None)


def _dumped(binary: str, config: Path) -> tuple[int, list[Any], str]:
    """(version, handlers) as ``containerd --config F config dump`` reads F and its imports."""
    import subprocess

    from hook.tools.engines import config_version, cri_plugin, handlers_in, parse

    proc = subprocess.run(
        [binary, "--config", str(config), "config", "dump"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ValueError(
            f"containerd cannot load it: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
        )
    doc = parse(proc.stdout, f"{binary} config dump")
    version = config_version(doc, False)
    if cri_plugin(version) not in (doc.get("plugins") or {}):
        raise LookupError("the CRI plugin is disabled: no handlers in the dump")
    return version, handlers_in(doc, version), str(doc.get("grpc", {}).get("address") or "")


def _judge(config: Path, how: str, version: int, found: list[Any], libexec: str) -> Check:
    from hook.tools.engines import RUNC_TYPES

    fix = "run the installer (packaging/kubernetes; a .deb: installer register) and restart containerd"
    where = f"{config} ({how})"
    runc = [h for h in found if h.runtime_type in RUNC_TYPES]
    if not runc:
        return Check("containerd", False, f"{where}: containerd's implicit runc handler not registered", fix)
    ours = {f"{libexec}/runtime"} | {f"{libexec}/handlers/{h.name}" for h in runc}
    names = {h.name: f"{h.name}{' (default)' if h.default else ''}" for h in runc}
    missing = [names[h.name] for h in runc if h.binary not in ours]
    if missing:
        return Check("containerd", False, f"{where}: handler(s) {', '.join(missing)} not registered", fix)
    listed = ", ".join(names.values())
    return Check(
        "containerd", True, f"{config} (version {version}, {how}): {listed} run the wrapper (spec level)"
    )


def check_containerd(
    config: Path,
    libexec: str = LIBEXEC,
    *,
    binary: str | None = "",
) -> Check:
    """containerd: every runc-type runtime handler of the configuration containerd actually runs
    (its own ``config dump`` where the binary is there, else ``config`` and its imports under
    both merge rules, ``hook.tools.ctdconfig``) runs the runtime wrapper (spec-level mode).
    ``check_node`` says whether this is the config containerd runs."""
    from hook.tools import ctdconfig

    if not config.exists():
        return Check("containerd", True, f"{config} absent: containerd not configured on this node")
    binary = containerd_binary() if binary == "" else binary
    try:
        read, listdir = _host_reader()
        files, version = ctdconfig.load(str(config), read, listdir)  # refuses what the installer would
        dumped: tuple[int, list[Any], str] | None = None
        if binary:
            with contextlib.suppress(LookupError):  # CRI disabled: judged from the files below
                dumped = _dumped(binary, config)
        if dumped is not None:
            version, found, _ = dumped
            check = _judge(config, "containerd config dump", version, found, libexec)
        else:
            check = Check("containerd", True, "")
            for rule in ctdconfig.RULES:
                how = f"{len(files)} file(s), containerd {'1.x' if rule == 'replace' else '2.x'} merge"
                found = ctdconfig.effective_handlers(files, version, rule)
                check = _judge(config, how, version, found, libexec)
                if not check.ok:
                    break
    except Exception as exc:  # a doctor reports; it never crashes on what it inspects
        check = Check("containerd", False, str(exc), "fix the config, then run the installer")
    return check


def check_node(host_root: Path, proc: Path, libexec: str, given: Path | None = None) -> tuple[Check, Path]:
    """The checklist's containerd line, and the config it judged: the one the running containerd
    was started with (its command line in ``proc``), else the one its unit would start it with,
    else ``given`` or the default, saying that it cannot tell. Never ``✓`` beside a failure: a
    config no running containerd uses is a ``!`` warning when it is not registered."""
    daemons = ctdprocess.running(proc)
    src, which = _judged(daemons, proc, host_root) if daemons else (None, "")
    if src is not None:
        config = host_root / src.config.lstrip("/")
        runs = f"containerd runs {src.config} ({src.where}){which}"
        if not config.exists():
            why = f"{runs}, which is absent: its built-in runc handler does not run the wrapper"
            return Check("containerd", False, why, _FIX), config
        check = check_containerd(config, libexec)
        if given is not None and given.resolve() != config.resolve():
            judged = check_containerd(given, libexec)
            also = "registered" if judged.ok else "not registered either"
            why = f"{runs}, not {given} ({also}): {check.detail}"
            return Check("containerd", False, why, check.fix or _FIX), given
        stale = _changed_since(config, src.started) if check.ok else ""
        if stale:
            why = f"registered, restart needed: {stale}; {check.detail}; {runs}"
            return Check("containerd", False, why, _RESTART), config
        return Check("containerd", check.ok, f"{check.detail}; {runs}", check.fix), config
    if given is not None:
        how = f"no containerd process in {proc}{which}"
        return _not_running(check_containerd(given, libexec), how), given
    unit = ctdprocess.from_unit(host_root)
    if unit is not None:
        config = host_root / unit.config.lstrip("/")
        check = check_containerd(config, libexec)
        if not config.exists():
            check = Check("containerd", False, f"{config} absent: the built-in runc handler", _FIX)
        return _not_running(check, f"its unit {unit.where} starts it with {unit.config}{which}"), config
    config = host_root / ctdprocess.likely_config(host_root).lstrip("/")
    check = check_containerd(config, libexec)
    if not config.exists():
        return check, config  # no process, no unit, no config: not a containerd node
    none = "no process" if not daemons else "none that serves the kubelet"
    how = f"cannot tell which config it would run: {none}, no unit; judged {config}{which}"
    return _not_running(check, how), config


_FIX = "run the installer (packaging/kubernetes; a .deb: installer register) and restart containerd"
_RESTART = "restart containerd (systemctl restart containerd; k3s, rke2: their unit) to read the registration"


def _address(src: ctdprocess.Source, host_root: Path) -> str:
    """The socket a containerd serves: its ``--address``, else its config's ``[grpc] address``,
    else containerd's default."""
    if src.address:
        return src.address
    from hook.tools.engines import parse

    try:
        doc = parse((host_root / src.config.lstrip("/")).read_text(), src.config)
        return str((doc.get("grpc") or {}).get("address") or ctdprocess.DEFAULT_SOCKET)
    except Exception:  # absent or unreadable: judged (and reported) by check_containerd
        return ctdprocess.DEFAULT_SOCKET


def _judged(
    daemons: list[ctdprocess.Source], proc: Path, host_root: Path
) -> tuple[ctdprocess.Source | None, str]:
    """The containerd that serves the CRI socket the node's kubelet uses (Docker's own, a test's or
    k3s's beside it are not the node's runtime), and the words saying which and which others run;
    None where a kubelet names a socket no containerd serves (the node's runtime is another, or its
    containerd is down: judged as not running)."""
    socket, how = ctdprocess.cri_socket(proc, host_root)
    addressed = [(d, _address(d, host_root)) for d in daemons]
    serving = [d for d, a in addressed if a == socket]
    kubelet = how.startswith("the kubelet")
    if not serving and kubelet:
        running = ", ".join(f"{d.where} on {a} with {d.config}" for d, a in addressed)
        return None, f"; the kubelet's CRI socket {socket} ({how}) is served by none of: {running}"
    src = serving[0] if serving else daemons[0]
    if len(daemons) == 1 and (serving or not kubelet):
        return src, ""  # the only one, and no kubelet that names another socket
    which = (
        f", the one serving the node's CRI socket {socket} ({how})"
        if serving
        else f"; none serves the node's CRI socket {socket} ({how}): judged the first"
    )
    others = [f"{d.where} on {a} with {d.config}" for d, a in addressed if d is not src]
    return src, which + (f"; also running: {', '.join(others)}" if others else "")


def _changed_since(config: Path, started: float) -> str:
    """The newest of the files containerd loads for ``config`` (it and its imports) where it changed
    after containerd started (containerd reads its config once, at start); '' where none did, or
    where the start time is unknown."""
    from hook.tools import ctdconfig

    if not started:
        return ""
    try:
        read, listdir = _host_reader()
        files, _ = ctdconfig.load(str(config), read, listdir)
        newest = max((os.stat(f.path).st_mtime, f.path) for f in files if f.exists)
    except Exception:  # check_containerd judged the files; an unreadable one is reported there
        return ""
    if newest[0] <= started + ctdprocess.START_SLACK:
        return ""
    import time

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))

    return f"{newest[1]} changed at {when(newest[0])}, after containerd started at {when(started)}"


def _not_running(check: Check, how: str) -> Check:
    """A judged config no running containerd uses: ✓ when registered, else a ! warning (a podman
    host may have containerd's package and config without running it)."""
    if check.ok:
        return Check("containerd", True, f"{check.detail}; containerd is not running ({how})")
    return Check("containerd", True, f"not running ({how}): {check.detail}", check.fix, warn=True)


def _base_spec_check(handler: str, field: str, spec_file: str, libexec: str) -> Check:
    from hook.tools.engines import base_spec_hooks, runs_after_nvidia

    name = f"containerd base spec ({handler})"
    where = f"{spec_file} (from {field})"
    try:
        spec = json.loads(Path(spec_file).read_text())
    except (OSError, ValueError) as exc:
        return Check(name, False, f"{where}: not readable JSON ({exc})", f"fix or remove {field}")
    if not isinstance(spec, dict):
        return Check(name, False, f"{where}: not a JSON object", f"fix or remove {field}")
    found = base_spec_hooks(spec, [HOOK_PATH, f"{libexec}/hook"])
    ours = ", ".join(f"{s} #{i}" for s, h in found.items() for i in h.ours) or "not registered"
    nvidia = "NVIDIA's hook present" if any(h.nvidia for h in found.values()) else "no NVIDIA hook"
    detail = f"{where}: ours {ours}; {nvidia}"
    after = runs_after_nvidia(found)
    if after is False:
        fix = f"in {spec_file}, move the {libexec}/hook entry after NVIDIA's (prestart runs first)"
        return Check(name, False, f"{detail}; ours runs before NVIDIA's", fix)
    return Check(name, True, f"{detail}{'; ours runs after it' if after else ''}")


def check_base_spec(config: Path, libexec: str = LIBEXEC) -> list[Check]:
    """containerd: for each runtime handler with a ``base_runtime_spec``, whether that OCI spec
    registers our hook, and whether it runs after NVIDIA's hook (runc runs prestart, then
    createRuntime, each in array order); ``[]`` when no handler names a base spec."""
    from hook.tools import ctdconfig
    from hook.tools.engines import cri_plugin

    try:
        read, listdir = _host_reader()
        files, version = ctdconfig.load(str(config), read, listdir)
        found = ctdconfig.effective_handlers(files, version, "merge")
    except Exception:  # check_containerd reports an unreadable config already
        return []
    prefix = f'plugins."{cri_plugin(version)}".containerd.runtimes'
    return [
        _base_spec_check(h.name, f"{config}: {prefix}.{h.name}.base_runtime_spec", h.base_spec, libexec)
        for h in found
        if h.base_spec
    ]
