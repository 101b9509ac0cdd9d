"""A real containerd with NRI on, run privately, driven through the CRI: the NRI route's test bed.

Rule: nothing of it reaches the host. A holder (``unshare -m -n``, a ``sleep``) owns a mount and a
network namespace with private tmpfs over ``/run`` (the shims' sockets are hard-wired under
``/run/containerd``), ``/var/log`` and the decider's key dir, a private ``/dev`` holding the basic
nodes and the seed-000 node's fake GPUs (a privileged container gets every node of that ``/dev``),
``lo`` up, and the device cgroup root guarded as in tests/live/livekit.py (v1: a scratch cgroup
bound over the devices hierarchy; v2: a fresh cgroup2 mount, then the same). containerd (Debian's
1.7 or 2.x, tests/live/debcache.py) is started in it by ``nsenter`` with root, state, sockets, opt,
CNI dirs and the NRI socket under the test's temp dir, ``restrict_oom_score_adj = true`` (root
here lacks ``CAP_SYS_RESOURCE``), and killed by pid, its shims too (their command line names its
socket). The NRI socket is a path in the temp dir: a plugin connects from outside the namespace
(a unix socket is reached through the file system, not the network namespace), and a daemon that
must act on containers' cgroups runs in the held namespace through ``Bed.in_ns``.

Pods are host-network with a scratch cgroup parent ``/odh-live/pod<uid>``; the image is a
busybox-static rootfs with nodes planted in ``/tmp`` (tests/live/test_spec_level.py's seed-000
probes), imported with ``ctr``; its entrypoint (the sandbox's) sleeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests import cri
from tests.hosttree import make_host_tree
from tests.live.debcache import containerd_tree
from tests.live.livekit import (
    _V1_GUARD,
    _V2_GUARD,
    BASIC_DEV,
    GUARD,
    KEY_DIR_VIEW,
    RUNC,
    build_rootfs,
    parse_probe,
)
from tests.live.test_spec_level import PLANTED

IMAGE = "localhost/odh-nri:1"
DISABLED = [
    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
]  # fmt: skip


def image_tar(dest: Path, scratch: Path) -> Path:
    """A docker-archive image: the busybox rootfs plus the planted char nodes; it sleeps."""
    root = build_rootfs(scratch)
    (root / "etc/group").write_text("root:x:0:\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as layer:
        for path in sorted(root.rglob("*")):
            layer.add(path, arcname=str(path.relative_to(root)), recursive=False)
        for rel, major, minor in PLANTED:
            node = tarfile.TarInfo(rel)
            node.type, node.mode, node.devmajor, node.devminor = tarfile.CHRTYPE, 0o666, major, minor
            layer.addfile(node)
    data = buf.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/sleep", "100000"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(data).hexdigest()]},
    }
    manifest = [{"Config": "config.json", "RepoTags": [IMAGE], "Layers": ["layer.tar"]}]
    with tarfile.open(dest, "w") as out:
        for name, blob in (("layer.tar", data), ("config.json", json.dumps(config).encode()),
                           ("manifest.json", json.dumps(manifest).encode())):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            out.addfile(info, io.BytesIO(blob))
    return dest


def containerd_config(
    base: Path, cdi_dirs: Sequence[Path], request_timeout: str, binary: str = "",
    handlers: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    """Version 2 (containerd 2.x migrates it): every path under ``base``, NRI on, CDI on; the runc
    handler (its binary ``binary``, else runc) and ``handlers`` (name: binary) beside it."""
    cri_plugin = 'plugins."io.containerd.grpc.v1.cri"'
    runtimes = f"{cri_plugin}.containerd.runtimes"
    options = f'[{runtimes}.runc.options]\n  BinaryName = "{binary}"\n' if binary else ""
    for name, path in (handlers or {}).items():
        options += f'[{runtimes}.{name}]\n  runtime_type = "io.containerd.runc.v2"\n'
        options += f'[{runtimes}.{name}.options]\n  BinaryName = "{path}"\n'
    return (
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f"disabled_plugins = {json.dumps(DISABLED)}\n"
        f'[grpc]\n  address = "{base}/c.sock"\n[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[{cri_plugin}]\n  sandbox_image = "{IMAGE}"\n  restrict_oom_score_adj = true\n'
        f"  enable_cdi = true\n  cdi_spec_dirs = {json.dumps([str(d) for d in cdi_dirs])}\n"
        f'[{cri_plugin}.cni]\n  bin_dir = "{base}/cni-bin"\n  conf_dir = "{base}/cni-conf"\n'
        f'[{cri_plugin}.containerd]\n  default_runtime_name = "runc"\n'
        f'[{cri_plugin}.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
        + options
        + '[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n  disable_connections = false\n'
        f'  socket_path = "{base}/nri.sock"\n  plugin_path = "{base}/nri-plugins"\n'
        f'  plugin_config_path = "{base}/nri-conf"\n'
        f'  plugin_registration_timeout = "5s"\n  plugin_request_timeout = "{request_timeout}"\n'
    )


# runc mounts a container's v1 cgroups from the mount point plus the path /proc/self/cgroup names,
# which starts with the guard's own name: the guard's view is bound once more under that name.
_V1_SEEN_FROM_INSIDE = f"""mkdir -p /sys/fs/cgroup/devices/{GUARD}
mount --bind /sys/fs/cgroup/devices /sys/fs/cgroup/devices/{GUARD}
"""


def holder_script(driver: Path, cgroup2: bool) -> str:
    """The held namespace: private /run, /var/log, key dir and /dev (with the fake GPUs), lo up,
    the guarded device cgroup root."""
    return (
        "set -eu\nmount -t tmpfs -o mode=0755 tmpfs /run\nmount -t tmpfs -o mode=0755 tmpfs /var/log\n"
        + KEY_DIR_VIEW
        + "mount -t tmpfs -o mode=0755,nosuid tmpfs /dev\n"
        + BASIC_DEV
        + f"cp -a {driver}/dev/. /dev/\n"
        + "ip link set lo up\n"
        + (_V2_GUARD if cgroup2 else _V1_GUARD + _V1_SEEN_FROM_INSIDE)
        + "echo ready\nexec sleep 100000\n"
    )


# A cgroup2 hierarchy mounted next to a v1 host has no controllers (the v1 hierarchies hold them):
# runc cannot write cpu.weight (containerd gives every sandbox CPU shares) or any other limit there.
# On v2 the handler's binary is this runc, which drops every linux.resources entry but the device
# rules from the bundle's config.json first: what is under test (NRI, the device cgroup) is intact.
V2_RUNC = """#!/bin/sh
prev=""
for a in "$@"; do
  if [ "$prev" = --bundle ] && [ -f "$a/config.json" ]; then
    {python} -I -c '
import json, sys
path = sys.argv[1] + "/config.json"
spec = json.load(open(path))
res = spec.get("linux", {{}}).get("resources") or {{}}
spec["linux"]["resources"] = {{k: v for k, v in res.items() if k == "devices"}}
json.dump(spec, open(path, "w"))
' "$a" || exit 1
  fi
  prev="$a"
done
exec {runc} "$@"
"""


def registrations(err: Path) -> int:
    """How many times ``hook nri`` said it registered, in its stderr file."""
    return err.read_text().count("registered with") if err.exists() else 0


class Bed:
    """One private containerd (``suite``: trixie = 1.7, sid = 2.x) on cgroup v1 or v2."""

    def __init__(
        self, tmp: Path, suite: str, cgroup2: bool, request_timeout: str = "2s", *,
        driver: Path | None = None, handlers: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """``driver``: a driver root whose ``dev/`` the private /dev copies (default: the seed-000
        node's); ``handlers``: more runtime handlers (name: binary); ``env``: containerd's (its
        shims' and runtimes') environment additions."""
        self.tmp, self.suite, self.cgroup2 = tmp, suite, cgroup2
        self.tree, self.version = containerd_tree(suite)
        self.driver = driver or tmp / "driver"
        if driver is None:
            make_host_tree(self.driver, "8x-mig", mknod=True)
        self.base = tmp / "ctd"
        self.base.mkdir()
        for d in ("nri-plugins", "nri-conf", "cni-bin", "cni-conf", "logs"):
            (self.base / d).mkdir()
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        self.config = self.base / "config.toml"
        binary = ""
        if cgroup2:
            binary = str(self.base / "runc-v2")
            Path(binary).write_text(V2_RUNC.format(python=sys.executable, runc=RUNC))
            Path(binary).chmod(0o755)
        self.config.write_text(containerd_config(self.base, [self.cdi], request_timeout, binary, handlers))
        self.nri_socket = self.base / "nri.sock"
        path = f"{self.tree}/usr/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self.env = {**os.environ, **(env or {}), "PATH": path}
        self.holder: subprocess.Popen[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: cri.Client | None = None
        self.pods: list[str] = []
        self.uids: list[str] = []

    # --- the namespace and the daemon -------------------------------------------------------------

    def in_ns(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` in the held mount and network namespace."""
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-n", "--", *cmd]

    def start(self) -> cri.Client:
        cmd = ["unshare", "-m", "-n", "--propagation", "private", "sh", "-c",
               holder_script(self.driver, self.cgroup2)]  # fmt: skip
        self.holder = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None
        if self.holder.stdout.readline() != "ready\n":
            raise AssertionError(f"the namespace was not set up: {self.holder.communicate()[1]}")
        log = (self.base / "containerd.log").open("wb")
        self.proc = subprocess.Popen(
            self.in_ns([f"{self.tree}/usr/bin/containerd", "--config", str(self.config)]),
            stdout=log, stderr=log, env=self.env, start_new_session=True,
        )  # fmt: skip
        log.close()
        sock = self.base / "c.sock"
        for _ in range(300):
            if sock.exists() and self.ctr("version").returncode == 0:
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("containerd did not start: " + self.log()[-3000:])
        image = image_tar(self.tmp / "image.tar", self.tmp / "image-root")
        imported = self.ctr("-n", "k8s.io", "images", "import", str(image))
        assert imported.returncode == 0, imported.stderr + self.log()[-2000:]
        self.client = cri.Client(sock)
        for _ in range(100):  # the CRI plugin answers once it has initialised
            with contextlib.suppress(Exception):
                self.client.version()
                return self.client
            time.sleep(0.1)
        raise AssertionError("containerd's CRI plugin never answered: " + self.log()[-3000:])

    def log(self) -> str:
        return (self.base / "containerd.log").read_text(errors="replace")

    def start_nri(
        self, settings: Path, err: Path, hook: Sequence[str] = (sys.executable, "-I", "-m", "hook")
    ) -> subprocess.Popen[bytes]:
        """``hook nri`` (the command ``hook``) on this bed's NRI socket, in its namespace (it acts
        on the containers' /dev and device cgroups); returned once its stderr (``err``, appended)
        says it registered. Killed by pid by whoever started it."""
        before = registrations(err)
        with err.open("ab") as out:
            cmd = [*hook, "nri", "--socket", str(self.nri_socket), "--config", str(settings)]
            proc = subprocess.Popen(self.in_ns(cmd), stdout=out, stderr=out)
        for _ in range(300):
            if registrations(err) > before:
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        raise AssertionError("hook nri never registered: " + err.read_text()[-2000:])

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [f"{self.tree}/usr/bin/ctr", "--address", str(self.base / "c.sock"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def shims(self) -> list[int]:
        """The shims this containerd started (their command line names its socket)."""
        mine = f"{self.base / 'c.sock'}".encode()
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if proc.name.isdigit() and b"containerd-shim" in cmdline and mine in cmdline:
                    pids.append(int(proc.name))
            except OSError:
                pass
        return pids

    def stop(self) -> None:
        """Pods stopped and removed through the CRI, then containerd, its shims and the holder
        killed by pid; the pods' cgroup parents removed in the namespace."""
        if self.client is not None:
            for sid in self.pods:
                with contextlib.suppress(Exception):
                    self.client.stop_pod(sid)
                    self.client.remove_pod(sid)
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.shims():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.holder is not None and self.holder.poll() is None:
            for uid in self.uids:
                dirs = f"/sys/fs/cgroup/odh-live/pod{uid} /sys/fs/cgroup/*/odh-live/pod{uid}"
                remove = 'find "$d" -depth -type d -exec rmdir {} +'
                script = f'for d in {dirs}; do [ -d "$d" ] && {remove}; done; true'
                subprocess.run(self.in_ns(["sh", "-c", script]), capture_output=True, timeout=30)
            self.holder.kill()
            self.holder.wait()

    # --- pods and containers (what a kubelet sends) -----------------------------------------------

    def pod(
        self, *, privileged: bool = False, annotations: dict[str, str] | None = None,
        name: str = "train", namespace: str = "ml", handler: str = "",
    ) -> tuple[str, cri.PodSpec]:  # fmt: skip
        """Run a host-network pod sandbox (with runtime ``handler``); (its id, its spec)."""
        assert self.client is not None
        uid = str(uuid.uuid4())
        self.uids.append(uid)
        logs = self.base / "logs" / uid
        logs.mkdir(parents=True)
        spec = cri.PodSpec(name=f"{name}-{uid[:4]}", uid=uid, namespace=namespace, log_directory=str(logs),
                           cgroup_parent=f"/odh-live/pod{uid}", annotations=annotations or {},
                           privileged=privileged)  # fmt: skip
        sid = self.client.run_pod(spec, handler)
        self.pods.append(sid)
        return sid, spec

    def create(self, sid: str, pod: cri.PodSpec, command: Sequence[str], **kw: object) -> str:
        """CreateContainer for container ``cuda`` (``kw``: ContainerSpec's other fields)."""
        assert self.client is not None
        spec = cri.ContainerSpec(name="cuda", image=IMAGE, command=list(command), log_path="cuda.log",
                                 **kw)  # type: ignore[arg-type]  # fmt: skip
        return self.client.create(sid, spec, pod)

    def wait_exit(self, cid: str, pod: cri.PodSpec, timeout: float = 30) -> str:
        """Wait for ``cid`` to exit 0; the container's output (the CRI log's message parts)."""
        assert self.client is not None
        deadline = time.monotonic() + timeout
        while True:
            status = self.client.status(cid)
            if status.state == cri.EXITED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        out = self.output(pod)
        assert (status.state, status.exit_code) == (cri.EXITED, 0), (status, out)
        return out

    def output(self, pod: cri.PodSpec) -> str:
        path = Path(pod.log_directory) / "cuda.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return "\n".join(ln.split(" ", 3)[3] for ln in lines if ln.count(" ") >= 3)

    def run(self, sid: str, pod: cri.PodSpec, command: Sequence[str], **kw: object) -> dict[str, str]:
        """Create, start and wait for the container; its probe answers."""
        assert self.client is not None
        cid = self.create(sid, pod, command, **kw)
        self.client.start(cid)
        return parse_probe(self.wait_exit(cid, pod))
