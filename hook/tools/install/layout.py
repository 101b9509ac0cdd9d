"""Layout and versions: each version in ``<prefix>/versions/<version>``, one ``current`` symlink.

Rule: a version is staged whole (its interpreter, its launcher naming its own paths), byte-compiled
and import-checked by the interpreter it will run on inside the node's root, and only then moved
into place; ``current`` is switched by renaming a new symlink over it, so a hook that has started
keeps importing from the version it started with.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from hook.tools.install.node import (
    DEFAULTS,
    OTHER_HOOKS_DIRS,
    InstallError,
    Node,
    atomic_symlink,
    atomic_write,
)

MIN_PYTHON = (3, 11)


BUNDLED = "python"  # the tree's self-contained interpreter, <version>/python (packaging/bundle-python)


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


def tree_version(src: Path) -> str:
    text = (src / "usr/libexec/oci-device-hook/lib/hook/core/version.py").read_text()
    m = re.search(r'^VERSION = "([^"]+)"', text, re.M)
    if not m or not re.fullmatch(r"[A-Za-z0-9.+~_-]+", m.group(1)):
        raise InstallError(str(src), "VERSION", "no usable version in hook/core/version.py")
    return m.group(1)


_IMPORT_CHECK = "import hook.entry, hook.routes.fastpath, hook.routes.live, hook.sources.settingsfile"


DEFAULT_CONF_LINE = "default_conf=/etc/oci-device-hook/config.yaml\n"  # packaging/runtime's


def wrapper_text(node: Node, text: str) -> str:
    """The runtime wrapper with ``--etc`` baked in: containerd runs it with its ``BinaryName`` only,
    so the settings path cannot come from an argument, and an environment variable would have to
    be set in containerd's own unit."""
    etc = node.opts.etc
    if etc == DEFAULTS["etc"]:
        return text
    if text.count(DEFAULT_CONF_LINE) != 1:
        raise InstallError("runtime", "default_conf", "the wrapper in this tree has no settings line to set")
    return text.replace(DEFAULT_CONF_LINE, f"default_conf={etc}/config.yaml  # installer --etc\n")


def stage_version(node: Node, src: Path, version: str) -> None:
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
        atomic_write(tmp / "hook", _launcher(node, tmp, final).encode(), 0o755)
        if (tmp / "runtime").is_file():
            atomic_write(tmp / "runtime", wrapper_text(node, (tmp / "runtime").read_text()).encode(), 0o755)
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


def switch(node: Node, version: str) -> None:
    """``current`` → ``versions/<version>``; ``hook`` and ``runtime`` → ``current/...`` (made once)."""
    base = node.path(node.opts.libexec)
    atomic_symlink(f"versions/{version}", base / "current")
    for name in ("hook", "runtime", "installer"):
        link = base / name
        fresh = not (link.is_symlink() and os.readlink(link) == f"current/{name}")
        if (base / "versions" / version / name).exists() and fresh:
            atomic_symlink(f"current/{name}", link)  # replaces an old layout's file in one rename
    legacy = base / "lib"
    if legacy.is_dir() and not legacy.is_symlink():
        shutil.rmtree(legacy)  # the delete-then-move layout's lib/, unused once hook points at current/


def prune(node: Node, keep: int, history: list[str]) -> list[str]:
    """Keep the last ``keep`` versions installed (rollback targets); the current one always."""
    versions = node.path(node.opts.libexec) / "versions"
    kept = set(history[-max(keep, 1) :])
    for p in versions.iterdir():
        if not p.name.startswith(".") and p.name not in kept:
            shutil.rmtree(p, ignore_errors=True)
    return sorted(p.name for p in versions.iterdir() if not p.name.startswith("."))


def place_settings(node: Node, version: str, settings: Path | None, src: Path) -> str:
    """The ConfigMap's settings replace the node's when they differ (checked first by the new
    version's own parser); with none given, the packaged template is placed only where none is."""
    target = node.path(f"{node.opts.etc}/config.yaml")
    if settings is None:
        if not target.exists():
            atomic_write(target, (src / "etc/oci-device-hook/config.yaml").read_bytes())
            return f"default settings placed in {node.opts.etc}/config.yaml"
        return ""
    try:
        data = settings.read_bytes()
    except OSError as exc:
        raise InstallError(str(settings), "", f"cannot read: {exc.strerror or exc}") from None
    if target.exists() and target.read_bytes() == data:
        return ""
    node_copy = f"{node.opts.state_dir}/.settings-check.yaml"
    atomic_write(node.path(node_copy), data, 0o600)
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
    atomic_write(target, data)
    return f"settings from {settings} applied"
