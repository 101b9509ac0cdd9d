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
import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hook.core.errors import HookError, InputError
from hook.tools import ctdconfig, engines, nodefs

__all__ = ["main", "install", "uninstall"]

MIN_PYTHON = (3, 11)
PKG = "oci-device-hook"
DEFAULTS = {
    "libexec": "/usr/libexec/oci-device-hook",
    "hooks_dir": "/usr/share/containers/oci/hooks.d",
    "etc": "/etc/oci-device-hook",
    "state_dir": "/var/lib/oci-device-hook",
    "containerd_config": "/etc/containerd/config.toml",
    "containerd_state": "/run/containerd",
}
BUNDLED = "python"  # the tree's self-contained interpreter, <version>/python (packaging/bundle-python)
PLAIN_PATH = re.compile(r"(/[A-Za-z0-9_.+-]+)+")  # what the launchers and the wrapper name unquoted
OTHER_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")
CONTAINERD_BINARIES = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/bin/containerd")
K3S_AGENT_DIRS = ("/var/lib/rancher/k3s/agent", "/var/lib/rancher/rke2/agent")
RECORD = "install.json"
DPKG_LIST = "/var/lib/dpkg/info/oci-device-hook.list"


class InstallError(HookError):
    """The install or uninstall cannot go on; nothing (more) was changed."""


class Node:
    """The node's filesystem as the installer sees it: node paths mapped under ``root``."""

    def __init__(self, root: str, opts: argparse.Namespace) -> None:
        self.root = root
        self.opts = opts

    def path(self, node_path: str, *, follow: bool = True) -> Path:
        """``node_path`` resolved inside the root (``hook.tools.nodefs``): a symlink on the node means
        what it means to the node's engines, never a path in the installer's own filesystem."""
        try:
            return nodefs.resolve_in_root(self.root, node_path, follow=follow)
        except ValueError as exc:
            raise InstallError(node_path, "", str(exc).split(": ", 1)[-1]) from None
        except OSError as exc:
            raise InstallError(node_path, "", f"cannot resolve inside {self.root}: {exc.strerror}") from None

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        cmd = argv if self.root == "/" else ["chroot", self.root, *argv]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return subprocess.CompletedProcess(cmd, 127, "", str(exc))


def _say(text: str) -> None:
    sys.stderr.write(f"{PKG}: {text}\n")


def _atomic_write(
    path: Path, data: bytes, mode: int = 0o644, verify: Callable[[bytes], None] | None = None
) -> None:
    """``hook.tools.nodefs.atomic_write``; a failure is one line saying the file was left as it was."""
    try:
        nodefs.atomic_write(path, data, mode, verify)
    except OSError as exc:
        raise InstallError(str(path), "", f"not written ({exc.strerror or exc}); left as it was") from None


def _json_ok(data: bytes) -> None:
    json.loads(data)


def _toml_ok(source: str) -> Callable[[bytes], None]:
    def check(data: bytes) -> None:
        engines.parse(data.decode(), f"{source} (as written)")

    return check


def _atomic_symlink(target: str, link: Path) -> None:
    """Point ``link`` at ``target`` in one rename: a reader sees the old or the new link, never none."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_record(node: Node) -> dict[str, Any]:
    path = node.path(f"{node.opts.state_dir}/{RECORD}")
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InstallError(str(path), "", f"unreadable install record ({exc})") from None
    return obj if isinstance(obj, dict) else {}


def _write_record(node: Node, rec: dict[str, Any]) -> None:
    data = json.dumps(rec, indent=2, sort_keys=True) + "\n"
    _atomic_write(node.path(f"{node.opts.state_dir}/{RECORD}"), data.encode(), verify=_json_ok)


# --- checks ------------------------------------------------------------------------------------------


def bundled_version(src: Path) -> str:
    """The tree's bundled interpreter's version (``python/bin/python3`` -> ``python3.X``), or
    InstallError with one line when the tree has none."""
    bin_dir = src / "usr/libexec/oci-device-hook" / BUNDLED / "bin"
    try:
        target = os.readlink(bin_dir / "python3")
    except OSError:
        raise InstallError(
            str(bin_dir.parent),
            "",
            "no bundled interpreter in this tree (--python PATH: the node's own Python >= 3.11)",
        ) from None
    m = re.fullmatch(r"python(\d+)\.(\d+)", target)
    if not m or (int(m.group(1)), int(m.group(2))) < MIN_PYTHON:
        raise InstallError(str(bin_dir / "python3"), "", f"names {target!r}; the hook needs Python >= 3.11")
    return f"{m.group(1)}.{m.group(2)}"


def interpreter(node: Node, version_dir: str) -> list[str]:
    """argv that starts the Python the hook runs on from ``version_dir`` (a node path): the bundled
    one through its own loader, or the node's named by ``--python``."""
    if node.opts.python:
        return [node.opts.python]
    lib = f"{version_dir}/{BUNDLED}/lib"
    return [f"{lib}/{_loader(node.path(lib))}", "--library-path", lib, f"{version_dir}/{BUNDLED}/bin/python3"]


def _loader(lib: Path) -> str:
    loaders = sorted(p.name for p in lib.glob("ld-*.so*"))
    if not loaders:
        raise InstallError(str(lib), "", "no dynamic loader in the bundled interpreter")
    return loaders[0]


def _launcher(node: Node, staged: Path, final: str) -> str:
    """The hook's launcher for one version (staged at ``staged``, to live at node path ``final``),
    naming that version's own paths: a started hook never mixes two versions."""
    if node.opts.python:
        source = staged / "launcher.py"
        body = (source if source.exists() else staged / "hook").read_text().partition("\n")[2]
        return f"#!{node.opts.python} -ISB\n{body}"
    loader = _loader(staged / BUNDLED / "lib")
    values = {"@PYTHON@": f"{final}/{BUNDLED}", "@LOADER@": loader, "@DIR@": final}
    text = (staged / "launcher.sh.in").read_text()
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def _writable(node: Node, node_path: str) -> bool:
    """Whether ``node_path`` (or, where it does not exist yet, its nearest existing parent) can be
    written on the node: false on a read-only /usr."""
    path = node.path(node_path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK)


def check_paths(node: Node) -> None:
    """A read-only prefix is refused with what to set instead; the default hooks.d directory under a
    read-only /usr gives way to /etc/containers/oci/hooks.d (podman and CRI-O read both)."""
    opts = node.opts
    if not _writable(node, opts.libexec):
        raise InstallError(
            "--prefix",
            opts.libexec,
            "not writable on this node (a read-only /usr?): choose a writable, exec-able prefix such as "
            "/opt/oci-device-hook or /home/kubernetes/bin/oci-device-hook (docs/operators.md, node images)",
        )
    if opts.hooks_dir == DEFAULTS["hooks_dir"] and not _writable(node, opts.hooks_dir):
        opts.hooks_dir = OTHER_HOOKS_DIRS[1]


def check_python(node: Node) -> str:
    """The node's Python version, or InstallError with one line when it cannot run the hook."""
    python = node.opts.python
    proc = node.run([python, "-ISc", "import sys; print('%d.%d' % sys.version_info[:2])"])
    if proc.returncode != 0:
        why = proc.stderr.strip()[:200]
        raise InstallError(python, "", f"cannot run the node's Python (the hook needs Python >= 3.11): {why}")
    version = proc.stdout.strip()
    major, _, minor = version.partition(".")
    if (int(major), int(minor)) < MIN_PYTHON:
        raise InstallError(python, "", f"is Python {version}; the hook needs Python >= 3.11: not installed")
    return version


def _tree_version(src: Path) -> str:
    text = (src / "usr/libexec/oci-device-hook/lib/hook/core/version.py").read_text()
    m = re.search(r'^VERSION = "([^"]+)"', text, re.M)
    if not m or not re.fullmatch(r"[A-Za-z0-9.+~_-]+", m.group(1)):
        raise InstallError(str(src), "VERSION", "no usable version in hook/core/version.py")
    return m.group(1)


# --- install steps -------------------------------------------------------------------------------------


_IMPORT_CHECK = "import hook.entry, hook.routes.fastpath, hook.routes.live, hook.sources.settingsfile"


def _stage_version(node: Node, src: Path, version: str) -> None:
    """Copy the tree's libexec into ``versions/<version>`` (with its bundled interpreter, unless the
    node's was asked for), write its launcher, byte-compile the hook with the interpreter it will
    run on, check that it imports there (inside the node's root: a noexec prefix or a missing
    library shows here), and only then move it into place."""
    libexec = node.opts.libexec
    versions = node.path(libexec) / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    tmp_name = f".tmp-{version}-{os.getpid()}"
    tmp = versions / tmp_name
    shutil.rmtree(tmp, ignore_errors=True)
    skip = shutil.ignore_patterns(BUNDLED) if node.opts.python else None
    shutil.copytree(src / "usr/libexec/oci-device-hook", tmp, symlinks=True, ignore=skip)
    if node.opts.python:
        for junk in tmp.rglob("__pycache__"):
            shutil.rmtree(junk, ignore_errors=True)  # the build's Python's: the node's compiles next
    node_tmp = f"{libexec}/versions/{tmp_name}"
    final = f"{libexec}/versions/{version}"
    try:
        _atomic_write(tmp / "hook", _launcher(node, tmp, final).encode(), 0o755)
        python = interpreter(node, node_tmp)
    except (OSError, InstallError):
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # one process: ``-j 0`` would need a writable /dev/shm (multiprocessing's semaphores), which a
    # node's chroot or a DaemonSet's mount may lack, and gains nothing on a few dozen files
    check = f"import sys; sys.path.insert(0, {node_tmp + '/lib'!r}); {_IMPORT_CHECK}"
    steps = (
        ("byte-compile", [*python, "-I", "-m", "compileall", "-q", "-d", f"{final}/lib", f"{node_tmp}/lib"]),
        ("import", [*python, "-ISB", "-c", check]),
    )
    who = node.opts.python or "the bundled interpreter"
    for step, argv in steps:
        proc = node.run(argv)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            why = f"cannot {step} version {version} under {libexec} on this node: {_cause(proc)}"
            raise InstallError(who, "", why)
    final_dir = versions / version
    if final_dir.exists():
        aside = versions / f".old-{version}-{os.getpid()}"
        os.replace(final_dir, aside)
        os.replace(tmp, final_dir)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final_dir)


def _cause(proc: subprocess.CompletedProcess[str]) -> str:
    """Why a step failed, in one line: compileall names the file on stdout (``*** Error compiling
    '…'``) and the error after it; a crash's last stderr line is its exception."""
    out = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    err = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    named = next((ln for ln in out if ln.startswith("***")), "")
    last = (err or out or [f"exit status {proc.returncode}"])[-1]
    return (f"{named} {last}" if named and named != last else last)[:300]


def _switch(node: Node, version: str) -> None:
    """``current`` → ``versions/<version>``; ``hook`` and ``runtime`` → ``current/...`` (made once)."""
    base = node.path(node.opts.libexec)
    _atomic_symlink(f"versions/{version}", base / "current")
    for name in ("hook", "runtime", "installer"):
        link = base / name
        fresh = not (link.is_symlink() and os.readlink(link) == f"current/{name}")
        if (base / "versions" / version / name).exists() and fresh:
            _atomic_symlink(f"current/{name}", link)  # replaces an old layout's file in one rename
    legacy = base / "lib"
    if legacy.is_dir() and not legacy.is_symlink():
        shutil.rmtree(legacy)  # the delete-then-move layout's lib/, unused once hook points at current/


def _prune(node: Node, keep: int, history: list[str]) -> list[str]:
    """Keep the last ``keep`` versions installed (rollback targets); the current one always."""
    versions = node.path(node.opts.libexec) / "versions"
    kept = set(history[-max(keep, 1) :])
    for p in versions.iterdir():
        if not p.name.startswith(".") and p.name not in kept:
            shutil.rmtree(p, ignore_errors=True)
    return sorted(p.name for p in versions.iterdir() if not p.name.startswith("."))


def _apply_settings(node: Node, version: str, settings: Path | None, src: Path) -> str:
    """The ConfigMap's settings replace the node's when they differ (checked first by the new
    version's own parser); with none given, the packaged template is placed only where none is."""
    target = node.path(f"{node.opts.etc}/config.yaml")
    if settings is None:
        if not target.exists():
            _atomic_write(target, (src / "etc/oci-device-hook/config.yaml").read_bytes())
            return f"default settings placed in {node.opts.etc}/config.yaml"
        return ""
    try:
        data = settings.read_bytes()
    except OSError as exc:
        raise InstallError(str(settings), "", f"cannot read: {exc.strerror or exc}") from None
    if target.exists() and target.read_bytes() == data:
        return ""
    node_copy = f"{node.opts.state_dir}/.settings-check.yaml"
    _atomic_write(node.path(node_copy), data, 0o600)
    lib = f"{node.opts.libexec}/versions/{version}/lib"
    code = (
        f"import sys; sys.path.insert(0, {lib!r}); from pathlib import Path; "
        "from hook.sources.settingsfile import load_settings; from hook.core.errors import HookError\n"
        f"try: load_settings(Path({node_copy!r}), required=True)\n"
        "except HookError as e: print(e, file=sys.stderr); sys.exit(1)"
    )
    proc = node.run([*interpreter(node, f"{node.opts.libexec}/versions/{version}"), "-ISB", "-c", code])
    node.path(node_copy).unlink(missing_ok=True)
    if proc.returncode != 0:
        why = proc.stderr.strip().replace(node_copy, str(settings))
        raise InstallError(str(settings), "", f"settings not applied: {why.splitlines()[-1] if why else '?'}")
    _atomic_write(target, data)
    return f"settings from {settings} applied"


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


def _register_hooks_d(node: Node, src: Path, rec: dict[str, Any]) -> list[str]:
    """The prestart file (named to sort after NVIDIA's), and in precreate mode the precreate file
    beside it: the prestart hook then sees the decided marker and does nothing more."""
    dirs = dict.fromkeys([node.opts.hooks_dir, *OTHER_HOOKS_DIRS])
    present = [p.name for d in dirs if node.path(d).is_dir() for p in node.path(d).iterdir()]
    files = {f"{node.opts.hooks_dir}/{engines.hooks_file_name(present)}": "prestart"}
    if node.opts.mode == "precreate":
        files[f"{node.opts.hooks_dir}/{engines.PRECREATE_NAME}"] = "precreate"
    for path, stage in files.items():
        data = (json.dumps(_hooks_doc(node, src, stage), indent=2) + "\n").encode()
        _atomic_write(node.path(path), data, verify=_json_ok)
    for old in _hooks_files(rec):
        if old not in files:
            node.path(old, follow=False).unlink(missing_ok=True)
    return list(files)


def _hooks_files(rec: dict[str, Any]) -> list[str]:
    return [str(p) for p in rec.get("hooks_files") or ([rec["hooks_file"]] if rec.get("hooks_file") else [])]


def _containerd_wanted(node: Node) -> bool:
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
        f"OCI_DEVICE_HOOK_REAL_RUNTIME={_sh_quote(real)} "
        f'exec {_sh_quote(node.opts.libexec + "/runtime")} "$@"\n'
    )
    _atomic_write(node.path(path), script.encode(), 0o755)
    return path


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _read_in_root(node: Node) -> tuple[Callable[[str], str | None], Callable[[str], list[str]]]:
    def read(path: str) -> str | None:
        try:
            return node.path(path).read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise InstallError(path, "", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None

    def listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(node.path(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    return read, listdir


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
) -> tuple[list[tuple[ctdconfig.ConfigFile, str, list[engines.ContainerdEdit]]], int, dict[str, str]]:
    """The files one root config loads (imports followed inside the root), their new texts, the
    root's version, and the shim for each handler whose runc binary is not runc's."""
    read, listdir = _read_in_root(node)
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


def _register_containerd(node: Node, rec: dict[str, Any]) -> bool:
    """Edit every file containerd reads for its runc handlers (backups and edits recorded first);
    True when a file changed. With the node's containerd binary there, its own ``config dump``
    must then read the registration, or every file goes back as it was."""
    wrapper = f"{node.opts.libexec}/runtime"
    if not os.access(node.path(wrapper), os.X_OK):
        # a BinaryName naming a missing file would stop every pod on the node
        raise InstallError(wrapper, "", "no runtime wrapper in this version: containerd not registered")
    previous = rec.get("containerd") or {}
    entries = {e["path"]: e for e in _state_files(previous)}
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
                entry.setdefault("sha256", _sha(f.text.encode()))
                continue
            entry["edits"] = list(entry["edits"]) + [e.to_json() for e in edits]
            entry["sha256"] = _sha(new.encode())
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
            _atomic_write(node.path(entry["backup"]), old, 0o600)
    _write_record(node, rec)  # recorded before the configs change: an interrupted run can be undone
    done: list[tuple[str, bytes | None, int]] = []
    try:
        for target, data, old, mode in writes:
            _atomic_write(node.path(target), data, mode, verify=_toml_ok(target))
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
                    _atomic_write(node.path(target), old, mode)
        with contextlib.suppress(InstallError):
            _write_record(node, before)
        raise
    return True


def _state_files(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-file entries of a containerd record (a record from before imports: one file)."""
    if "files" in state:
        return [dict(e) for e in state["files"]]
    if not state.get("config"):
        return []
    keys = ("created", "backup", "edits", "sha256")
    return [
        {"path": state["config"], "root": state["config"], "version": None, **{k: state.get(k) for k in keys}}
    ]


def _containerd_unit(node: Node, rec: dict[str, Any]) -> str:
    """The systemd unit that runs the containerd registered: k3s and rke2 embed theirs (server or
    agent, whichever is active), elsewhere ``containerd``."""
    files = [str(f.get("path", "")) for f in _state_files(rec.get("containerd") or {})]
    for distro, units in (("k3s", ("k3s", "k3s-agent")), ("rke2", ("rke2-server", "rke2-agent"))):
        if any(p.startswith(f"/var/lib/rancher/{distro}/") for p in files):
            active = [u for u in units if node.run(["systemctl", "is-active", "--quiet", u]).returncode == 0]
            return active[0] if active else units[0]
    return "containerd"


def _restart(node: Node, engine: str) -> None:
    proc = node.run(["systemctl", "restart", engine])
    if proc.returncode != 0:
        raise InstallError(engine, "", f"restart failed: {proc.stderr.strip()[:200]}")
    _say(f"restarted {engine}")


def install(node: Node) -> int:
    opts = node.opts
    src = Path(opts.src)
    dpkg_owned = opts.libexec == DEFAULTS["libexec"]  # the .deb's files live there
    if dpkg_owned and node.path(DPKG_LIST).exists():
        why = "installed by dpkg on this node: `installer register` registers its engines"
        raise InstallError("dpkg", PKG, why)
    for option, value in (("--prefix", opts.libexec), ("--python", opts.python or "/usr/bin/python3")):
        if not PLAIN_PATH.fullmatch(value):
            raise InstallError(option, value, "expected a plain absolute path")  # a launcher names it
    check_paths(node)
    python_version = check_python(node) if opts.python else f"{bundled_version(src)} (bundled)"
    version = _tree_version(src)
    rec = _read_record(node)
    if rec.get("containerd") and rec.get("libexec", opts.libexec) != opts.libexec:
        # containerd's shims keep the wrapper's path for as long as their containers live
        raise InstallError(
            "--libexec",
            opts.libexec,
            f"containerd runs the wrapper from {rec['libexec']}: an upgrade keeps "
            "that path (uninstall first to move it)",
        )
    _stage_version(node, src, version)
    settings_changed = _apply_settings(node, version, Path(opts.settings) if opts.settings else None, src)
    _switch(node, version)
    rec.update(version=version, python=python_version, libexec=opts.libexec, mode=opts.mode)
    history = [v for v in rec.get("history", []) if v != version] + [version]
    rec["history"] = history[-10:]
    rec["hooks_files"] = _register_hooks_d(node, src, rec)
    rec["hooks_file"] = rec["hooks_files"][0]
    _write_record(node, rec)
    changed = False
    if _containerd_wanted(node):
        changed = _register_containerd(node, rec)
    rec["versions"] = _prune(node, opts.keep, rec["history"])
    _write_record(node, rec)
    if changed and opts.restart_engine:
        _restart(node, _containerd_unit(node, rec))
    where = f"hooks.d ({', '.join(rec['hooks_files'])})" + (", containerd" if "containerd" in rec else "")
    note = f"; {settings_changed}" if settings_changed else ""
    restart = " (restart containerd to take effect)" if changed and not opts.restart_engine else ""
    _say(f"installed {version} for Python {python_version}; registered with {where}{restart}{note}")
    return 0


def register(node: Node) -> int:
    """The engine step alone, for a hook installed by other means (the .deb ships the hooks.d
    file and the wrapper): containerd's handlers, recorded like an install's so ``unregister``
    (the .deb's prerm on remove) undoes exactly that."""
    opts = node.opts
    if opts.engine == "hooks.d" or not _containerd_wanted(node):
        _say("no containerd on this node: nothing to register (hooks.d engines read the packaged file)")
        return 0
    rec = _read_record(node)
    if rec.get("version") and not rec.get("registered_only"):
        raise InstallError(
            opts.state_dir, RECORD, "installed by the installer: `installer install` registers"
        )
    rec.update(libexec=opts.libexec, registered_only=True)
    changed = _register_containerd(node, rec)
    _write_record(node, rec)
    if changed and opts.restart_engine:
        _restart(node, _containerd_unit(node, rec))
    files = ", ".join(f["path"] for f in rec["containerd"]["files"])
    restart = " (restart containerd to take effect)" if changed and not opts.restart_engine else ""
    _say(
        f"registered containerd ({files}){restart}" if changed else f"containerd already registered ({files})"
    )
    return 0


def unregister(node: Node) -> int:
    """Undo ``register``: containerd's handlers back as they were, the shims and the record gone."""
    opts = node.opts
    rec = _read_record(node)
    state = rec.get("containerd")
    if not state or not rec.get("registered_only"):
        _say("nothing registered by `installer register` on this node")
        return 0
    changed = _unregister_containerd(node, state)
    for shim in state.get("shims", []):
        node.path(shim, follow=False).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        node.path(f"{rec.get('libexec') or opts.libexec}/handlers").rmdir()
    node.path(f"{opts.state_dir}/{RECORD}", follow=False).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        node.path(opts.state_dir).rmdir()
    if changed and opts.restart_engine:
        _restart(node, _containerd_unit(node, rec))
    restart = " (restart containerd to take effect)" if changed and not opts.restart_engine else ""
    _say(f"unregistered containerd{restart}")
    return 0


def apply_settings(node: Node) -> int:
    """Re-apply ``--settings`` to the installed version (the DaemonSet's ConfigMap watch)."""
    rec = _read_record(node)
    if not rec.get("version") or not node.opts.settings:
        raise InstallError(node.opts.state_dir, "version", "not installed, or no --settings given")
    done = _apply_settings(node, rec["version"], Path(node.opts.settings), Path(node.opts.src))
    if done:
        _say(done)
    return 0


def _unregister_containerd(node: Node, state: dict[str, Any]) -> bool:
    """Undo the recorded edits in every file; True when a file changed."""
    changed = False
    for entry in _state_files(state):
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
    edits = [engines.ContainerdEdit.from_json(e) for e in entry.get("edits") or []]
    backup = node.path(entry["backup"]) if entry.get("backup") else None
    unchanged = _sha(text.encode()) == entry.get("sha256")
    if unchanged and backup is not None and backup.exists():
        restored = backup.read_bytes()  # nobody changed it since: back byte for byte
    elif unchanged and entry.get("created") and edits:
        restored = b""
    else:
        restored = engines.unregister_containerd(text, path, edits, entry.get("version")).encode()
    if entry.get("created") and (
        not restored or engines.parse(restored.decode(), path) in ({}, {"version": 2})
    ):
        cfg.unlink()
    elif restored != text.encode():
        _atomic_write(cfg, restored, cfg.stat().st_mode & 0o777, verify=_toml_ok(path))
    else:
        return False
    return True


PASS_THROUGH_MARK = "# oci-device-hook pass-through"


def _real_runtime(node: Node) -> str:
    """What the wrapper execs after its decision: the settings' ``runtime`` as the wrapper reads it
    (its one plain line; ``runc`` where the file or the line is missing)."""
    path = node.path(node.opts.etc) / "config.yaml"
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        data = b""
    m = re.search(rb"^runtime:[ \t]*(['\"]?)([A-Za-z0-9_./+-]+)\1[ \t]*(#.*)?$", data, re.M)
    return m.group(2).decode() if m else "runc"


def _shim_real(path: Path) -> str | None:
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
        f'exec {_sh_quote(real)} "$@"\n'
    )


def _leave_pass_throughs(node: Node, rec: dict[str, Any], libexec: str) -> list[str]:
    """Replace the wrapper and every handler shim a containerd handler or a live shim may still name
    with a pass-through, each in one rename (a shim running it meanwhile sees the old or the new
    file, never none). Only where containerd was registered, or pass-throughs are already there."""
    base = node.path(libexec)
    state = rec.get("containerd") or {}
    wanted: dict[str, str] = {}
    for shim in state.get("shims", []):
        real = _shim_real(node.path(shim))
        if real is not None:
            wanted[shim] = real
    handlers = base / "handlers"
    if handlers.is_dir():
        for p in sorted(handlers.iterdir()):
            real = _shim_real(p)
            if real is not None:
                wanted.setdefault(f"{libexec}/handlers/{p.name}", real)
    runtime = base / "runtime"
    if state or wanted or _shim_real(runtime) is not None:
        wanted[f"{libexec}/runtime"] = _shim_real(runtime) or _real_runtime(node)
    ours = set(wanted)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for path, real in sorted(wanted.items()):
        if real in ours or not re.fullmatch(r"[A-Za-z0-9_./+-]+", real):
            real = "runc"  # never a loop back to a file of ours, never a word sh would split
        # the path itself, not where it leads: `runtime` is a symlink into the version removed next
        _atomic_write(node.path(path, follow=False), pass_through_script(real, stamp).encode(), 0o755)
    return sorted(wanted)


def _tasks_naming(node: Node, paths: list[str]) -> int:
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


def uninstall(node: Node) -> int:
    opts = node.opts
    rec = _read_record(node)
    if rec.get("registered_only"):  # the files are dpkg's: only the engine step is ours to undo
        why = "registered by `installer register`: `installer unregister` undoes it"
        raise InstallError(opts.state_dir, RECORD, why)
    hooks_file = node.path(f"{opts.hooks_dir}/{engines.HOOKS_NAME}", follow=False)
    if not rec and not node.path(opts.libexec).exists() and not hooks_file.exists():
        _say(f"nothing to remove under {node.root}: not installed (no {opts.state_dir}/{RECORD}, "
             f"no {opts.libexec})")
        return 0
    libexec = rec.get("libexec") or opts.libexec  # the install's own prefix: no --prefix to undo it
    for path in {*_hooks_files(rec), f"{opts.hooks_dir}/{engines.HOOKS_NAME}"}:
        target = node.path(path, follow=False)
        if target.exists() and _ours(target, libexec):
            target.unlink()
    changed = False
    state = rec.get("containerd")
    if state:
        # the handlers first: a config that cannot be restored stops here with the wrapper still
        # deciding, never with a pass-through the config still names
        changed = _unregister_containerd(node, state)
    left = _leave_pass_throughs(node, rec, libexec)
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
    for d in (base, node.path(opts.state_dir)):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: whatever else is there is not ours
    if opts.purge:
        shutil.rmtree(node.path(opts.etc), ignore_errors=True)
    if changed and opts.restart_engine:
        _restart(node, _containerd_unit(node, rec))
    restart = " (restart containerd to take effect)" if changed and not opts.restart_engine else ""
    _say(f"removed{' ' + rec['version'] if rec.get('version') else ''}{restart}")
    if left:
        tasks = _tasks_naming(node, left)
        _say(
            f"left pass-throughs to the real runtime at {', '.join(left)}: containerd shims of containers "
            "created through the wrapper still run them; delete them once containerd runs its restored "
            f"config and no task started before now is left ({tasks} under {opts.containerd_state} now)"
        )
    return 0


def _ours(path: Path, libexec: str) -> bool:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str((doc.get("hook") or {}).get("path", "")).startswith(libexec + "/")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="installer", description="install oci-device-hook on a node")
    p.add_argument("action", choices=["install", "uninstall", "settings", "status", "register", "unregister"])
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
    p.add_argument("--settings", default="", help="settings file to apply when it differs (a ConfigMap)")
    p.add_argument("--restart-engine", action="store_true", help="restart containerd when its config changed")
    p.add_argument("--keep", type=int, default=3, help="versions kept for rollback")
    p.add_argument("--purge", action="store_true", help="uninstall: also remove the settings directory")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if not opts.src:
        # this file is <tree>/usr/libexec/oci-device-hook/lib/hook/tools/install.py
        opts.src = str(Path(os.path.realpath(__file__)).parents[6])
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
        print(json.dumps(_read_record(node), indent=2, sort_keys=True))
        return 0
    except (HookError, InputError) as exc:
        _say(str(exc))
        return exc.exit_code
    except OSError as exc:
        _say(f"{exc.filename or ''}: {exc.strerror or exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
