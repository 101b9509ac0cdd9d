"""containerd registration: every runc-type handler of the config containerd runs names the wrapper.

Rule: the imperative shell around ``hook.tools.engines`` and ``hook.tools.ctdconfig``. Every file
containerd loads is edited as text, its backup and the edits recorded before it changes, and the
node's own ``containerd config dump`` must then read the registration, or every file goes back.
Undoing restores byte for byte where nobody edited the file since, else only our lines.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from typing import Any

from hook.core.errors import InputError
from hook.tools import ctdconfig, ctdedit, engines
from hook.tools.install.node import (
    DEFAULTS,
    InstallError,
    Node,
    atomic_write,
    read_in_root,
    say,
    sh_quote,
    sha,
    toml_ok,
)
from hook.tools.install.state import write_record

CONTAINERD_BINARIES = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/bin/containerd")


K3S_AGENT_DIRS = ("/var/lib/rancher/k3s/agent", "/var/lib/rancher/rke2/agent")


def containerd_wanted(node: Node) -> bool:
    if node.opts.engine in ("containerd", "all"):
        return True
    if node.opts.engine == "hooks.d":
        return False
    return (
        node.path(node.opts.containerd_config).exists()
        or any(node.path(b).exists() for b in CONTAINERD_BINARIES)
        or any(node.path(f"{a}/etc/containerd/config.toml").exists() for a in K3S_AGENT_DIRS)
    )


def _handler_shim(node: Node, handler: str, real: str) -> str:
    """A per-handler entry for a handler whose runc binary is not runc (e.g. nvidia-container-runtime):
    the wrapper with ``OCI_DEVICE_HOOK_REAL_RUNTIME`` naming the binary it replaces."""
    path = f"{node.opts.libexec}/handlers/{handler}"
    script = (
        "#!/bin/sh\n# oci-device-hook: containerd runtime handler "
        f"{handler!r}; written by the installer, removed by uninstall\n"
        f"OCI_DEVICE_HOOK_REAL_RUNTIME={sh_quote(real)} "
        f'exec {sh_quote(node.opts.libexec + "/runtime")} "$@"\n'
    )
    atomic_write(node.path(path), script.encode(), 0o755)
    return path


def containerd_configs(node: Node) -> list[tuple[str, str | None]]:
    """The root configs to register, each with the text to start from where it is absent.

    ``--containerd-config`` when given; on a k3s or rke2 node (its agent's rendered
    ``config.toml`` present) the template k3s renders that file from on every start — the file
    that wins — and the rendered file itself (what containerd runs until then). A template that
    does not exist yet is made from the rendered file (k3s then renders it as it is)."""
    given = node.opts.containerd_config
    if given != DEFAULTS["containerd_config"]:
        return [(given, None)]
    for agent in K3S_AGENT_DIRS:
        rendered = f"{agent}/etc/containerd/config.toml"
        if not node.path(rendered).is_file():
            continue
        text = node.path(rendered).read_text()
        version, _ = engines.handlers(text, rendered)
        names = ("config-v3.toml.tmpl", "config.toml.tmpl") if version == 3 else ("config.toml.tmpl",)
        templates = [f"{agent}/etc/containerd/{n}" for n in names]
        template = next((t for t in templates if node.path(t).exists()), templates[0])
        return [(template, text), (rendered, None)]
    return [(given, None)]


def _backup_name(node: Node, path: str) -> str:
    flat = re.sub(r"[^A-Za-z0-9._-]", "_", path.strip("/"))
    if path == DEFAULTS["containerd_config"]:
        return f"{node.opts.state_dir}/containerd-config.toml.orig"  # the name before imports were followed
    return f"{node.opts.state_dir}/containerd-{flat}.orig"


def _plan(
    node: Node, root_config: str, seed: str | None, wrapper: str
) -> tuple[list[tuple[ctdconfig.ConfigFile, str, list[ctdedit.ContainerdEdit]]], int, dict[str, str]]:
    """The files one root config loads (imports followed inside the root), their new texts, the
    root's version, and the shim for each handler whose runc binary is not runc's."""
    read, listdir = read_in_root(node)
    current = read(root_config)
    if seed is not None and "{{" in (current or seed):
        raise InstallError(root_config, "", "a Go template (k3s renders it): register the handlers by hand")
    if seed is not None and current is None:
        files, version = ctdconfig.load(root_config, lambda p: seed if p == root_config else read(p), listdir)
        files = (ctdconfig.ConfigFile(root_config, seed, False), *files[1:])  # made from the rendered file
    else:
        files, version = ctdconfig.load(root_config, read, listdir)
    merged = ctdconfig.binaries(files, version)
    ours = {wrapper} | {f"{node.opts.libexec}/handlers/{n}" for n in merged}
    binary_for = {
        h.name: h.binary if h.binary in ours else _handler_shim(node, h.name, h.binary)
        for h in merged.values()
        if h.runtime_type in engines.RUNC_TYPES and h.binary and h.binary != wrapper
    }
    return ctdconfig.plan_register(files, version, binary_for, wrapper), version, binary_for


def _containerd_binary(node: Node) -> str | None:
    return next((b for b in CONTAINERD_BINARIES if os.access(node.path(b), os.X_OK)), None)


def _dump_problem(node: Node, binary: str, root_config: str, binary_for: dict[str, str], wrapper: str) -> str:
    """'' when the node's own ``containerd config dump`` runs every runc-type handler through the
    wrapper, else what it reads instead."""
    proc = node.run([binary, "--config", root_config, "config", "dump"])
    if proc.returncode != 0:
        return f"containerd cannot load it: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    try:
        doc = engines.parse(proc.stdout, f"{binary} config dump")
    except InputError as exc:
        return str(exc)
    version = engines.config_version(doc, False)
    if engines.cri_plugin(version) not in (doc.get("plugins") or {}):
        return ""  # the CRI plugin is disabled: the dump has no handlers to judge (the plan was checked)
    found = [h for h in engines.handlers_in(doc, version) if h.runtime_type in engines.RUNC_TYPES]
    wrong = [f"{h.name}={h.binary or 'runc'}" for h in found if h.binary != binary_for.get(h.name, wrapper)]
    if wrong or not found:
        return f"containerd reads {', '.join(wrong) or 'no runc handler'}"
    return ""


def register_handlers(node: Node, rec: dict[str, Any]) -> bool:
    """Edit every file containerd reads for its runc handlers (backups and edits recorded first);
    True when a file changed. With the node's containerd binary there, its own ``config dump``
    must then read the registration, or every file goes back as it was."""
    wrapper = f"{node.opts.libexec}/runtime"
    if not os.access(node.path(wrapper), os.X_OK):
        # a BinaryName naming a missing file would stop every pod on the node
        raise InstallError(wrapper, "", "no runtime wrapper in this version: containerd not registered")
    previous = rec.get("containerd") or {}
    entries = {e["path"]: e for e in state_files(previous)}
    shims = set(previous.get("shims", []))
    writes: list[tuple[str, bytes, bytes | None, int]] = []  # path, new, old (None: absent), mode
    checks: list[tuple[str, dict[str, str]]] = []
    for root_config, seed in containerd_configs(node):
        planned, version, binary_for = _plan(node, root_config, seed, wrapper)
        shims |= set(binary_for.values())
        checks.append((root_config, binary_for))
        for f, new, edits in planned:
            entry = entries.setdefault(
                f.path,
                {"path": f.path, "root": root_config, "created": not f.exists, "backup": "", "edits": []},
            )
            entry["version"] = None if f.path == root_config else version
            if not edits:
                entry.setdefault("sha256", sha(f.text.encode()))
                continue
            entry["edits"] = list(entry["edits"]) + [e.to_json() for e in edits]
            entry["sha256"] = sha(new.encode())
            host = node.path(f.path)
            mode = host.stat().st_mode & 0o777 if f.exists else 0o644
            writes.append((f.path, new.encode(), f.text.encode() if f.exists else None, mode))
    state = {
        "config": containerd_configs(node)[0][0],
        "files": list(entries.values()),
        "shims": sorted(shims),
    }
    rec["containerd"] = state
    if not writes:
        return False
    before = copy.deepcopy(rec)
    if previous:
        before["containerd"] = previous
    else:
        del before["containerd"]
    binary = _containerd_binary(node)
    # judged by the node's containerd only where it could load the configs before the edit
    loads = {
        r for r, _ in checks if binary and node.run([binary, "--config", r, "config", "dump"]).returncode == 0
    }
    for target, _, old, _ in writes:
        entry = entries[target]
        if old is not None and not entry["backup"]:
            entry["backup"] = _backup_name(node, target)
            atomic_write(node.path(entry["backup"]), old, 0o600)
    write_record(node, rec)  # recorded before the configs change: an interrupted run can be undone
    done: list[tuple[str, bytes | None, int]] = []
    try:
        for target, data, old, mode in writes:
            atomic_write(node.path(target), data, mode, verify=toml_ok(target))
            done.append((target, old, mode))
        for root_config, binary_for in checks:
            if binary and root_config in loads:
                problem = _dump_problem(node, binary, root_config, binary_for, wrapper)
                if problem:
                    raise InstallError(root_config, "", f"{problem}: every file put back, nothing registered")
    except InstallError:
        for target, old, mode in reversed(done):
            with contextlib.suppress(InstallError, OSError):
                if old is None:
                    node.path(target).unlink()
                else:
                    atomic_write(node.path(target), old, mode)
        with contextlib.suppress(InstallError):
            write_record(node, before)
        raise
    return True


def state_files(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-file entries of a containerd record (a record from before imports: one file)."""
    if "files" in state:
        return [dict(e) for e in state["files"]]
    if not state.get("config"):
        return []
    keys = ("created", "backup", "edits", "sha256")
    return [
        {"path": state["config"], "root": state["config"], "version": None, **{k: state.get(k) for k in keys}}
    ]


def engine_unit(node: Node, rec: dict[str, Any]) -> str:
    """The systemd unit that runs the containerd registered: k3s and rke2 embed theirs (server or
    agent, whichever is active), elsewhere ``containerd``."""
    files = [str(f.get("path", "")) for f in state_files(rec.get("containerd") or {})]
    for distro, units in (("k3s", ("k3s", "k3s-agent")), ("rke2", ("rke2-server", "rke2-agent"))):
        if any(p.startswith(f"/var/lib/rancher/{distro}/") for p in files):
            active = [u for u in units if node.run(["systemctl", "is-active", "--quiet", u]).returncode == 0]
            return active[0] if active else units[0]
    return "containerd"


def restart_engine(node: Node, engine: str) -> None:
    proc = node.run(["systemctl", "restart", engine])
    if proc.returncode != 0:
        raise InstallError(engine, "", f"restart failed: {proc.stderr.strip()[:200]}")
    say(f"restarted {engine}")


def restore_handlers(node: Node, state: dict[str, Any]) -> bool:
    """Undo the recorded edits in every file; True when a file changed."""
    changed = False
    for entry in state_files(state):
        changed |= _unregister_file(node, entry)
        if entry.get("backup"):
            node.path(entry["backup"]).unlink(missing_ok=True)
    return changed


def _unregister_file(node: Node, entry: dict[str, Any]) -> bool:
    path = entry["path"]
    cfg = node.path(path)
    try:
        text = cfg.read_text()
    except FileNotFoundError:
        return False
    edits = [ctdedit.ContainerdEdit.from_json(e) for e in entry.get("edits") or []]
    backup = node.path(entry["backup"]) if entry.get("backup") else None
    unchanged = sha(text.encode()) == entry.get("sha256")
    if unchanged and backup is not None and backup.exists():
        restored = backup.read_bytes()  # nobody changed it since: back byte for byte
    elif unchanged and entry.get("created") and edits:
        restored = b""
    else:
        restored = ctdedit.unregister_containerd(text, path, edits, entry.get("version")).encode()
    if entry.get("created") and (
        not restored or engines.parse(restored.decode(), path) in ({}, {"version": 2})
    ):
        cfg.unlink()
    elif restored != text.encode():
        atomic_write(cfg, restored, cfg.stat().st_mode & 0o777, verify=toml_ok(path))
    else:
        return False
    return True
