"""Issue 37 items 1 and 2 on a real containerd: drift detected and repaired by the DaemonSet's loop,
and the metrics holding up through a broken settings file.

A real containerd (root, state, opt and socket under a temp dir; the harness of
tests/live/test_uninstall_containerd.py: a mount namespace held by a ``sleep`` with private tmpfs
``/run`` and ``/var/log``) runs the config the installer registers. The DaemonSet's own
``install.sh`` (packaging/kubernetes/configmap.yaml) runs against it with a 1 s poll and a scratch
pod state dir. Which containerd runs and since when is read from the real ``/proc`` (a scratch
procfs of links to the real entries of this test's containerd, so another test's containerd on the
machine is not in the picture).
"""

from __future__ import annotations

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
import yaml

from tests.bundles import _hook_exe
from tests.live.livekit import RUNC, build_rootfs
from tests.live.test_uninstall_containerd import Daemon, _config
from tests.test_install import PKG, Node, make_tree

pytestmark = pytest.mark.skipif(
    shutil.which("containerd") is None or shutil.which("ctr") is None, reason="containerd not installed"
)
REPO = Path(__file__).resolve().parents[2]


def _script(name: str, tmp: Path) -> Path:
    docs = list(yaml.safe_load_all((PKG / "kubernetes/configmap.yaml").read_text()))
    scripts = next(d for d in docs if d["metadata"]["name"] == "oci-device-hook-scripts")
    path = tmp / name
    path.write_text(scripts["data"][name])
    return path


def _wait(what: str, test: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = test()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _scratch_proc(tmp: Path, daemon: Daemon) -> Path:
    """A procfs holding only this test's containerd: links to its real /proc entry and /proc/stat."""
    proc = tmp / f"proc-{uuid.uuid4().hex[:6]}"
    proc.mkdir()
    (proc / "stat").symlink_to("/proc/stat")
    assert daemon.proc is not None
    (proc / str(daemon.proc.pid)).symlink_to(f"/proc/{daemon.proc.pid}")
    return proc


def _doctor(tmp: Path, daemon: Daemon, node: Node) -> str:
    from hook.tools import doctorctd

    check, _ = doctorctd.check_node(Path("/"), _scratch_proc(tmp, daemon), str(node.libexec))
    return f"{'✓' if check.ok else '✗'} {check.detail}"


def _dumped_binaries(config: Path) -> dict[str, str]:
    """The handlers' BinaryName as containerd itself reads the file (its CRI plugin enabled here)."""
    text = config.read_text().replace('"io.containerd.grpc.v1.cri", ', "")
    scratch = config.with_name("dump-check.toml")
    scratch.write_text(text)
    out = subprocess.run(["containerd", "--config", str(scratch), "config", "dump"], capture_output=True,
                         text=True, timeout=60, check=True).stdout  # fmt: skip
    import tomllib

    runtimes = tomllib.loads(out)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    return {n: r.get("options", {}).get("BinaryName", "") for n, r in runtimes.items()}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    base = tmp_path / "ctd"
    base.mkdir()
    node = Node(tmp_path / "node")
    node.base.mkdir()
    nvidia = tmp_path / "nvidia-container-runtime"  # NVIDIA's runtime stand-in: runc
    nvidia.write_text(f"#!/bin/sh\nexec {RUNC} \"$@\"\n")
    nvidia.chmod(0o755)
    node.containerd.parent.mkdir()
    node.containerd.write_text(_config(base, nvidia))
    env = {**os.environ, "OCI_DEVICE_HOOK_CONFIG": str(node.etc / "config.yaml")}
    daemon = Daemon(base, node.containerd, env)
    ids: list[str] = []
    loop: list[subprocess.Popen[str]] = []
    try:
        daemon.hold()
        yield {"node": node, "daemon": daemon, "tree": make_tree(tmp_path / "tree"), "ids": ids,
               "rootfs": build_rootfs(tmp_path / "rootfs"), "nvidia": nvidia, "tmp": tmp_path,
               "loop": loop}  # fmt: skip
    finally:
        for p in loop:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the loop's own process group (start_new_session)
                p.wait()
        daemon.cleanup(ids)
        node.installer("uninstall", tmp_path / "tree")


def test_the_daemonset_loop_repairs_a_rewritten_config_and_is_ready_only_while_containerd_runs_it(
    world: dict[str, Any],
) -> None:
    node: Node = world["node"]
    daemon: Daemon = world["daemon"]
    tmp: Path = world["tmp"]
    operator_text = node.containerd.read_text()  # the GPU operator's config, as its toolkit writes it
    state = tmp / "pod"
    state.mkdir()
    settings = node.settings(runtime=RUNC)
    env = {"PATH": os.environ["PATH"], "SRC": str(world["tree"]), "HOST_ROOT": "/", "SETTINGS": str(settings),
           "ENGINE": "containerd", "SETTINGS_POLL_SECONDS": "1", "POD_STATE": str(state),
           "INSTALL_ARGS": " ".join(node.args()[2:])}  # fmt: skip
    log = (tmp / "install.log").open("w")
    loop = subprocess.Popen(["sh", str(_script("install.sh", tmp))], env=env, stdout=log, stderr=log,
                            text=True, start_new_session=True)  # fmt: skip
    world["loop"].append(loop)
    status = state / "registration.json"

    def verdict() -> dict[str, Any]:
        try:
            return dict(json.loads(status.read_text()))
        except (OSError, ValueError):
            return {}

    _wait("the first verdict", verdict)
    wrapper, shim = str(node.libexec / "runtime"), str(node.libexec / "handlers/nvidia")
    assert _dumped_binaries(node.containerd) == {"runc": wrapper, "nvidia": shim}
    daemon.start()  # containerd starts after the registration: it runs it
    assert _wait("ready", lambda: verdict().get("ok"))
    assert verdict()["registered"]["containerd"] == {"nvidia": True, "runc": True}
    said = _doctor(tmp, daemon, node)
    assert daemon.proc is not None and said.startswith("✓ "), said
    assert said.endswith(f"containerd runs {node.containerd} (pid {daemon.proc.pid})"), said

    # another installer rewrites config.toml: the loop logs the repair and registers again
    time.sleep(2.1)  # later than containerd's start by more than /proc's slack (btime: whole seconds)
    node.containerd.write_text(operator_text)
    _wait("the repair", lambda: "repaired: " in (tmp / "install.log").read_text())
    said_log = (tmp / "install.log").read_text()
    assert f"repaired: {node.containerd}: handler(s) nvidia, runc no longer run the hook" in said_log
    assert _dumped_binaries(node.containerd) == {"runc": wrapper, "nvidia": shim}  # containerd's own reading
    # registered on disk, but containerd still runs what it read at start: not ready, and doctor says so
    assert _wait("restart needed", lambda: verdict() and not verdict()["ok"] and verdict())
    assert "restart needed" in " ".join(verdict()["problems"])
    assert verdict()["registered"]["containerd"] == {"nvidia": False, "runc": False}
    probe = ["/bin/sh", "-c", f"grep -q '\"ok\": true' {status}"]  # the DaemonSet's readiness probe
    assert subprocess.run(probe).returncode == 1
    said = _doctor(tmp, daemon, node)
    assert said.startswith("✗ registered, restart needed: ") and str(node.containerd) in said, said
    metrics = subprocess.run([*node_hook(node), "metrics", "--config", str(settings), "--registration",
                              str(status)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert 'oci_device_hook_registered{engine="containerd",handler="runc"} 0.0' in metrics.stdout, metrics
    # containerd restarts (RESTART_ENGINE=true would do it): ready again, and the gauge says 1
    daemon.stop()
    daemon.start()
    assert _wait("ready again", lambda: verdict().get("ok"))
    assert subprocess.run(probe).returncode == 0
    assert _doctor(tmp, daemon, node).startswith("✓ ")
    metrics = subprocess.run([*node_hook(node), "metrics", "--config", str(settings), "--registration",
                              str(status)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert 'oci_device_hook_registered{engine="containerd",handler="runc"} 1.0' in metrics.stdout
    # an uninstall now restores the operator's rewrite, not the text from before it
    os.killpg(loop.pid, signal.SIGKILL)
    loop.wait()
    assert node.installer("uninstall", world["tree"]).returncode == 0
    assert node.containerd.read_text() == operator_text


def node_hook(node: Node) -> list[str]:
    """``hook`` from this tree (the scratch install's tree carries no prometheus_client; the .deb does)."""
    return _hook_exe()


def test_metrics_and_log_hold_up_through_a_broken_settings_file(world: dict[str, Any]) -> None:
    """A broken settings file fails the privileged container at the wrapper; ``hook metrics`` still
    counts the error (settings_valid 0) and ``hook log`` shows it with containerd's container id."""
    node: Node = world["node"]
    daemon: Daemon = world["daemon"]
    rootfs, ids = world["rootfs"], world["ids"]
    settings = node.settings(runtime=RUNC)
    proc = node.installer("install", world["tree"], "--engine", "containerd", "--settings", str(settings))
    assert proc.returncode == 0, proc.stderr
    daemon.start()
    installed = node.etc / "config.yaml"
    installed.write_text(installed.read_text() + "privileged_allocation: [narrow\n")  # one bad edit
    cid = f"odh-m-{uuid.uuid4().hex[:8]}"
    ids.append(cid)
    fifo, runc = str(daemon.base / "fifo"), str(daemon.base / "runc")
    run = daemon.ctr("run", "-d", "--privileged", "--fifo-dir", fifo, "--runc-root", runc, "--cgroup",
                     f"/odh-live/{cid}", "--runc-binary", str(node.libexec / "runtime"), "--rootfs",
                     str(rootfs), cid, "/bin/sleep", "100000")  # fmt: skip
    assert run.returncode != 0 and str(installed) in run.stderr, run.stderr  # failed closed, named
    records = [json.loads(ln) for ln in node.log.read_text().splitlines()]
    assert records[-1]["verdict"] == "error" and records[-1]["container"]["id"] == cid, records[-1]
    got = subprocess.run([*node_hook(node), "metrics", "--config", str(installed)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert got.returncode == 0 and got.stderr.startswith(f"hook: warning: {installed}"), got.stderr
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(got.stdout) for s in f.samples}  # fmt: skip
    assert samples[("oci_device_hook_settings_valid", ())] == 0
    errors = sum(v for (n, _), v in samples.items() if n == "oci_device_hook_errors_total")
    assert errors >= 1 and samples[("oci_device_hook_build_info", (("version", _version()),))] == 1
    shown = subprocess.run([*node_hook(node), "log", "--config", str(installed), "--format", "json"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.returncode == 0 and cid in shown.stdout, shown.stderr


def _version() -> str:
    from hook.core.version import VERSION

    return VERSION
