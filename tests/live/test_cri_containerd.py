"""Issue 28 item 1 through a real containerd CRI: a pod's own CDI annotation allocates nothing, in
its containers or its sandbox, whatever containerd's annotation allow-lists pass.

A real containerd (Debian's 1.6 here; root, state and socket under a temp dir) runs in a mount
namespace held by a ``sleep`` with private tmpfs ``/run`` and ``/var/log`` (the harness of
tests/live/test_uninstall_containerd.py). Its CRI plugin's runc handler names the project's
runtime wrapper (packaging/runtime, then ``hook runtime-wrapper`` from this tree); the tests speak
CRI to it as a kubelet does (tests/cri.py: RunPodSandbox, CreateContainer, StartContainer,
ContainerStatus, StopPodSandbox, RemovePodSandbox). Pods are host-network (no CNI), their
cgroup parent is a scratch ``/odh-live/pod<uid>``. The image is a busybox-static rootfs with a
copy of each GPU node planted in ``/tmp``; its entrypoint (what the sandbox runs) probes every GPU
node, mknods and opens its own copies too, and keeps the answers in its ``/dev`` tmpfs for the test
to read through ``/proc/<pid>/root``; the app container prints the same probe to its CRI log.

containerd passes a pod's annotations into a sandbox's or a container's config only when the
handler's ``pod_annotations`` allow them, and the kubelet's container annotations only when
``container_annotations`` do; both default to none (containerd ``internal/cri/server``,
``getPassthroughAnnotations``; glob match per key, ``*`` never crossing a ``/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import alloc_resp, checkpoint, checkpoint_entry
from tests.hosttree import make_host_tree
from tests.k8s_shapes import GPUS, write_cdi
from tests.live.livekit import RUNC, build_rootfs, parse_probe
from tests.live.test_uninstall_containerd import Daemon

grpc = pytest.importorskip("grpc", reason="grpcio (the test extra)")
from tests import cri  # noqa: E402  (needs grpcio)

pytestmark = pytest.mark.skipif(
    shutil.which("containerd") is None or shutil.which("ctr") is None, reason="containerd not installed"
)

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/odh-probe:1"
MINORS = sorted(g.minor for g in GPUS.values())
UUID2 = GPUS[2].uuid  # NVML index 2 is /dev/nvidia3 on the 4x-k8s node
FORGED = {"cdi.k8s.io/x": "nvidia.com/gpu=all"}
PLUGIN = {f"cdi.k8s.io/nvidia-device-plugin_{UUID2}": f"nvidia.com/gpu={UUID2}"}
DISABLED = [
    "io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
]  # fmt: skip


def probe_script(made: str) -> str:
    """Each GPU: the node in /dev (``dev<m>``), the copy planted in the image (``planted<m>``), and
    one the container mknods in ``made`` (``mknod<m>``, then ``made<m>``); ``PROBE <key> <result>``."""
    lines = []
    for m in MINORS:
        made_it = f"mknod {made}/m{m} c 195 {m} 2>/dev/null"
        lines.append(f'if {made_it}; then r=OK; else r=EPERM; fi; echo "PROBE mknod{m} $r"')
        for key, path in (
            (f"dev{m}", f"/dev/nvidia{m}"),
            (f"planted{m}", f"/tmp/g{m}"),
            (f"made{m}", f"{made}/m{m}"),
        ):
            opened = f"out=$(cat {path} 2>&1 </dev/null | head -c 200)"
            lines.append(f'if {opened}; then :; fi; echo "PROBE {key} ${{out:-OK}}"')
    return "; ".join(lines)


# The sandbox's root filesystem is read-only (containerd's pause spec): its answers go to its /dev tmpfs.
SANDBOX_SCRIPT = f"({probe_script('/dev')}; echo DONE) > /dev/sandbox-probe 2>&1; exec sleep 100000"


def image_tar(dest: Path, scratch: Path) -> Path:
    """A docker-archive image: the busybox rootfs plus /tmp/g<minor> char nodes (c 195:<minor>)."""
    root = build_rootfs(scratch)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as layer:
        for path in sorted(root.rglob("*")):
            layer.add(path, arcname=str(path.relative_to(root)), recursive=False)
        for m in MINORS:
            node = tarfile.TarInfo(f"tmp/g{m}")
            node.type, node.mode, node.devmajor, node.devminor = tarfile.CHRTYPE, 0o666, 195, m
            layer.addfile(node)
    data = buf.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/sh", "-c", SANDBOX_SCRIPT]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(data).hexdigest()]},
    }
    manifest = [{"Config": "config.json", "RepoTags": [IMAGE], "Layers": ["layer.tar"]}]
    with tarfile.open(dest, "w") as out:
        for name, blob in (
            ("layer.tar", data),
            ("config.json", json.dumps(config).encode()),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            out.addfile(info, io.BytesIO(blob))
    return dest


def containerd_config(base: Path, wrapper: Path, opened: bool) -> str:
    """CRI with the runc handler going through the wrapper; the allow-lists default or opened."""
    plugin = 'plugins."io.containerd.grpc.v1.cri"'
    passed = '["cdi.k8s.io/*"]' if opened else "[]"
    return (
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f"disabled_plugins = {json.dumps(DISABLED)}\n"
        f'[grpc]\n  address = "{base}/c.sock"\n[ttrpc]\n  address = "{base}/c.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        # restrict_oom_score_adj: the sandbox's -998 is refused to a containerd that is not init's
        f'[{plugin}]\n  sandbox_image = "{IMAGE}"\n  restrict_oom_score_adj = true\n'
        f'[{plugin}.cni]\n  bin_dir = "{base}/cni-bin"\n  conf_dir = "{base}/cni-conf"\n'
        f'[{plugin}.containerd]\n  default_runtime_name = "runc"\n'
        f'[{plugin}.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
        f"  pod_annotations = {passed}\n  container_annotations = {passed}\n"
        f'[{plugin}.containerd.runtimes.runc.options]\n  BinaryName = "{wrapper}"\n'
    )


class Node:
    """One scratch node: a fake driver root and CDI spec, the hook's settings and kubelet
    checkpoint, the wrapper, and containerd in its held namespace."""

    def __init__(self, tmp: Path, opened: bool) -> None:
        self.tmp = tmp
        self.root = tmp / "driver-root"
        make_host_tree(self.root, "4x-k8s", mknod=True)
        self.cdi = write_cdi(tmp / "cdi")
        self.ckpt = tmp / "kubelet_internal_checkpoint"
        self.ckpt.write_bytes(checkpoint([]))
        self.log = tmp / "hook.log"
        self.settings = tmp / "settings.yaml"
        self.settings.write_text(
            f"runtime: {RUNC}\ndriver_root: {self.root}\ncdi_spec_dirs: [{self.cdi}]\n"
            f"kubelet_checkpoint: {self.ckpt}\nlog_file: {self.log}\ncache_dir: {tmp}/cache\n"
        )
        libexec = tmp / "libexec"
        libexec.mkdir()
        shutil.copy2(REPO / "packaging" / "runtime", libexec / "runtime")
        (libexec / "hook").write_text(f'#!/bin/sh\nexec {sys.executable} -I -m hook "$@"\n')
        (libexec / "hook").chmod(0o755)
        self.base = tmp / "ctd"
        self.base.mkdir()
        config = self.base / "config.toml"
        config.write_text(containerd_config(self.base, libexec / "runtime", opened))
        env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(self.settings)}
        self.daemon = Daemon(self.base, config, env)
        self.daemon.ns = "k8s.io"  # the CRI plugin's namespace
        self.client: cri.Client | None = None
        self.pods: list[str] = []
        self.uids: list[str] = []

    def start(self) -> cri.Client:
        self.daemon.hold()
        self.daemon.start()
        tar = image_tar(self.tmp / "image.tar", self.tmp / "image-root")
        self.daemon.ok("images", "import", str(tar))
        self.client = cri.Client(self.base / "c.sock")
        for _ in range(100):  # the CRI plugin answers once it has initialised
            with contextlib.suppress(grpc.RpcError):
                self.client.version()
                return self.client
            time.sleep(0.1)
        raise AssertionError("containerd's CRI plugin never answered: " + self.daemon.log()[-2000:])

    def stop(self) -> None:
        if self.client is not None:
            for sid in self.pods:
                with contextlib.suppress(grpc.RpcError):
                    self.client.stop_pod(sid)
                    self.client.remove_pod(sid)
            self.client.close()
        self.daemon.cleanup([])
        for uid in self.uids:  # the pod's cgroup parent: the kubelet removes it, here we do
            for parent in Path("/sys/fs/cgroup").glob(f"*/odh-live/pod{uid}"):
                with contextlib.suppress(OSError):
                    parent.rmdir()

    def pod(self, annotations: dict[str, str]) -> cri.PodSpec:
        uid = str(uuid.uuid4())
        self.uids.append(uid)
        logs = self.tmp / "logs" / uid
        logs.mkdir(parents=True)
        return cri.PodSpec(
            name=f"train-{uid[:4]}",
            uid=uid,
            namespace="ml",
            log_directory=str(logs),
            cgroup_parent=f"/odh-live/pod{uid}",
            annotations=annotations,
        )

    def run_pod(self, pod: cri.PodSpec) -> str:
        assert self.client is not None
        sid = self.client.run_pod(pod)
        self.pods.append(sid)
        return sid

    def sandbox_probe(self, sid: str) -> dict[str, str]:
        """What the sandbox saw: its probe, kept in its own /tmp, read through /proc/<pid>/root."""
        pid = (
            (self.base / "state/io.containerd.runtime.v2.task/k8s.io" / sid / "init.pid").read_text().strip()
        )
        out = Path(f"/proc/{pid}/root/dev/sandbox-probe")
        for _ in range(100):
            text = out.read_text() if out.exists() else ""
            if "DONE" in text:
                return parse_probe(text)
            time.sleep(0.1)
        raise AssertionError(f"the sandbox never finished its probe: {text!r}")

    def run_container(
        self, sid: str, pod: cri.PodSpec, annotations: dict[str, str]
    ) -> tuple[str, dict[str, str]]:
        """The kubelet's CreateContainer + StartContainer for container ``cuda``; (id, its probe)."""
        spec = cri.ContainerSpec(
            name="cuda",
            image=IMAGE,
            command=["/bin/sh", "-c", probe_script("/tmp")],
            log_path="cuda.log",
            annotations=annotations,
        )
        return self.run_container_spec(sid, pod, spec)

    def run_container_spec(
        self, sid: str, pod: cri.PodSpec, spec: cri.ContainerSpec
    ) -> tuple[str, dict[str, str]]:
        """Create and start ``spec``, wait for it to exit 0; (id, the probe in its CRI log)."""
        assert self.client is not None
        cid = self.client.create(sid, spec, pod)
        self.client.start(cid)
        for _ in range(200):
            status = self.client.status(cid)
            if status.state == cri.EXITED:
                break
            time.sleep(0.1)
        assert (status.state, status.exit_code) == (cri.EXITED, 0), status
        lines = (Path(pod.log_directory) / "cuda.log").read_text().splitlines()
        return cid, parse_probe("\n".join(ln.split(" ", 3)[3] for ln in lines if ln.count(" ") >= 3))

    def decisions(self) -> dict[str, dict[str, Any]]:
        """The hook's log lines by container id (the wrapper decides every create)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return {rec["container"]["id"]: rec for rec in map(json.loads, lines)}


@pytest.fixture(params=[False, True], ids=["default-allow-lists", "opened-allow-lists"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, opened=request.param)
    try:
        n.start()
        yield n
    finally:
        n.stop()


def opened_gpus(seen: dict[str, str]) -> set[int]:
    return {m for m in MINORS if "ENXIO" in (seen[f"dev{m}"], seen[f"planted{m}"], seen[f"made{m}"])}


def no_gpu(seen: dict[str, str]) -> None:
    """No GPU node in /dev, the planted copies denied, the container's own copies denied (or refused)."""
    assert opened_gpus(seen) == set(), seen
    assert {seen[f"dev{m}"] for m in MINORS} == {"ENOENT"}, seen
    assert {seen[f"planted{m}"] for m in MINORS} == {"EPERM"}, seen
    assert {seen[f"made{m}"] for m in MINORS} <= {"EPERM", "ENOENT"}, seen


def _annotation_warnings(record: dict[str, Any]) -> list[str]:
    return [w for w in record["warnings"] if w.startswith("annotation cdi.k8s.io/x")]


def passed(node: Node) -> bool:
    return node.daemon.config.read_text().count('"cdi.k8s.io/*"') == 2


def test_a_pods_own_cdi_annotation_opens_no_gpu_in_its_sandbox_or_container(node: Node) -> None:
    pod = node.pod(FORGED)
    sid = node.run_pod(pod)
    cid, seen = node.run_container(sid, pod, FORGED)
    no_gpu(seen)
    no_gpu(node.sandbox_probe(sid))
    decided = node.decisions()
    if passed(node):  # the annotation reached both configs, and was refused in both
        sandbox, container = decided[sid], decided[cid]
        assert sandbox["kubernetes"]["checkpoint_state"] == "sandbox"
        assert container["kubernetes"]["checkpoint_state"] == "read"
        assert sandbox["verdict"] == container["verdict"] == "none"
        assert _annotation_warnings(sandbox) and _annotation_warnings(container), (sandbox, container)
    else:  # containerd's defaults dropped it before the hook could see it (a no-device start may log nothing)
        assert not [w for rec in decided.values() for w in _annotation_warnings(rec)], decided
        assert {rec["verdict"] for rec in decided.values()} <= {"none"}, decided


def test_the_annotation_the_kubelets_checkpoint_carries_still_allocates(node: Node) -> None:
    """The device plugin's cdi-annotations answer for GPU 2, passed by the kubelet as a container
    annotation (it reaches config.json only where ``container_annotations`` allows it)."""
    pod = node.pod(FORGED)
    entry = checkpoint_entry(
        "nvidia.com/gpu", [UUID2], alloc_resp(annotations=PLUGIN), pod_uid=pod.uid, container="cuda"
    )
    node.ckpt.write_bytes(checkpoint([entry]))
    sid = node.run_pod(pod)
    _cid, seen = node.run_container(sid, pod, {**PLUGIN, **FORGED})
    no_gpu(node.sandbox_probe(sid))
    if passed(node):
        assert opened_gpus(seen) == {GPUS[2].minor}, seen
        assert seen[f"dev{GPUS[2].minor}"] == "ENXIO"
    else:  # nothing told containerd's runc about the device: a plugin needs the list opened
        no_gpu(seen)


def test_containerd_1_6_drops_the_cri_cdi_devices_field(node: Node) -> None:
    """A 1.28+ device plugin's CDI device (a DRA claim's too) travels in the CRI ``CDI_devices``
    field. containerd 1.6 ignores it: nothing of it reaches config.json, and the container opens no
    GPU (on 1.7.2+ containerd injects it itself)."""
    assert node.client is not None
    if not node.client.version().split()[-1].startswith("1.6."):
        pytest.skip("containerd 1.7.2+ injects CDI devices itself: the 1.6 reading does not apply")
    name = f"nvidia.com/gpu={UUID2}"
    pod = node.pod({})
    sid = node.run_pod(pod)
    command = ["/bin/sh", "-c", probe_script("/tmp")]
    spec = cri.ContainerSpec(
        name="cuda", image=IMAGE, command=command, log_path="cuda.log", cdi_devices=[name]
    )
    cid, seen = node.run_container_spec(sid, pod, spec)
    no_gpu(seen)
    assert not node.decisions().get(cid, {}).get("requests"), node.decisions()
