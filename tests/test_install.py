"""Issue 15 items 1-3: the node installer (hook/tools/install/), engine registration, upgrades.

Every install here goes to a temp directory standing in for the node's libexec, hooks.d, etc and
state directories (``--root /`` with node paths under ``tmp_path``), so nothing reaches the
host's /usr, and every test that installs uninstalls in a ``finally``. The real-engine tests use
podman with ``--hooks-dir`` and a private storage root, and a containerd started here with its own
root, state, sockets and config, killed by pid.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hook.core.errors import InputError
from hook.tools import checks, ctdedit, doctorctd, doctorhooks, engines

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "packaging"
PYTHON = "/usr/bin/python3"
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), "")
needs_python = pytest.mark.skipif(not Path(PYTHON).exists(), reason="the node interpreter /usr/bin/python3")


def _site(mod: str) -> Path:
    return Path(__import__(mod).__file__).resolve()


@functools.cache
def bundled_python() -> Path:
    """``packaging/bundle-python`` of /usr/bin/python3, assembled once per session (removed at exit)."""
    dest = Path(tempfile.mkdtemp(prefix="odh-python-"))
    atexit.register(shutil.rmtree, dest, True)
    cmd = [str(PKG / "bundle-python"), str(dest / "python"), str(_site("yaml").parent)]  # make_tree's lib
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dest / "python"


def make_tree(dest: Path, version: str = "", bundled: bool = True) -> Path:
    """A package file tree like ``dpkg-deb -x`` of the .deb, without building one (fast): the
    bundled interpreter hard-linked from ``bundled_python()``; ``bundled=False``, a tree for the
    node's own Python (``INTERPRETER=system``)."""
    lib = dest / "usr/libexec/oci-device-hook/lib"
    shutil.copytree(REPO / "hook", lib / "hook", ignore=shutil.ignore_patterns("__pycache__"))
    for mod in ("yaml", "click"):
        shutil.copytree(_site(mod).parent, lib / mod, ignore=shutil.ignore_patterns("__pycache__"))
    if (_site("yaml").parent.parent / "_yaml").is_dir():
        shutil.copytree(_site("yaml").parent.parent / "_yaml", lib / "_yaml")
    shutil.copy2(_site("pynvml"), lib / "pynvml.py")
    if version:
        (lib / "hook/core/version.py").write_text(f'VERSION = "{version}"\n')
    libexec = lib.parent
    shutil.copy2(PKG / "launcher", libexec / "hook")
    shutil.copy2(PKG / "launcher", libexec / "launcher.py")
    shutil.copy2(PKG / "launcher.sh.in", libexec / "launcher.sh.in")
    shutil.copy2(PKG / "installer", libexec / "installer")
    shutil.copy2(PKG / "installer.py", libexec / "installer.py")
    if bundled:
        subprocess.run(["cp", "-al", str(bundled_python()), str(libexec / "python")], check=True)
    runtime = PKG / "runtime"
    if runtime.exists():
        shutil.copy2(runtime, libexec / "runtime")
    else:  # speclevel's wrapper not merged yet: a stand-in with the same contract
        (libexec / "runtime").write_text('#!/bin/sh\nexec "${OCI_DEVICE_HOOK_REAL_RUNTIME:-runc}" "$@"\n')
        (libexec / "runtime").chmod(0o755)
    (dest / "usr/share/containers/oci/hooks.d").mkdir(parents=True)
    shutil.copy2(REPO / "nvidia-hook.json", dest / "usr/share/containers/oci/hooks.d/oci-device-hook.json")
    (dest / "etc/oci-device-hook").mkdir(parents=True)
    shutil.copy2(PKG / "config.yaml", dest / "etc/oci-device-hook/config.yaml")
    return dest


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("tree"))


class Node:
    """Node paths under one temp dir, and the installer run against them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.libexec = base / "libexec"
        self.hooks = base / "hooks.d"
        self.etc = base / "etc"
        self.state = base / "state"
        self.containerd = base / "containerd/config.toml"
        self.log = base / "hook.log"

    def args(self) -> list[str]:
        return [
            "--root", "/", "--libexec", str(self.libexec), "--hooks-dir", str(self.hooks),
            "--etc", str(self.etc), "--state-dir", str(self.state),
            "--containerd-config", str(self.containerd),
        ]  # fmt: skip

    def installer_argv(self, action: str, src: Path, *extra: str) -> list[str]:
        installer = str(src / "usr/libexec/oci-device-hook/installer")
        return [installer, action, "--src", str(src), *self.args(), *extra]

    def installer(self, action: str, src: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = self.installer_argv(action, src, *extra)
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"]}
        )

    def record(self) -> dict:
        return json.loads((self.state / "install.json").read_text())

    def settings(self, **values: object) -> Path:
        path = self.base / "settings.yaml"
        obj = {"log_file": str(self.log), "cache_dir": str(self.base / "cache"), **values}
        path.write_text(yaml.safe_dump(obj))
        return path


@pytest.fixture
def node(tmp_path: Path, tree: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.base.mkdir()
    try:
        yield n
    finally:
        n.installer("uninstall", tree)
        left = [p for p in n.libexec.rglob("*") if p.is_file()] if n.libexec.exists() else []
        assert all(PASS_MARK in p.read_text() for p in left), left  # only pass-throughs stay


PASS_MARK = "# oci-device-hook pass-through"


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


# --- install, versions, uninstall ------------------------------------------------------------------------


@needs_python
def test_install_switches_one_symlink_and_uninstall_removes_everything(node: Node, tree: Path) -> None:
    node.containerd.parent.mkdir()  # no config: hooks.d only (auto finds no containerd... unless on PATH)
    out = _ok(node.installer("install", tree, "--engine", "hooks.d"))
    assert "installed 0.1.0 for Python 3." in out
    assert os.readlink(node.libexec / "current") == "versions/0.1.0"
    assert os.readlink(node.libexec / "hook") == "current/hook"
    assert (node.libexec / "hook").resolve() == node.libexec / "versions/0.1.0/hook"
    tag = sys.implementation.cache_tag if Path(sys.executable).resolve() == Path(PYTHON).resolve() else ""
    pycs = list((node.libexec / "versions/0.1.0/lib/hook/__pycache__").glob("entry.*.pyc"))
    assert pycs and (not tag or any(tag in p.name for p in pycs))
    doc = json.loads((node.hooks / "oci-device-hook.json").read_text())
    assert doc["hook"]["path"] == f"{node.libexec}/hook"
    assert doc["hook"]["args"][-2:] == ["--config", f"{node.etc}/config.yaml"]
    assert doc["stages"] == ["prestart"]
    version = subprocess.run(
        [str(node.libexec / "hook"), "--version"], capture_output=True, text=True, env={}
    )
    assert version.stdout == "hook (oci-device-hook) 0.1.0\n", version.stderr
    assert (node.etc / "config.yaml").read_bytes() == (PKG / "config.yaml").read_bytes()
    assert node.record()["hooks_file"] == str(node.hooks / "oci-device-hook.json")
    _ok(node.installer("uninstall", tree))
    assert not node.libexec.exists() and not node.state.exists()
    assert list(node.hooks.iterdir()) == []
    assert (node.etc / "config.yaml").exists()  # the operator's settings stay (--purge removes them)
    again = _ok(node.installer("uninstall", tree))  # issue 22, item 5: nothing installed says so
    assert "nothing to remove" in again and "not installed" in again and "removed" not in again


@needs_python
def test_old_node_python_is_refused_with_one_line_and_nothing_changes(node: Node, tree: Path) -> None:
    fake = node.base / "python3.9"
    fake.write_text("#!/bin/sh\necho 3.9\n")
    fake.chmod(0o755)
    proc = node.installer("install", tree, "--python", str(fake))
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"oci-device-hook: {fake}: is Python 3.9; the hook needs Python >= 3.11: not installed\n"
    )
    assert sorted(p.name for p in node.base.iterdir()) == ["python3.9"]


def test_launcher_on_an_old_python_fails_with_one_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.version_info = (3, 9, 2, 'final', 0); sys.argv = ['hook']\n"
        f"exec(compile(open({str(PKG / 'launcher')!r}).read(), 'launcher', 'exec'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.endswith("is 3.9\n") and proc.stderr.startswith(
        "oci-device-hook: needs Python >= 3.11; "
    )
    assert len(proc.stderr.splitlines()) == 1


@needs_python
def test_upgrade_keeps_the_old_version_and_rollback_switches_back(
    node: Node, tree: Path, tmp_path: Path
) -> None:
    newer = make_tree(tmp_path / "tree-0.2.0", "0.2.0")
    _ok(node.installer("install", tree, "--engine", "hooks.d"))
    _ok(node.installer("install", newer, "--engine", "hooks.d"))
    assert os.readlink(node.libexec / "current") == "versions/0.2.0"
    assert sorted(p.name for p in (node.libexec / "versions").iterdir()) == ["0.1.0", "0.2.0"]
    run = subprocess.run([str(node.libexec / "hook"), "--version"], capture_output=True, text=True, env={})
    assert run.stdout.endswith(" 0.2.0\n")
    _ok(node.installer("install", tree, "--engine", "hooks.d"))  # rollback: the image of 0.1.0 again
    assert os.readlink(node.libexec / "current") == "versions/0.1.0"
    assert node.record()["history"] == ["0.2.0", "0.1.0"]
    run = subprocess.run([str(node.libexec / "hook"), "--version"], capture_output=True, text=True, env={})
    assert run.stdout.endswith(" 0.1.0\n")
    for v in ("0.3.0", "0.4.0"):
        _ok(
            node.installer(
                "install", make_tree(tmp_path / f"tree-{v}", v), "--engine", "hooks.d", "--keep", "2"
            )
        )
    assert sorted(p.name for p in (node.libexec / "versions").iterdir()) == ["0.3.0", "0.4.0"]


@needs_python
def test_install_replaces_the_delete_then_move_layout(node: Node, tree: Path) -> None:
    (node.libexec / "lib/hook").mkdir(parents=True)
    shutil.copy2(PKG / "launcher", node.libexec / "hook")  # the old DaemonSet's files
    _ok(node.installer("install", tree, "--engine", "hooks.d"))
    assert (node.libexec / "hook").is_symlink() and not (node.libexec / "lib").exists()


@needs_python
def test_settings_are_applied_on_change_and_bad_ones_refused(node: Node, tree: Path) -> None:
    good = node.settings(privileged_allocation="audit")
    _ok(node.installer("install", tree, "--engine", "hooks.d", "--settings", str(good)))
    assert (node.etc / "config.yaml").read_bytes() == good.read_bytes()
    assert "settings" not in node.installer("settings", tree, "--settings", str(good)).stderr  # unchanged
    changed = node.settings(privileged_allocation="reject")
    assert "applied" in _ok(node.installer("settings", tree, "--settings", str(changed)))
    assert b"reject" in (node.etc / "config.yaml").read_bytes()
    bad = node.base / "bad.yaml"
    bad.write_text("privileged_alocation: narrow\n")
    proc = node.installer("settings", tree, "--settings", str(bad))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "privileged_alocation: unknown setting" in proc.stderr and str(bad) in proc.stderr
    assert b"reject" in (node.etc / "config.yaml").read_bytes()


# --- containerd: the config edit ---------------------------------------------------------------------------

GPU_OPERATOR_V2 = """\
version = 2
# written by the GPU operator's toolkit container
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
            SystemdCgroup = true
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
          runtime_type = "io.containerd.kata.v2"
"""
CONTAINERD2_V3 = """\
version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
"""


def _runtimes(text: str, version: int = 2) -> dict:
    return tomllib.loads(text)["plugins"][engines.cri_plugin(version)]["containerd"]["runtimes"]


def test_containerd_v2_every_runc_handler_is_registered_and_undone_byte_for_byte() -> None:
    new, edits = ctdedit.register_containerd(
        GPU_OPERATOR_V2, "c.toml", {"nvidia": "/L/handlers/nvidia"}, "/L/runtime"
    )
    rt = _runtimes(new)
    assert rt["nvidia"]["options"] == {"BinaryName": "/L/handlers/nvidia", "SystemdCgroup": True}
    assert rt["runc"]["options"] == {"BinaryName": "/L/runtime", "SystemdCgroup": True}
    assert "options" not in rt["kata"]  # not a runc shim: BinaryName means nothing to it
    assert "# written by the GPU operator's toolkit container" in new
    assert [e.handler for e in edits] == ["nvidia", "runc"]
    assert ctdedit.unregister_containerd(new, "c.toml", edits) == GPU_OPERATOR_V2
    again, more = ctdedit.register_containerd(new, "c.toml", {"nvidia": "/L/handlers/nvidia"}, "/L/runtime")
    assert (again, more) == (new, [])  # idempotent


def test_containerd_v3_and_an_empty_config() -> None:
    new, edits = ctdedit.register_containerd(CONTAINERD2_V3, "c.toml", {}, "/L/runtime")
    assert _runtimes(new, 3)["runc"]["options"]["BinaryName"] == "/L/runtime"
    assert ctdedit.unregister_containerd(new, "c.toml", edits) == CONTAINERD2_V3
    new, edits = ctdedit.register_containerd("", "c.toml", {}, "/L/runtime")
    assert tomllib.loads(new)["version"] == 2
    assert _runtimes(new)["runc"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": "/L/runtime"},
    }
    assert tomllib.loads(ctdedit.unregister_containerd(new, "c.toml", edits)) == {"version": 2}


def test_undo_keeps_what_others_changed_since() -> None:
    new, edits = ctdedit.register_containerd(
        GPU_OPERATOR_V2, "c.toml", {"nvidia": "/L/handlers/nvidia"}, "/L/runtime"
    )
    later = new.replace(
        'default_runtime_name = "nvidia"', 'default_runtime_name = "nvidia"\n      snapshotter = "zfs"'
    )
    back = tomllib.loads(ctdedit.unregister_containerd(later, "c.toml", edits))
    expected = tomllib.loads(GPU_OPERATOR_V2)
    expected["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["snapshotter"] = "zfs"
    assert back == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[plugins]\nfoo = 1\n', "version"),  # version 1
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
         'runtime_type = "io.containerd.runc.v2"\noptions = { SystemdCgroup = true }\n', "options"),
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
         'runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }\n', "runc"),
        ("version = 2\n[plugins\n", ""),
    ],
)  # fmt: skip
def test_configs_the_line_editor_cannot_change_safely_are_refused(text: str, field: str) -> None:
    with pytest.raises(InputError) as err:
        ctdedit.register_containerd(text, "c.toml", {}, "/L/runtime")
    assert "c.toml" in str(err.value) and field in str(err.value)


@needs_python
def test_installer_registers_containerd_handlers_and_restores_the_file(node: Node, tree: Path) -> None:
    node.containerd.parent.mkdir()
    node.containerd.write_text(GPU_OPERATOR_V2)
    node.containerd.chmod(0o600)
    out = _ok(node.installer("install", tree))  # auto: a containerd config is there
    assert "containerd (restart containerd to take effect)" in out
    rt = _runtimes(node.containerd.read_text())
    assert rt["runc"]["options"]["BinaryName"] == f"{node.libexec}/runtime"
    shim = node.libexec / "handlers/nvidia"
    assert rt["nvidia"]["options"]["BinaryName"] == str(shim)
    assert (
        "OCI_DEVICE_HOOK_REAL_RUNTIME='/usr/local/nvidia/toolkit/nvidia-container-runtime'"
        in shim.read_text()
    )
    assert node.containerd.stat().st_mode & 0o777 == 0o600
    check = doctorctd.check_containerd(node.containerd, str(node.libexec))
    assert check.ok and "nvidia (default), runc" in check.detail, check
    _ok(node.installer("install", tree))  # an upgrade: nothing more to edit, nothing to undo twice
    assert [len(f["edits"]) for f in node.record()["containerd"]["files"]] == [2]
    _ok(node.installer("uninstall", tree))
    assert node.containerd.read_text() == GPU_OPERATOR_V2
    assert not doctorctd.check_containerd(node.containerd, str(node.libexec)).ok


@needs_python
def test_a_handler_shim_runs_the_binary_it_replaced_through_the_wrapper(node: Node, tree: Path) -> None:
    real = node.base / "nvidia-container-runtime"
    real.write_text(f'#!/bin/sh\necho "$0 $*" > {node.base}/ran\n')
    real.chmod(0o755)
    node.containerd.parent.mkdir()
    node.containerd.write_text(
        GPU_OPERATOR_V2.replace("/usr/local/nvidia/toolkit/nvidia-container-runtime", str(real))
    )
    _ok(node.installer("install", tree))
    env = {"PATH": "/usr/bin:/bin", "OCI_DEVICE_HOOK_CONFIG": str(node.etc / "config.yaml")}
    shim = [str(node.libexec / "handlers/nvidia"), "state", "ctr-1"]
    proc = subprocess.run(shim, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (node.base / "ran").read_text() == f"{real} state ctr-1\n"


def _fake_runtime(path: Path, record: Path) -> Path:
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> {record}\n')
    path.chmod(0o755)
    return path


@needs_python
def test_uninstall_leaves_a_pass_through_wherever_containerd_may_still_look(node: Node, tree: Path) -> None:
    """Issue 22 item 1: runc shims keep the BinaryName they were created with, so after uninstall the
    wrapper and every handler shim become plain sh that only execs the real runtime."""
    ran = node.base / "ran"
    runc = _fake_runtime(node.base / "my-runc", ran)
    nvidia = _fake_runtime(node.base / "nvidia-container-runtime", ran)
    node.containerd.parent.mkdir()
    original = GPU_OPERATOR_V2.replace("/usr/local/nvidia/toolkit/nvidia-container-runtime", str(nvidia))
    node.containerd.write_text(original)
    _ok(node.installer("install", tree, "--settings", str(node.settings(runtime=str(runc)))))
    proc = _fake_proc(node.base, time.time() - 3600)  # containerd runs the config it had before
    out = _ok(node.installer("uninstall", tree, "--purge", "--proc", str(proc)))
    assert node.containerd.read_text() == original
    wrapper, shim = node.libexec / "runtime", node.libexec / "handlers/nvidia"
    assert f"left pass-throughs to the real runtime at {shim}, {wrapper}:" in out
    assert "(0 under /run/containerd now)" in out  # no task, but containerd may start one: kept
    assert sorted(p.name for p in node.libexec.iterdir()) == ["handlers", "runtime"]
    assert not node.etc.exists()  # no settings: nothing read
    assert sorted(p.name for p in node.state.iterdir()) == ["pass-throughs"]  # no record; the leftovers
    for path, real in ((wrapper, runc), (shim, nvidia)):
        text = path.read_text()
        assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o755
        assert text.startswith("#!/bin/sh\n") and PASS_MARK in text and "python" not in text.lower()
        assert text.splitlines()[-1] == f"exec '{real}' \"$@\""
        proc = subprocess.run([str(path), "kill", "ctr 1", "9"], env={}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert ran.read_text() == f"{runc} kill ctr 1 9\n{nvidia} kill ctr 1 9\n"
    # a later install reuses both paths; its uninstall leaves them again
    _ok(node.installer("install", tree, "--settings", str(node.settings(runtime=str(runc)))))
    assert os.readlink(wrapper) == "current/runtime" and "OCI_DEVICE_HOOK_REAL_RUNTIME" in shim.read_text()
    assert engines.handlers(node.containerd.read_text(), "x")[1][0].binary == str(shim)
    _ok(node.installer("uninstall", tree))
    assert PASS_MARK in wrapper.read_text() and PASS_MARK in shim.read_text()
    assert node.containerd.read_text() == original
    # issue 29 item 1: containerd restarted since; one task still runs the nvidia shim
    proc = _fake_proc(node.base, time.time() + 5)
    state = node.base / "ctd-state"
    task = state / "io.containerd.runtime.v2.task/k8s.io/abc"
    task.mkdir(parents=True)
    (task / "options.json").write_text(json.dumps({"binary_name": str(shim), "root": "/run/runc"}))
    purge = ("uninstall", tree, "--purge", "--proc", str(proc), "--containerd-state", str(state))
    out = _ok(node.installer(*purge))
    assert not wrapper.exists() and PASS_MARK in shim.read_text()  # only the one no task names goes
    assert f"left pass-throughs to the real runtime at {shim}:" in out and f"(1 under {state} now)" in out
    (task / "options.json").unlink()  # that task ended: the next purge takes the rest
    _ok(node.installer(*purge))
    assert not node.libexec.exists() and not node.state.exists()


def _fake_proc(base: Path, started: float) -> Path:
    """A procfs with one containerd process, started at ``started`` (epoch seconds)."""
    proc = base / "proc"
    (proc / "4242").mkdir(parents=True, exist_ok=True)
    btime = int(started) - 10_000
    (proc / "stat").write_text(f"cpu 1 2 3 4\nbtime {btime}\n")
    fields = ["S", *["0"] * 18, str(int((started - btime) * 100)), *["0"] * 10]  # field 22: starttime
    (proc / "4242/stat").write_text(f"4242 (containerd) {' '.join(fields)}\n")
    return proc


@needs_python
def test_hooks_d_only_uninstall_leaves_no_pass_through(node: Node, tree: Path) -> None:
    _ok(node.installer("install", tree, "--engine", "hooks.d"))
    out = _ok(node.installer("uninstall", tree))
    assert "pass-through" not in out and not node.libexec.exists()


@needs_python
def test_an_upgrade_never_moves_the_wrapper_containerd_runs(node: Node, tree: Path) -> None:
    node.containerd.parent.mkdir()
    node.containerd.write_text(GPU_OPERATOR_V2)
    _ok(node.installer("install", tree))
    registered = node.containerd.read_text()
    moved = [a if a != str(node.libexec) else str(node.base / "elsewhere") for a in node.args()]
    cmd = [str(tree / "usr/libexec/oci-device-hook/installer"), "install", "--src", str(tree), *moved]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 1 and "an upgrade keeps that path" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert node.containerd.read_text() == registered and not (node.base / "elsewhere").exists()


@needs_python
def test_no_wrapper_no_containerd_registration(node: Node, tmp_path: Path) -> None:
    bare = make_tree(tmp_path / "bare")
    (bare / "usr/libexec/oci-device-hook/runtime").unlink()
    node.containerd.parent.mkdir()
    node.containerd.write_text(GPU_OPERATOR_V2)
    proc = node.installer("install", bare)
    assert proc.returncode == 1 and "no runtime wrapper" in proc.stderr
    assert node.containerd.read_text() == GPU_OPERATOR_V2


# --- hooks.d order and doctor -----------------------------------------------------------------------------


def test_hooks_file_sorts_after_nvidias() -> None:
    assert engines.hooks_file_name([]) == "oci-device-hook.json"
    assert engines.hooks_file_name(["oci-nvidia-hook.json"]) == "zz-oci-device-hook.json"
    assert sorted(["oci-nvidia-hook.json", "zz-oci-device-hook.json"], key=str.lower)[-1].startswith("zz-")


@needs_python
def test_installer_orders_after_nvidia_and_doctor_checks_it(node: Node, tree: Path) -> None:
    node.hooks.mkdir(parents=True)
    hook = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
    nvidia = {"version": "1.0.0", "when": {"always": True}, "stages": ["prestart"], "hook": hook}
    (node.hooks / "oci-nvidia-hook.json").write_text(json.dumps(nvidia))
    (node.hooks / "oci-device-hook.json").write_text(
        json.dumps({**nvidia, "hook": {"path": checks.HOOK_PATH}})
    )
    bad = doctorhooks.check_hooks_order([node.hooks])
    assert not bad.ok and "ours runs before NVIDIA's hook" in bad.detail
    (node.hooks / "oci-device-hook.json").unlink()
    _ok(node.installer("install", tree, "--engine", "hooks.d", "--mode", "precreate"))
    assert sorted(p.name for p in node.hooks.iterdir()) == [
        "oci-device-hook-precreate.json", "oci-nvidia-hook.json", "zz-oci-device-hook.json"
    ]  # fmt: skip
    good = doctorhooks.check_hooks_order([node.hooks], str(node.libexec))
    assert good.ok and "precreate (spec level), prestart (live) after NVIDIA's hook" in good.detail, good
    doc = json.loads((node.hooks / "oci-device-hook-precreate.json").read_text())
    assert doc["stages"] == ["precreate"] and doc["hook"]["args"][:2] == ["hook", "precreate"]
    assert json.loads((node.hooks / "zz-oci-device-hook.json").read_text())["stages"] == ["prestart"]
    live = doctorhooks.check_hooks([node.hooks])
    assert live.ok and live.detail.startswith(str(node.hooks / "zz-oci-device-hook.json")), live
    _ok(node.installer("install", tree, "--engine", "hooks.d"))  # back to prestart only
    assert sorted(p.name for p in node.hooks.iterdir()) == ["oci-nvidia-hook.json", "zz-oci-device-hook.json"]


# --- the DaemonSet's scripts --------------------------------------------------------------------------------


def _script(name: str, tmp: Path) -> Path:
    docs = list(yaml.safe_load_all((PKG / "kubernetes/configmap.yaml").read_text()))
    scripts = next(d for d in docs if d["metadata"]["name"] == "oci-device-hook-scripts")
    path = tmp / name
    path.write_text(scripts["data"][name])
    return path


@needs_python
def test_daemonset_scripts_install_apply_settings_and_uninstall_only_when_asked(
    node: Node, tree: Path, tmp_path: Path
) -> None:
    settings = node.settings(privileged_allocation="audit")
    env = {"PATH": os.environ["PATH"], "SRC": str(tree), "HOST_ROOT": "/", "SETTINGS": str(settings),
           "WATCH_SETTINGS": "false", "ENGINE": "hooks.d",
           "INSTALL_ARGS": " ".join(node.args()[2:])}  # fmt: skip
    proc = subprocess.run(
        ["sh", str(_script("install.sh", tmp_path))], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (node.hooks / "oci-device-hook.json").exists()
    assert (node.etc / "config.yaml").read_bytes() == settings.read_bytes()
    stop = subprocess.run(
        ["sh", str(_script("uninstall.sh", tmp_path))], env=env, capture_output=True, text=True
    )
    assert stop.returncode == 0 and (node.hooks / "oci-device-hook.json").exists()  # a rolling upgrade
    env["UNINSTALL_ON_STOP"] = "true"
    stop = subprocess.run(
        ["sh", str(_script("uninstall.sh", tmp_path))], env=env, capture_output=True, text=True
    )
    assert stop.returncode == 0, stop.stderr
    assert not (node.hooks / "oci-device-hook.json").exists() and not node.libexec.exists()


# --- real engines -------------------------------------------------------------------------------------------

CGROUP_PARENT = f"/ops-install-{os.getpid()}"  # a scratch cgroup, removed after the podman test
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _containerd_config(base: Path) -> str:
    return textwrap.dedent(f"""\
        version = 2
        root = "{base}/root"
        state = "{base}/state"
        [grpc]
          address = "{base}/c.sock"
        [ttrpc]
          address = "{base}/t.sock"
        [plugins."io.containerd.internal.v1.opt"]
          path = "{base}/opt"
        [plugins."io.containerd.grpc.v1.cri".containerd]
          default_runtime_name = "nvidia"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
        """)


def _start_containerd(config: Path, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["containerd", "--config", str(config)], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    sock = config.parent / "c.sock"
    for _ in range(100):
        if b"Start cri plugin with config" in log.read_bytes() and sock.exists():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _stop(proc)
    raise AssertionError(f"containerd did not start:\n{log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _cri_runtimes(log: Path) -> str:
    line = [ln for ln in log.read_text().splitlines() if "Start cri plugin with config" in ln][-1]
    return line


@needs_root
@needs_python
@pytest.mark.skipif(shutil.which("containerd") is None or shutil.which("ctr") is None, reason="containerd")
def test_a_running_containerd_loads_the_registration_and_its_undo(node: Node, tree: Path) -> None:
    base = node.base / "containerd"
    base.mkdir()
    original = _containerd_config(base)
    node.containerd.write_text(original)
    log = base / "containerd.log"
    _ok(node.installer("install", tree, "--engine", "containerd"))
    proc = _start_containerd(node.containerd, log)
    try:
        plugins = subprocess.run(["ctr", "--address", str(base / "c.sock"), "plugins", "ls"],
                                 capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
        assert any(ln.split()[:2] == ["io.containerd.grpc.v1", "cri"] and ln.split()[-1] == "ok"
                   for ln in plugins.splitlines()), plugins  # fmt: skip
        loaded = _cri_runtimes(log)
        assert f"BinaryName:{node.libexec}/handlers/nvidia" in loaded
        assert f"BinaryName:{node.libexec}/runtime" in loaded
        dump = subprocess.run(["containerd", "--config", str(node.containerd), "config", "dump"],
                              capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
        assert _runtimes(dump)["runc"]["options"]["BinaryName"] == f"{node.libexec}/runtime"
    finally:
        _stop(proc)
        _ok(node.installer("uninstall", tree))
    assert node.containerd.read_text() == original
    proc = _start_containerd(node.containerd, log)
    try:
        loaded = _cri_runtimes(log)
        assert "BinaryName:/usr/bin/nvidia-container-runtime" in loaded and str(node.libexec) not in loaded
    finally:
        _stop(proc)


def _podman(base: Path, hooks: Path, rootfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    podman = [
        "podman", "--runtime", "runc", "--root", str(base / "storage"), "--runroot", str(base / "run"),
        "--storage-driver", "vfs",
        "--cgroup-manager", "cgroupfs", "--events-backend", "file", "--hooks-dir", str(hooks),
        "run", "--rm", "--network", "none", "--cgroup-parent", CGROUP_PARENT,
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", *args,
        "--rootfs", str(rootfs), "/bin/sh", "-c", "echo started",
    ]  # fmt: skip
    # a private /run and /var/log: a mkdir of /run/oci-device-hook before the mount would land on the host's
    inner = 'mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/log && exec "$@"'
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", inner, "sh", *podman]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@needs_root
@needs_python
@pytest.mark.skipif(shutil.which("podman") is None or not BUSYBOX, reason="podman and busybox")
def test_podman_runs_the_installed_hook_and_not_after_uninstall(node: Node, tree: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="odh-", dir="/tmp"))  # podman: runroot under 50 characters
    try:
        _podman_case(node, tree, short)
    finally:
        shutil.rmtree(short, ignore_errors=True)
        remove_scratch_cgroup(CGROUP_PARENT)


def remove_scratch_cgroup(name: str, wait: float = 10.0) -> None:
    """Remove a scratch cgroup podman made (every controller), waiting for conmon to leave it."""
    deadline = time.monotonic() + wait
    while True:
        left = list(Path("/sys/fs/cgroup").glob(f"*/{name.strip('/')}"))
        for scratch in left:
            for d in [*sorted(scratch.rglob("*"), key=lambda p: len(p.parts), reverse=True), scratch]:
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        d.rmdir()
        if not any(p.exists() for p in left) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _podman_case(node: Node, tree: Path, short: Path) -> None:
    rootfs = node.base / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(BUSYBOX, rootfs / "bin/busybox")
    (rootfs / "bin/sh").symlink_to("busybox")
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    _ok(node.installer("install", tree, "--engine", "hooks.d", "--settings", str(node.settings())))
    try:
        # privileged without a plugin allocation: the full path runs, decides "none", logs one line
        run = _podman(short, node.hooks, rootfs, "--privileged")
        assert run.returncode == 0 and run.stdout == "started\n", run.stderr
        rec = json.loads(node.log.read_text().splitlines()[-1])
        assert rec["verdict"] == "none" and rec["engine"] == "podman", rec
        assert rec["version"] == "0.1.0"
    finally:
        _ok(node.installer("uninstall", tree))
    lines = len(node.log.read_text().splitlines())
    run = _podman(short, node.hooks, rootfs, "--privileged")
    assert run.returncode == 0, run.stderr
    assert len(node.log.read_text().splitlines()) == lines


def test_doctor_containerd_states(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    assert doctorctd.check_containerd(cfg).ok  # absent: not a containerd node
    cfg.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/usr/lib/cni"\n')
    bare = doctorctd.check_containerd(cfg, binary=None)  # read here: containerd's implicit runc handler
    assert not bare.ok and "implicit runc handler not registered" in bare.detail
    if doctorctd.containerd_binary():  # containerd's own dump lists that handler
        dumped = doctorctd.check_containerd(cfg)
        assert not dumped.ok and "runc (default) not registered" in dumped.detail
    new, _ = ctdedit.register_containerd(cfg.read_text(), str(cfg), {}, f"{checks.LIBEXEC}/runtime")
    cfg.write_text(new)
    assert doctorctd.check_containerd(cfg).ok
    cfg.write_text("version = 1\n[plugins.cri]\n")
    assert "version 1 is not supported" in doctorctd.check_containerd(cfg).detail


@needs_python
def test_engine_restarts_only_when_asked(node: Node, tree: Path) -> None:
    fake_bin = node.base / "bin"
    fake_bin.mkdir()
    calls = node.base / "systemctl.calls"
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (fake_bin / "systemctl").chmod(0o755)
    node.containerd.parent.mkdir()
    node.containerd.write_text(GPU_OPERATOR_V2)
    path = f"{fake_bin}:{os.environ['PATH']}"

    def run(action: str, *extra: str) -> str:
        cmd = [
            str(tree / "usr/libexec/oci-device-hook/installer"),
            action,
            "--src",
            str(tree),
            *node.args(),
            *extra,
        ]
        return _ok(subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={"PATH": path}))

    assert "restart containerd to take effect" in run("install")
    assert not calls.exists()
    assert "restarted containerd" not in run("install", "--restart-engine")  # nothing changed: no restart
    assert not calls.exists()
    assert "restarted containerd" in run("uninstall", "--restart-engine")
    assert calls.read_text() == "restart containerd\n"
    assert "restarted containerd" in run("install", "--restart-engine")
    assert calls.read_text() == "restart containerd\n" * 2


@needs_python
def test_a_failed_byte_compile_names_the_file_and_the_error(node: Node, tree: Path, tmp_path: Path) -> None:
    """Issue 22, item 5: the step, the file and compileall's error, not a bare last line."""
    broken = tmp_path / "broken-tree"
    shutil.copytree(tree, broken, symlinks=True)
    (broken / "usr/libexec/oci-device-hook/lib/hook/broken_mod.py").write_text("def broken(:\n")
    proc = node.installer("install", broken, "--engine", "hooks.d")
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert "cannot byte-compile version" in line and "broken_mod.py" in line and "SyntaxError" in line, line
    assert not node.libexec.exists() or not (node.libexec / "current").exists()


@needs_python
def test_install_needs_no_writable_dev_shm(node: Node, tree: Path) -> None:
    """``compileall -j 0`` needs multiprocessing's semaphores in /dev/shm; a node's chroot may lack it."""
    script = 'mount -t tmpfs -o ro tmpfs /dev/shm && exec "$@"'
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
    proc = subprocess.run(
        [*cmd, *node.installer_argv("install", tree, "--engine", "hooks.d")],
        capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
