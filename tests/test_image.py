"""Issue 15 item 4: the DaemonSet image, built here with podman from a base assembled from this
machine's python3 and busybox (no registry), run the DaemonSet way (the node's / at /host,
privileged, read-only root, the ConfigMap's scripts and settings mounted), proving that it
installs, registers with podman (hooks.d) and a test containerd, and uninstalls cleanly.

The node paths the image writes are redirected to a temp dir with ``INSTALL_ARGS`` (the host's
/usr, /etc and /var are never touched); podman uses a private store under a short temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.test_install import (
    BUSYBOX,
    CGROUP_PARENT,
    Node,
    _podman,
    _start_containerd,
    _stop,
    remove_scratch_cgroup,
)
from tests.test_teardown import FakeApi, fake_api_server

REPO = Path(__file__).resolve().parents[1]
CGROUP = f"/odh-image-{os.getpid()}"


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("podman", "dpkg-deb", "containerd", "unshare", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not BUSYBOX or not Path("/usr/bin/python3").exists():
        return "busybox and /usr/bin/python3"
    return ""


pytestmark = pytest.mark.skipif(bool(_missing()), reason=_missing() or "ok")


def _podman_cmd(store: Path) -> list[str]:
    return [
        "podman", "--runtime", "runc", "--root", str(store / "s"), "--runroot", str(store / "r"),
        "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def image(built_deb: Path) -> Iterator[tuple[Path, str]]:
    store = Path(tempfile.mkdtemp(prefix="odhi-", dir="/tmp"))  # podman: runroot under 50 characters
    try:
        env = {**os.environ, "PODMAN": " ".join(_podman_cmd(store))}
        build = [str(REPO / "packaging/image/build-image"), str(built_deb)]
        proc = subprocess.run(build, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield store, proc.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([*_podman_cmd(store), "rmi", "-a", "-f"], capture_output=True, timeout=300)
        shutil.rmtree(store, ignore_errors=True)
        remove_scratch_cgroup(CGROUP)
        remove_scratch_cgroup(CGROUP_PARENT)  # the podman run that checks the registration


def _daemonset_run(
    store: Path, tag: str, node: Node, script: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The DaemonSet's container: privileged, read-only root, / at /host, scripts and settings mounted."""
    scripts = node.base / "scripts"
    scripts.mkdir(exist_ok=True)
    cm = next(d for d in yaml.safe_load_all((REPO / "packaging/kubernetes/configmap.yaml").read_text())
              if d["metadata"]["name"] == "oci-device-hook-scripts")  # fmt: skip
    for name, text in cm["data"].items():
        (scripts / name).write_text(text)
    settings = node.settings()
    envs = {"WATCH_SETTINGS": "false", "INSTALL_ARGS": " ".join(node.args()[2:]), **env}
    cmd = [
        *_podman_cmd(store), "run", "--rm", "--privileged", "--read-only", "--network", "none",
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--cgroup-parent", CGROUP,
        "-v", "/:/host", "-v", f"{scripts}:/scripts:ro", "-v", f"{settings}:/config/config.yaml:ro",
        *(f"--env={k}={v}" for k, v in envs.items()), tag, "/bin/sh", f"/scripts/{script}",
    ]  # fmt: skip
    return subprocess.run(["unshare", "-m", "--propagation", "private", *cmd], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_the_image_installs_registers_and_uninstalls(image: tuple[Path, str], tmp_path: Path) -> None:
    store, tag = image
    node = Node(tmp_path / "node")
    base = node.base / "containerd"
    base.mkdir(parents=True)
    original = (
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n[grpc]\n  address = "{base}/c.sock"\n'
        f'[ttrpc]\n  address = "{base}/t.sock"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{base}/opt"\n'  # never the host's /opt
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    node.containerd.write_text(original)
    short = Path(tempfile.mkdtemp(prefix="odh-", dir="/tmp"))
    try:
        run = _daemonset_run(store, tag, node, "install.sh", ENGINE="all")
        assert run.returncode == 0, run.stdout + run.stderr
        assert "installed 0.1.0 for Python 3." in run.stderr
        assert os.readlink(node.libexec / "current") == "versions/0.1.0"
        # podman runs the hook the image registered
        rootfs = node.base / "rootfs"
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
            (rootfs / d).mkdir(parents=True)
        shutil.copy2(BUSYBOX, rootfs / "bin/busybox")
        (rootfs / "bin/sh").symlink_to("busybox")
        ctr = _podman(short, node.hooks, rootfs, "--privileged")
        assert ctr.returncode == 0 and ctr.stdout == "started\n", ctr.stderr
        assert json.loads(node.log.read_text().splitlines()[-1])["engine"] == "podman"
        # a test containerd loads the registration
        log = base / "containerd.log"
        proc = _start_containerd(node.containerd, log)
        try:
            assert f"BinaryName:{node.libexec}/runtime" in log.read_text()
        finally:
            _stop(proc)
        stop = _daemonset_run(store, tag, node, "uninstall.sh")  # a rolling upgrade's preStop: no-op
        assert stop.returncode == 0 and (node.libexec / "current").is_symlink()
    finally:
        stop = _daemonset_run(store, tag, node, "uninstall.sh", UNINSTALL_ON_STOP="true")
        shutil.rmtree(short, ignore_errors=True)
    assert stop.returncode == 0, stop.stderr
    assert "removed 0.1.0" in stop.stderr
    assert node.containerd.read_text() == original
    # containerd was registered: its shims may still name the wrapper, so a pass-through stays there
    assert [p.name for p in node.libexec.iterdir()] == ["runtime"]
    assert [p.name for p in node.state.iterdir()] == ["pass-throughs"]  # what a later purge may delete
    assert "# oci-device-hook pass-through" in (node.libexec / "runtime").read_text()
    assert f"left pass-throughs to the real runtime at {node.libexec}/runtime" in stop.stderr
    assert list(node.hooks.iterdir()) == []
    assert tomllib.loads(original)  # still a valid config


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApi, str, Path]]:
    with fake_api_server(tmp_path) as got:
        yield got


def test_the_image_runs_the_charts_teardown_job_as_nobody(
    image: tuple[Path, str], api: tuple[FakeApi, str, Path], tmp_path: Path
) -> None:
    """Issue 37 item 4: the chart's pre-delete Job command, as the chart renders it, in the image,
    as uid 65534 with a read-only root and its ServiceAccount token mounted where a pod has it;
    the API server is the fake on 127.0.0.1 (the host's network namespace, loopback only)."""
    from tests.helmlite import render_chart

    store, tag = image
    fake, url, token = api
    docs = yaml.safe_load_all(render_chart(REPO / "packaging/helm/oci-device-hook", {"image": {"tag": "1"}},
                                           namespace="gpu-guard")["uninstall-hook.yaml"])  # fmt: skip
    job = next(d for d in docs if d and d["kind"] == "Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token.read_text())
    cmd = [*_podman_cmd(store), "run", "--rm", "--read-only", "--network", "host",
           "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
           "--user", str(c["securityContext"]["runAsUser"]), "--cgroup-parent", CGROUP,
           "-v", f"{sa}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
           tag, *c["command"], "--api", url]  # fmt: skip
    res = subprocess.run(["unshare", "-m", "--propagation", "private", *cmd], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(fake.patches) == 1 and "deleting it now uninstalls every node" in res.stderr
