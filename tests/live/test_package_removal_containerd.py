"""Issue 29 items 1 and 3, end to end: removing the .deb never strands a containerd task, and the
handlers find the settings wherever ``--etc`` put them.

The package goes into a scratch node root with ``dpkg --root`` (its maintainer scripts run chrooted
there, ``tests/live/noderoot.py``); ``installer register --etc /run/odh-etc`` registers the node's
containerd config. A real containerd then runs in a mount namespace held by a ``sleep`` where the
node's ``/run`` is ``/run`` (its state, so the package's postrm sees the tasks' ``options.json``),
the node's ``/usr/libexec/oci-device-hook`` is bound at the same path (what the handlers name), and
``/var/log`` is a private tmpfs. containerd's environment names no settings file: the handler shims
must. Each container has its own cgroup under ``/odh-live``; everything is killed by pid afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.livekit import RUNC, build_rootfs
from tests.live.noderoot import BUSYBOX, MISSING, build_node_root
from tests.live.test_uninstall_containerd import DISABLED, Daemon
from tests.test_install import PASS_MARK

PKG = "oci-device-hook"
LIBEXEC = "/usr/libexec/oci-device-hook"
CRI = 'plugins."io.containerd.grpc.v1.cri".containerd'
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not BUSYBOX or bool(MISSING) or not (Path(RUNC).exists()),
    reason=f"root, busybox-static, runc, {MISSING or 'dpkg'}",
)
NODE_VIEW = (
    'mount --bind "$R/run" /run && mount -t tmpfs -o mode=0755 tmpfs /var/log'
    " && mount -t tmpfs -o mode=0755 tmpfs /usr/libexec && mkdir /usr/libexec/oci-device-hook"
    ' && mount --bind "$R/usr/libexec/oci-device-hook" /usr/libexec/oci-device-hook'
    " && echo ready && exec sleep 100000"
)


class NodeDaemon(Daemon):
    """containerd with the node's /run and libexec (see the module rule)."""

    def __init__(self, base: Path, config: Path, env: dict[str, str], root: Path) -> None:
        super().__init__(base, config, env)
        self.root = root

    def hold(self) -> None:
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", NODE_VIEW]
        env = {**self.env, "R": str(self.root)}
        self.holder = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert self.holder.stdout is not None and self.holder.stdout.readline() == "ready\n"

    def binary_of(self, cid: str) -> str:
        options = self.root / "run/containerd/io.containerd.runtime.v2.task" / self.ns / cid / "options.json"
        return str(json.loads(options.read_text()).get("binary_name", ""))


def _dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["dpkg", f"--root={root}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _config(base: Path, nvidia: Path) -> str:
    """The node's config: the daemon's root and sockets under ``base``, its state the node's
    ``/run/containerd``, and the GPU operator's two handlers."""
    return (
        f'version = 2\nroot = "{base}/root"\nstate = "/run/containerd"\n'
        f"disabled_plugins = {json.dumps(DISABLED)}\n"
        f'[grpc]\n  address = "{base}/c.sock"\n[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[{CRI}]\n  default_runtime_name = "nvidia"\n'
        f'[{CRI}.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[{CRI}.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[{CRI}.runtimes.nvidia.options]\n  BinaryName = "{nvidia}"\n'
    )


def _marked_runtime(path: Path, calls: Path) -> Path:
    path.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {RUNC} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def world(built_deb: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = build_node_root(tmp_path / "node")
    proc = _dpkg(root, "-i", str(built_deb))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = tmp_path / "ctd"
    base.mkdir()
    nvidia = _marked_runtime(tmp_path / "nvidia-container-runtime", tmp_path / "nvidia.calls")
    runc = _marked_runtime(tmp_path / "settings-runc", tmp_path / "settings.calls")
    etc = root / "run/odh-etc"  # --etc: a path the containerd namespace below sees as /run/odh-etc
    etc.mkdir(parents=True)
    (etc / "config.yaml").write_text(
        f"runtime: {runc}\nlog_file: /run/odh-etc/hook.log\ncache_dir: /run/odh-etc/cache\n"
    )
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(_config(base, nvidia))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_DEVICE_HOOK")}
    daemon = NodeDaemon(base, config, env, root)
    ids: list[str] = []
    try:
        daemon.hold()
        yield {"root": root, "daemon": daemon, "ids": ids, "rootfs": build_rootfs(tmp_path / "rootfs"),
               "tmp": tmp_path, "config": config, "deb": built_deb}  # fmt: skip
    finally:
        daemon.cleanup(ids)


def test_package_removal_leaves_pass_throughs_and_purge_removes_them_when_no_task_names_them(
    world: dict[str, Any],
) -> None:
    root, daemon, ids, tmp = world["root"], world["daemon"], world["ids"], world["tmp"]
    rootfs = world["rootfs"]
    config: Path = world["config"]
    original = config.read_text()
    installer = root / LIBEXEC.lstrip("/") / "installer"
    env = {"PATH": os.environ["PATH"]}
    proc = subprocess.run([str(installer), "register", "--root", str(root), "--etc", "/run/odh-etc"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    handlers = cri["containerd"]["runtimes"]
    runc_shim, nvidia_shim = f"{LIBEXEC}/handlers/runc", f"{LIBEXEC}/handlers/nvidia"
    assert handlers["runc"]["options"]["BinaryName"] == runc_shim  # outside dpkg's file list
    assert handlers["nvidia"]["options"]["BinaryName"] == nvidia_shim
    listed = _dpkg(root, "-L", PKG).stdout.split()
    assert f"{LIBEXEC}/runtime" in listed and runc_shim not in listed and nvidia_shim not in listed

    daemon.start()
    a, b = (f"odh-{x}-{uuid.uuid4().hex[:8]}" for x in "ab")
    ids += [a, b]
    daemon.run(a, rootfs, "--runc-binary", runc_shim)  # what containerd's handlers now name
    daemon.run(b, rootfs, "--runc-binary", nvidia_shim)
    assert (daemon.binary_of(a), daemon.binary_of(b)) == (runc_shim, nvidia_shim)
    # item 3: containerd's environment names no settings; the shims found --etc's
    assert "create" in (tmp / "settings.calls").read_text()  # the `runtime` of /run/odh-etc's settings
    assert "create" in (tmp / "nvidia.calls").read_text()
    assert (root / "run/odh-etc/hook.log").is_file()  # the hook ran with those settings
    assert daemon.exec(a) and daemon.exec(b)

    proc = _dpkg(root, "-r", PKG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert config.read_text() == original  # the handlers are restored (prerm: installer unregister)
    for shim in (runc_shim, nvidia_shim):
        text = (root / shim.lstrip("/")).read_text()
        assert PASS_MARK in text and "python" not in text.lower(), text
    assert not (root / LIBEXEC.lstrip("/") / "runtime").exists()  # dpkg's own files are gone
    left = sorted(str(p.relative_to(root)) for p in (root / LIBEXEC.lstrip("/")).rglob("*") if not p.is_dir())
    assert left == [runc_shim.lstrip("/"), nvidia_shim.lstrip("/")][::-1], left  # only the pass-throughs
    assert daemon.exec(a) and daemon.exec(b)  # exec after the removal
    daemon.kill_and_delete(a)  # kill and delete after the removal

    # a purge while containerd still runs the config it had before the removal keeps every one
    # (its handlers may start a container through them): the package's postrm, on a node procfs
    # whose containerd started an hour ago
    _fake_proc(root / "proc", time.time() - 3600)
    (root / "run/systemd/system").mkdir(parents=True)  # the node booted with systemd
    (root / "var/lib/oci-device-hook/decider.key").write_bytes(b"k" * 32)  # the first hook serve's
    (root / "var/lib/oci-device-hook/registration.json").write_text("{}\n")  # the metrics timer's verdict
    control = tmp / "control"
    subprocess.run(["dpkg-deb", "-e", str(world["deb"]), str(control)], check=True)
    shutil.copy2(control / "postrm", root / "postrm")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    cmd = ["chroot", str(root), "/bin/sh", "/postrm", "purge"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"kept the pass-through(s) {nvidia_shim} {runc_shim}" in proc.stderr
    assert PASS_MARK in (root / runc_shim.lstrip("/")).read_text()
    # issue 37 item 4: the key goes; a cleanup stays with the shims, run after containerd starts
    assert not (root / "var/lib/oci-device-hook/decider.key").exists()
    assert not (root / "var/lib/oci-device-hook/registration.json").exists()
    units = root / "etc/systemd/system"
    unit = (units / "oci-device-hook-cleanup.service").read_text()
    assert f"ExecStart=/bin/sh {LIBEXEC}/cleanup" in unit and "After=containerd.service" in unit
    for wants in ("containerd.service.wants", "k3s.service.wants", "multi-user.target.wants"):
        assert (units / wants / "oci-device-hook-cleanup.service").is_symlink(), wants
    # once containerd has restarted: b still runs, so its pass-through stays; a's goes
    _fake_proc(root / "proc", time.time() + 5)
    proc = _dpkg(root, "-P", PKG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (root / runc_shim.lstrip("/")).exists()
    assert PASS_MARK in (root / nvidia_shim.lstrip("/")).read_text()
    assert f"kept the pass-through(s) {nvidia_shim}" in proc.stderr
    assert daemon.exec(b)
    daemon.kill_and_delete(b)
    calls = (tmp / "nvidia.calls").read_text().splitlines()
    assert any(ln.split()[-2:] == ["delete", b] for ln in calls), calls  # NVIDIA's runtime, to the end
    assert not daemon.shims()
    # no task names the last one: the cleanup (as its unit runs it) leaves nothing the package made
    cleanup = ["chroot", str(root), "/bin/sh", f"{LIBEXEC}/cleanup"]
    proc = subprocess.run(cleanup, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for gone in (LIBEXEC, "/var/lib/oci-device-hook", "/etc/oci-device-hook", "/run/oci-device-hook",
                 "/etc/systemd/system/oci-device-hook-cleanup.service",
                 "/etc/systemd/system/containerd.service.wants"):  # fmt: skip
        assert not (root / gone.lstrip("/")).exists(), gone
    assert not list((root / "etc/systemd/system").rglob("oci-device-hook*"))


def _fake_proc(proc: Path, started: float) -> None:
    """A node procfs (a plain directory in the node root) whose one containerd started at ``started``."""
    shutil.rmtree(proc, ignore_errors=True)
    (proc / "4242").mkdir(parents=True)
    btime = int(started) - 10_000
    (proc / "stat").write_text(f"cpu 1 2 3 4\nbtime {btime}\n")
    fields = ["S", *["0"] * 18, str(int((started - btime) * 100)), *["0"] * 10]  # field 22: starttime
    (proc / "4242/stat").write_text(f"4242 (containerd) {' '.join(fields)}\n")


def test_an_upgrade_moves_an_earlier_registration_onto_shims(built_deb: Path, tmp_path: Path) -> None:
    """A node an earlier package registered names the packaged wrapper itself, which a removal would
    delete under running tasks: the postinst of the next package registers again, onto the shims."""
    from hook.tools.install import containerd as ictd
    from hook.tools.install import main as imain
    from hook.tools.install import node as inode
    from hook.tools.install import state

    root = build_node_root(tmp_path / "node")
    assert _dpkg(root, "-i", str(built_deb)).returncode == 0
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    original = f'version = 2\n[{CRI}.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
    config.write_text(original)
    node = inode.Node(str(root), imain._parser().parse_args(["register", "--root", str(root)]))
    rec: dict[str, Any] = {"libexec": LIBEXEC, "registered_only": True}
    assert ictd.register_handlers(node, rec)  # what the earlier package's register did
    state.write_record(node, rec)

    def binary() -> str:
        doc = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
        return str(doc["containerd"]["runtimes"]["runc"]["options"]["BinaryName"])

    assert binary() == f"{LIBEXEC}/runtime"
    proc = _dpkg(root, "-i", str(built_deb))  # the upgrade (here: the same version again)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert binary() == f"{LIBEXEC}/handlers/runc"
    assert os.access(root / f"{LIBEXEC}/handlers/runc".lstrip("/"), os.X_OK)
    proc = _dpkg(root, "-r", PKG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert config.read_text() == original  # both registrations undone, last first
    assert PASS_MARK in (root / f"{LIBEXEC}/handlers/runc".lstrip("/")).read_text()
