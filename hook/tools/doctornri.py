"""``hook doctor``'s NRI lines: which route each engine on the node uses, and what a missing daemon means.

Rule: the NRI route (``hook nri``, a node daemon) is asked by the engine about each container; when
the daemon is absent the engine either refuses containers or creates them unadjusted, and only its
configuration says which. Read as the engine reads it:

- containerd: the ``plugins."io.containerd.nri.v1.nri"`` table of the config containerd runs (its
  own ``config dump`` where the binary is there: defaults filled in). NRI is off unless
  ``disable = false`` in 1.7 and on unless ``disable = true`` from 2.0. The default validator's
  ``required_plugins`` (its ``default_validator`` table, ``enable = true``) exists from 2.2 (NRI
  0.10): there, and only there, a missing daemon refuses containers.
- CRI-O: ``[crio.nri]`` (``enable_nri``, on by default from 1.30; ``nri_listen``) and, from 1.34,
  ``[crio.nri.default_validator]`` (``nri_enable_default_validator``,
  ``nri_validator_required_plugins``, ``nri_validator_tolerate_missing_plugins_annotation``) of
  ``/etc/crio/crio.conf`` and its ``crio.conf.d`` drop-ins (later files win key by key).

A required plugin refuses every container while it is absent, the daemon's own pod and static
pods included, unless a pod carries the validator's toleration annotation with ``"true"``: without
that key configured the daemon cannot come back after a node restart. The validator counts a
plugin whose request timed out as present, so a slow daemon still lets that container through.
Pure functions judge a ``View``; ``views`` reads the node.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hook.core.record import record
from hook.tools.checks import Check

__all__ = ["View", "containerd_view", "crio_view", "judge", "daemon_pids", "version_of", "nri_checks"]

NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
TOLERATE = "tolerate-missing-nri-plugins.noderesource.dev"  # the conventional key; any key works
REQUIRED_FROM = {"containerd": (2, 2), "CRI-O": (1, 34)}


@record(kw_only=False)
class View:
    """What one engine's configuration says about NRI."""

    engine: str  # "containerd" or "CRI-O"
    version: tuple[int, ...]  # () when unknown
    enabled: bool
    socket: str
    required: tuple[str, ...] = ()  # the validator's required plugins (empty: validator off or absent)
    tolerate: str = ""  # the validator's toleration annotation key


def version_of(text: str) -> tuple[int, ...]:
    """The first dotted version standing as a word (``1.7.24~ds1``, ``v2.1.9``); () when none."""
    found = re.search(r"(?:^|\s)v?(\d+(?:\.\d+)+)", text)
    return tuple(int(p) for p in found.group(1).split(".")) if found else ()


def _table(doc: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    for key in path:
        nxt = doc.get(key) if isinstance(doc, Mapping) else None
        doc = nxt if isinstance(nxt, Mapping) else {}
    return doc


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def containerd_view(doc: Mapping[str, Any], version: tuple[int, ...]) -> View:
    """containerd's NRI as its effective config (a dump, or files with its defaults) says."""
    nri = _table(doc, "plugins", NRI_PLUGIN)
    disable = nri.get("disable")
    enabled = (not disable) if isinstance(disable, bool) else bool(version) and version >= (2,)
    socket = nri.get("socket_path") if isinstance(nri.get("socket_path"), str) else DEFAULT_SOCKET
    validator = _table(nri, "default_validator")
    required: tuple[str, ...] = ()
    if validator.get("enable") is True and version >= REQUIRED_FROM["containerd"]:
        required = _strings(validator.get("required_plugins"))
    tolerate = validator.get("tolerate_missing_plugins_annotation")
    return View("containerd", version, enabled, str(socket or DEFAULT_SOCKET), required,
                tolerate if isinstance(tolerate, str) else "")  # fmt: skip


def crio_view(doc: Mapping[str, Any], version: tuple[int, ...]) -> View:
    """CRI-O's NRI as its merged crio.conf says."""
    nri = _table(doc, "crio", "nri")
    on = nri.get("enable_nri")
    enabled = on if isinstance(on, bool) else bool(version) and version >= (1, 30)
    listen = nri.get("nri_listen")
    validator = _table(nri, "default_validator")
    required: tuple[str, ...] = ()
    if validator.get("nri_enable_default_validator") is True and version >= REQUIRED_FROM["CRI-O"]:
        required = _strings(validator.get("nri_validator_required_plugins"))
    tolerate = validator.get("nri_validator_tolerate_missing_plugins_annotation")
    return View("CRI-O", version, enabled, listen if isinstance(listen, str) and listen else DEFAULT_SOCKET,
                required, tolerate if isinstance(tolerate, str) else "")  # fmt: skip


def _same_socket(a: str, b: str) -> bool:
    """``/var/run`` is a link to ``/run`` on every current distribution."""
    norm = [p.replace("/var/run/", "/run/", 1) for p in (os.path.normpath(a), os.path.normpath(b))]
    return norm[0] == norm[1]


def judge(v: View, name: str, socket: str, daemons: Sequence[int], other_route: bool) -> list[Check]:
    """The two lines of one engine: its route, and what happens while the daemon is missing.

    ``name``/``socket``: the daemon's plugin name and socket (the settings); ``daemons``: the pids
    of running ``hook nri`` processes; ``other_route``: this engine's spec-level or hook route is
    registered as well (the wrapper for containerd, hooks.d for CRI-O)."""
    label = f"{v.engine} {'.'.join(map(str, v.version)) or '(version unknown)'}"
    wanted = bool(daemons) or name in v.required
    route = f"route ({v.engine})"
    fallback = "the runtime wrapper" if v.engine == "containerd" else "the hooks.d hook"
    if not wanted:
        what = f"{fallback} (no `hook nri` daemon runs and none is required)"
        if not other_route:
            what = "not the NRI route (no `hook nri` daemon runs and none is required)"
        return [Check(route, True, f"{label}: {what}")]
    pids = ", ".join(map(str, daemons))
    running = f"`hook nri` runs (pid {pids})" if daemons else "`hook nri` is not running"
    if not v.enabled:
        fix = ("containerd 1.7: set disable = false in [plugins.\"io.containerd.nri.v1.nri\"]"
               if v.engine == "containerd" else "set enable_nri = true in [crio.nri]")  # fmt: skip
        return [Check(route, False, f"{label}: {running}, but NRI is off: it is never asked", fix)]
    if not _same_socket(v.socket, socket):
        fix = f"set nri_socket: {v.socket} in the settings, or the engine's socket to {socket}"
        return [
            Check(route, False, f"{label}: NRI listens on {v.socket}, the daemon connects to {socket}", fix)
        ]
    both = f" and {fallback} (each container decided twice)" if other_route else ""
    lines = [
        Check(
            route,
            bool(daemons),
            f"{label}: NRI ({running}, registers as {name} at {socket}){both}",
            "" if daemons else "start the daemon (the DaemonSet or oci-device-hook-nri.service)",
        )
    ]
    lines.append(_missing(v, name, other_route, fallback))
    return lines


def _missing(v: View, name: str, other_route: bool, fallback: str) -> Check:
    """What the engine does with a container while the daemon is absent."""
    what = f"missing daemon ({v.engine})"
    if name in v.required:
        if not v.tolerate:
            fix = (
                f"set the validator's toleration annotation key (e.g. {TOLERATE}) and give the daemon's "
                'pod (and static pods) that annotation with "true"'
            )
            return Check(what, True, f"refuses containers (required_plugins lists {name}); no toleration "
                         "annotation key is set: the daemon's own pod cannot start while it is missing", fix,
                         warn=True)  # fmt: skip
        return Check(what, True, f"refuses containers (required_plugins lists {name}); pods annotated "
                     f"{v.tolerate}: \"true\" start anyway (the daemon's own pod must be); a request that "
                     "times out still lets its container through")  # fmt: skip
    since = ".".join(map(str, REQUIRED_FROM[v.engine]))
    if other_route:
        return Check(what, True, f"NRI lets containers start unadjusted, and {fallback} still decides "
                     "each one (fail-closed)")  # fmt: skip
    can = (
        f"list {name} in required_plugins"
        if v.version >= REQUIRED_FROM[v.engine]
        else f"upgrade to {v.engine} >= {since} and list {name} in required_plugins"
    )
    return Check(what, True, "lets containers start unadjusted while the daemon is away (narrowed late, "
                 "within 10 s of its return, `late: true` in the log)",
                 f"{can}, or keep {fallback} registered", warn=True)  # fmt: skip


# --- the node ------------------------------------------------------------------------------------


def daemon_pids(proc: Path) -> list[int]:
    """Running ``hook nri`` daemons: a command line whose word after one ending in ``hook`` is ``nri``."""
    pids = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"hook") and b == b"nri" for a, b in itertools.pairwise(argv)):
            pids.append(int(entry.name))
    return sorted(pids)


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def containerd_doc(binary: str | None, config: Path) -> dict[str, Any]:
    """containerd's own ``config dump`` of ``config`` (defaults filled in), else the file itself."""
    if binary:
        dumped = _run([binary, "--config", str(config), "config", "dump"])
        if dumped:
            try:
                return tomllib.loads(dumped)
            except ValueError:
                pass
    return _toml(config)


def crio_doc(host_root: Path) -> dict[str, Any]:
    doc = _toml(host_root / "etc/crio/crio.conf")
    drop = host_root / "etc/crio/crio.conf.d"
    for path in sorted(drop.glob("*.conf")) if drop.is_dir() else []:
        _merge(doc, _toml(path))
    return doc


def running_binary(proc: Path, config: Path | None) -> str | None:
    """The binary of the running containerd that serves ``config`` (``/proc/<pid>/exe``): the one
    whose defaults and NRI module are in force, whichever ``containerd`` is first on the path."""
    from hook.tools import ctdprocess

    if config is None:
        return None
    for src in ctdprocess.running(proc):
        exe = proc / src.where.removeprefix("pid ") / "exe"
        if os.path.realpath(src.config) == os.path.realpath(config) and os.access(exe, os.X_OK):
            return str(exe)
    return None


def nri_checks(
    host_root: Path,
    proc: Path,
    containerd_config: Path | None,
    settings_file: Path,
    wrapper_registered: bool,
    hooks_registered: bool,
) -> tuple[list[Check], bool]:
    """Every engine's NRI lines, and whether containerd's containers are on the NRI route."""
    from hook.tools.doctorctd import containerd_binary

    try:
        from hook.sources.settingsfile import load_settings

        s = load_settings(settings_file) if settings_file.exists() else None
    except Exception:  # check_settings reports a bad file; judge with the defaults here
        s = None
    name = getattr(s, "nri_plugin_name", "oci-device-hook")
    socket = getattr(s, "nri_socket", DEFAULT_SOCKET)
    daemons = daemon_pids(proc)
    out: list[Check] = []
    on_nri = False
    binary = running_binary(proc, containerd_config) or containerd_binary()
    if containerd_config is not None and containerd_config.exists():
        version = version_of(_run([binary, "--version"])) if binary else ()
        view = containerd_view(containerd_doc(binary, containerd_config), version)
        lines = judge(view, name, socket, daemons, wrapper_registered)
        on_nri = len(lines) > 1
        out += lines
    crio = next((b for b in ("/usr/bin/crio", "/usr/local/bin/crio") if os.access(b, os.X_OK)), None)
    if crio or (host_root / "etc/crio/crio.conf").exists():
        version = version_of(_run([crio, "--version"])) if crio else ()
        out += judge(crio_view(crio_doc(host_root), version), name, socket, daemons, hooks_registered)
    return out, on_nri
