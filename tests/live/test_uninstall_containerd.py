"""Issue 22 item 1, end to end: uninstall never strands a containerd task started through the wrapper.

containerd's runc shim keeps the runtime binary a task was created with (its ``options.json``) and
runs it again for ``exec``, ``kill`` and ``delete``, also after containerd restarts. A real
containerd (root, state and socket under a temp dir) runs inside a mount namespace held by a
``sleep`` with private tmpfs ``/run`` (the shims' sockets, the hook's cache) and ``/var/log``;
containerd is started there twice with ``nsenter``, so the second one finds the first one's shims.
Every container has its own cgroup under ``/odh-live``; everything is killed by pid afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.livekit import RUNC, build_rootfs
from tests.test_install import PASS_MARK, Node, make_tree

pytestmark = pytest.mark.skipif(
    shutil.which("containerd") is None or shutil.which("ctr") is None, reason="containerd not installed"
)
PRIVATE = (
    "mount -t tmpfs -o mode=0755 tmpfs /run && mount -t tmpfs -o mode=0755 tmpfs /var/log"
    " && echo ready && exec sleep 100000"
)
DISABLED = [
    "io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing",
    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
    "io.containerd.tracing.processor.v1.otlp",
]  # fmt: skip


def _config(base: Path, nvidia: Path) -> str:
    """A node's config: the daemon's paths under ``base``, and the GPU operator's two handlers."""
    cri = 'plugins."io.containerd.grpc.v1.cri".containerd'
    return (
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f"disabled_plugins = {json.dumps(DISABLED)}\n"
        f'[grpc]\n  address = "{base}/c.sock"\n[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[{cri}]\n  default_runtime_name = "nvidia"\n'
        f'[{cri}.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[{cri}.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[{cri}.runtimes.nvidia.options]\n  BinaryName = "{nvidia}"\n'
    )


class Daemon:
    """containerd in the held namespace; ``ctr`` against its socket."""

    def __init__(self, base: Path, config: Path, env: dict[str, str]) -> None:
        self.base, self.config, self.env = base, config, env
        self.ns = f"odh-{uuid.uuid4().hex[:8]}"
        self.holder: subprocess.Popen[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def hold(self) -> None:
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE]
        self.holder = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None and self.holder.stdout.readline() == "ready\n"

    def start(self) -> None:
        assert self.holder is not None
        self.starts += 1
        log = (self.base / f"containerd-{self.starts}.log").open("wb")
        sock = self.base / "c.sock"
        sock.unlink(missing_ok=True)
        cmd = ["nsenter", "-t", str(self.holder.pid), "-m", "--", "containerd", "--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env)
        log.close()
        for _ in range(200):
            if sock.exists() and self.ctr("version").returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError("containerd did not start: " + self.log()[-2000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return (self.base / f"containerd-{self.starts}.log").read_text(errors="replace")

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = ["ctr", "--address", str(self.base / "c.sock"), "-n", self.ns, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def ok(self, *args: str) -> str:
        proc = self.ctr(*args)
        assert proc.returncode == 0, f"ctr {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}"
        return proc.stdout

    def run(self, cid: str, rootfs: Path, *runtime: str) -> None:
        fifo, runc = str(self.base / "fifo"), str(self.base / "runc")
        self.ok("run", "-d", "--fifo-dir", fifo, "--runc-root", runc, "--cgroup", f"/odh-live/{cid}",
                *runtime, "--rootfs", str(rootfs), cid, "/bin/sleep", "100000")  # fmt: skip

    def exec(self, cid: str) -> bool:
        """Whether ``ctr task exec`` ran a process in ``cid``: the process's own exit code (42) comes
        back through containerd, its shim and the runtime, so nothing else can produce it. Its stdout
        is not the proof: ctr copies an exec's output from a FIFO asynchronously, and on a loaded
        machine that copy once lost the race with the exit (``''`` for ``echo hi``)."""
        eid = f"e{uuid.uuid4().hex[:6]}"
        fifo = str(self.base / "fifo")
        proc = self.ctr("task", "exec", "--fifo-dir", fifo, "--exec-id", eid, cid, "/bin/sh", "-c", "exit 42")
        assert proc.returncode == 42, f"ctr task exec {cid}: exit {proc.returncode}\n{proc.stderr}"
        return True

    def kill_and_delete(self, cid: str) -> None:
        self.ok("task", "kill", "-s", "SIGKILL", cid)
        for _ in range(100):
            if f"{cid} " in self.ok("task", "ls") and "STOPPED" in self.status(cid):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{cid} did not stop: {self.status(cid)}")
        self.ok("task", "delete", cid)
        self.ok("container", "delete", cid)
        assert cid not in self.ok("container", "ls", "-q").split()

    def status(self, cid: str) -> str:
        return next((ln for ln in self.ok("task", "ls").splitlines() if ln.split()[:1] == [cid]), "")

    def binary_of(self, cid: str) -> str:
        options = self.base / "state/io.containerd.runtime.v2.task" / self.ns / cid / "options.json"
        return str(json.loads(options.read_text()).get("binary_name", ""))

    def shims(self) -> list[int]:
        """The pids of the shims this containerd started (their command line names its socket)."""
        mine = f"-address\0{self.base / 'c.sock'}\0".encode()
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and mine in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
        return pids

    def cleanup(self, ids: list[str]) -> None:
        """Whatever a failed run left: tasks, shims (by the pid each wrote), runc state, the holder."""
        if self.proc is not None and self.proc.poll() is None:
            for cid in ids:
                self.ctr("task", "kill", "-s", "SIGKILL", cid, timeout=20)
                self.ctr("task", "delete", "-f", cid, timeout=20)
                self.ctr("container", "delete", cid, timeout=20)
        self.stop()
        for pid in self.shims():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for cid in ids:
            subprocess.run([RUNC, "--root", str(self.base / "runc" / self.ns), "delete", "-f", cid],
                           capture_output=True, timeout=30)  # fmt: skip
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    base = tmp_path / "ctd"
    base.mkdir()
    node = Node(tmp_path / "node")
    node.base.mkdir()
    nvidia = tmp_path / "nvidia-container-runtime"  # NVIDIA's runtime stand-in: runc, after a mark
    nvidia.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/nvidia.calls\nexec {RUNC} "$@"\n')
    nvidia.chmod(0o755)
    node.containerd.parent.mkdir()
    node.containerd.write_text(_config(base, nvidia))
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(node.etc / "config.yaml")}
    daemon = Daemon(base, node.containerd, env)
    ids: list[str] = []
    try:
        daemon.hold()
        yield {"node": node, "daemon": daemon, "tree": make_tree(tmp_path / "tree"), "ids": ids,
               "rootfs": build_rootfs(tmp_path / "rootfs"), "nvidia": nvidia, "tmp": tmp_path}  # fmt: skip
    finally:
        daemon.cleanup(ids)


def test_tasks_started_through_the_wrapper_survive_uninstall_and_an_engine_restart(
    world: dict[str, Any],
) -> None:
    node: Node = world["node"]
    daemon: Daemon = world["daemon"]
    tree, rootfs, ids = world["tree"], world["rootfs"], world["ids"]
    original = node.containerd.read_text()
    settings = node.settings(runtime=RUNC)
    proc = node.installer("install", world["tree"], "--engine", "containerd", "--settings", str(settings))
    assert proc.returncode == 0, proc.stderr
    wrapper, shim = node.libexec / "runtime", node.libexec / "handlers/nvidia"
    daemon.start()
    a, b, c = (f"odh-{x}-{uuid.uuid4().hex[:8]}" for x in "abc")
    ids += [a, b, c]
    daemon.run(a, rootfs, "--runc-binary", str(wrapper))  # the runc handler's binary
    daemon.run(b, rootfs, "--runc-binary", str(shim))  # the nvidia handler's binary
    assert (daemon.binary_of(a), daemon.binary_of(b)) == (str(wrapper), str(shim))
    assert "create" in (world["tmp"] / "nvidia.calls").read_text()  # the shim ran NVIDIA's runtime
    assert daemon.exec(a) and daemon.exec(b)

    proc = node.installer("uninstall", tree, "--purge", "--containerd-state", str(daemon.base / "state"))
    assert proc.returncode == 0, proc.stderr
    assert node.containerd.read_text() == original  # the handlers are restored
    assert f"left pass-throughs to the real runtime at {shim}, {wrapper}:" in proc.stderr
    assert f"(2 under {daemon.base / 'state'} now)" in proc.stderr
    for path in (wrapper, shim):
        assert PASS_MARK in path.read_text() and "python" not in path.read_text().lower()
    assert not (node.libexec / "versions").exists() and not node.etc.exists()

    # before the engine restarts: the old handlers' binary still starts new tasks; old ones live on
    daemon.run(c, rootfs, "--runc-binary", str(wrapper))
    assert daemon.exec(a) and daemon.exec(b) and daemon.exec(c)
    daemon.kill_and_delete(a)
    daemon.kill_and_delete(c)

    # after it restarts (the shims outlive it): exec, kill and delete of a task created before
    daemon.stop()
    daemon.start()
    assert "RUNNING" in daemon.status(b)
    assert daemon.exec(b)
    daemon.kill_and_delete(b)
    calls = (world["tmp"] / "nvidia.calls").read_text().splitlines()
    assert any(ln.split()[-2:] == ["delete", b] for ln in calls), calls  # NVIDIA's runtime, to the end
    d = f"odh-d-{uuid.uuid4().hex[:8]}"
    ids.append(d)
    daemon.run(d, rootfs)  # a new task with containerd's own runc
    daemon.kill_and_delete(d)
    assert not daemon.shims()  # every task ended and took its shim with it


def test_the_wrapper_reads_the_settings_of_etc_without_the_engines_environment(world: dict[str, Any]) -> None:
    """Issue 29 item 3: containerd runs the wrapper with its BinaryName only; the path of
    ``--etc``'s settings is baked into the installed wrapper and into each handler shim."""
    node: Node = world["node"]
    daemon: Daemon = world["daemon"]
    rootfs, ids, tmp = world["rootfs"], world["ids"], world["tmp"]
    daemon.env = {k: v for k, v in daemon.env.items() if not k.startswith("OCI_DEVICE_HOOK")}
    calls = tmp / "settings.calls"
    marked = tmp / "settings-runc"  # the `runtime` only --etc's settings name
    marked.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {RUNC} "$@"\n')
    marked.chmod(0o755)
    settings = node.settings(runtime=str(marked))
    proc = node.installer("install", world["tree"], "--engine", "containerd", "--settings", str(settings))
    assert proc.returncode == 0, proc.stderr
    wrapper, shim = node.libexec / "runtime", node.libexec / "handlers/nvidia"
    daemon.start()
    a, b = (f"odh-{x}-{uuid.uuid4().hex[:8]}" for x in "ab")
    ids += [a, b]
    daemon.run(a, rootfs, "--runc-binary", str(wrapper))
    daemon.run(b, rootfs, "--runc-binary", str(shim))
    said = calls.read_text().splitlines()
    assert any("create" in ln.split() for ln in said), said  # a, through --etc's settings
    assert "create" in (tmp / "nvidia.calls").read_text()  # b: the handler's own runtime, as before
    assert f"default_conf={node.etc}/config.yaml" in wrapper.read_text()
    assert f"OCI_DEVICE_HOOK_CONFIG='{node.etc}/config.yaml'" in shim.read_text()
    assert daemon.exec(a) and daemon.exec(b)
    daemon.kill_and_delete(a)
    daemon.kill_and_delete(b)
    assert node.installer("uninstall", world["tree"]).returncode == 0
