"""Issue 37 item 1: registration drift is detected, repaired and visible (``hook.tools.install.drift``).

A scratch node under ``tmp_path`` (``--root``): containerd's config registered by the installer, then
rewritten by another tool (a GPU-operator-shaped config: NVIDIA's runtime the default, runc plain),
or registered after containerd started (a scratch procfs says when it did). ``installer status
--check`` exits 1 on either; ``installer repair`` registers again on top of the other tool's text,
which an uninstall then restores byte for byte; ``hook metrics --registration`` shows the gauge.
The same on a real containerd: tests/live/test_drift_containerd.py.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hook.tools.install import containerd as ictd
from hook.tools.install import drift
from hook.tools.install import main as imain
from hook.tools.install import node as inode
from hook.tools.install.state import read_record, write_record
from tests.bundles import hook_cli, settings_file
from tests.test_containerd_node import CRI, NODE_CONFIG, _proc_entry, _wrapper
from tests.test_install import REPO

OPERATOR_CONFIG = textwrap.dedent(f"""\
    version = 2
    # rewritten by the GPU operator's toolkit: NVIDIA's runtime the default
    [plugins."{CRI}".containerd]
      default_runtime_name = "nvidia"
    [plugins."{CRI}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI}".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{CRI}".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/bin/nvidia-container-runtime"
    """)
ARGS = ["--libexec", "/opt/odh", "--state-dir", "/var/lib/odh"]


def _node(root: Path, action: str = "status", *extra: str) -> inode.Node:
    opts = imain._parser().parse_args([action, "--root", str(root), *ARGS, "--proc", "/proc-scratch", *extra])
    return inode.Node(str(root), opts)


def _installer(root: Path, *args: str) -> int:
    return imain.main([*args, "--root", str(root), *ARGS, "--proc", "/proc-scratch", "--src", str(root)])


@pytest.fixture
def registered(tmp_path: Path) -> Path:
    """A node whose containerd config the installer registered (recorded as an install does)."""
    root = tmp_path / "root"
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(NODE_CONFIG)
    _wrapper(root)
    node = _node(root)
    rec: dict[str, Any] = {"version": "0.1.0", "libexec": "/opt/odh"}
    assert ictd.register_handlers(node, rec)
    write_record(node, rec)
    (root / "proc-scratch").mkdir()
    return root


def test_a_registered_node_has_no_drift(registered: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = drift.judge(_node(registered), read_record(_node(registered)))
    assert verdict["ok"] and verdict["registered"] == {"containerd": {"runc": True}}, verdict
    assert _installer(registered, "status", "--check") == 0
    assert json.loads(capsys.readouterr().out)["drift"]["ok"] is True


def test_another_tools_rewrite_is_drift_and_repair_registers_again_over_it(
    registered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = registered / "etc/containerd/config.toml"
    config.write_text(OPERATOR_CONFIG)  # the GPU operator's toolkit, after our registration
    verdict = drift.judge(_node(registered), read_record(_node(registered)))
    assert not verdict["ok"] and verdict["registered"]["containerd"] == {"runc": False, "nvidia": False}
    assert verdict["problems"] == [
        "/etc/containerd/config.toml: handler(s) nvidia, runc no longer run the hook (the file was rewritten "
        "since it was registered)"
    ]
    status = registered / "status.json"
    assert _installer(registered, "status", "--check", "--write", str(status)) == 1
    err = capsys.readouterr().err
    assert "drift: /etc/containerd/config.toml: handler(s) nvidia, runc no longer run the hook" in err
    assert json.loads(status.read_text())["ok"] is False
    assert _installer(registered, "status") == 0  # without --check: the record, exit 0 as before

    assert _installer(registered, "repair") == 0
    err = capsys.readouterr().err
    assert "repaired: /etc/containerd/config.toml: handler(s) nvidia, runc no longer run the hook" in err
    assert "restart containerd to take effect" in err
    text = config.read_text()
    assert 'BinaryName = "/opt/odh/runtime"' in text and "/opt/odh/handlers/nvidia" in text
    shim = (registered / "opt/odh/handlers/nvidia").read_text()
    assert "OCI_DEVICE_HOOK_REAL_RUNTIME='/usr/bin/nvidia-container-runtime'" in shim
    assert drift.judge(_node(registered), read_record(_node(registered)))["ok"]
    assert _installer(registered, "repair") == 0 and "repaired" not in capsys.readouterr().err  # idempotent
    # an uninstall now restores the operator's text, not the one from before it rewrote the file
    assert ictd.restore_handlers(_node(registered), read_record(_node(registered))["containerd"])
    assert config.read_text() == OPERATOR_CONFIG


def test_a_registration_newer_than_containerd_is_drift_until_it_restarts(
    registered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = registered / "etc/containerd/config.toml"
    os.utime(config, (1_800_000_000, 1_800_000_000))
    proc = registered / "proc-scratch"
    _proc_entry(proc, 777, ["/usr/bin/containerd"], started=1_799_999_000)  # started before
    verdict = drift.judge(_node(registered), read_record(_node(registered)))
    assert not verdict["ok"] and verdict["registered"] == {"containerd": {"runc": False}}
    assert verdict["rewritten"] == []  # nothing to write: containerd must read it
    assert verdict["problems"] == [
        "/etc/containerd/config.toml: registered, /etc/containerd/config.toml changed after containerd "
        "(pid 777) started: restart needed"
    ]
    assert _installer(registered, "status", "--check") == 1
    assert _installer(registered, "repair") == 0 and "repaired" not in capsys.readouterr().err
    (proc / "777").rename(proc / "778")  # a containerd of another config dir is not this one
    (proc / "778/cmdline").write_bytes(b"/usr/bin/containerd\0-c\0/etc/k3s/config.toml\0")
    assert drift.judge(_node(registered), read_record(_node(registered)))["ok"]
    _proc_entry(proc, 779, ["/usr/bin/containerd"], started=1_800_000_100)  # restarted after
    assert drift.judge(_node(registered), read_record(_node(registered)))["ok"]
    assert _installer(registered, "status", "--check") == 0


def test_hook_metrics_shows_the_registered_gauge_from_the_status_file(
    registered: Path, tmp_path: Path
) -> None:
    settings_file(tmp_path)
    status = tmp_path / "status.json"
    config = registered / "etc/containerd/config.toml"
    for rewritten, expected in ((False, 1.0), (True, 0.0)):
        if rewritten:
            config.write_text(OPERATOR_CONFIG)
        _installer(registered, "status", "--write", str(status))
        res = hook_cli("metrics", "--config", str(tmp_path / "settings.yaml"), "--registration", str(status))
        assert res.returncode == 0, res.stderr
        line = 'oci_device_hook_registered{engine="containerd",handler="runc"} '
        assert f"{line}{expected}" in res.stdout, res.stdout
    status.write_text('{"registered": {"containerd": {"bad name\\n": true, "runc": "yes"}}}')
    res = hook_cli("metrics", "--config", str(tmp_path / "settings.yaml"), "--registration", str(status))
    assert res.returncode == 0 and "oci_device_hook_registered{" not in res.stdout  # outside the shapes


def test_the_debs_metrics_timer_keeps_the_verdict_it_reads(tmp_path: Path) -> None:
    """The .deb's metrics service writes the verdict before each run (a failure does not stop the
    counters: ``-``) and hands the same file to ``hook metrics --registration``; a node with nothing
    registered with containerd is ok, with no registered series."""
    unit = (REPO / "packaging/debian/oci-device-hook-metrics.service").read_text()
    lines = dict(ln.split("=", 1) for ln in unit.splitlines() if ln.startswith("Exec"))
    pre, start = lines["ExecStartPre"].split(), lines["ExecStart"].split()
    assert pre[0] == "-/usr/libexec/oci-device-hook/installer" and pre[1:3] == ["status", "--write"]
    assert start[1:3] == ["metrics", "--textfile"] and start[start.index("--registration") + 1] == pre[3]
    root = tmp_path / "root"
    root.mkdir()
    status = tmp_path / "registration.json"
    assert _installer(root, "status", "--check", "--write", str(status)) == 0
    assert json.loads(status.read_text())["ok"] is True and json.loads(status.read_text())["registered"] == {}


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="the node interpreter /usr/bin/python3")
def test_a_removed_hooks_d_file_is_drift_and_repair_writes_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CRI-O and podman read the hooks.d file at each container: one that is gone (or names another
    hook) is drift for the gauge and the probe, and ``repair`` writes it again from the package tree."""
    from tests.test_install import Node, make_tree

    tree = make_tree(tmp_path / "tree")
    node = Node(tmp_path / "node")
    node.base.mkdir()
    try:
        assert node.installer("install", tree, "--engine", "hooks.d").returncode == 0
        hooks_file = node.hooks / "oci-device-hook.json"
        written = hooks_file.read_text()
        assert node.installer("status", tree, "--check").returncode == 0
        hooks_file.unlink()  # another tool's clean-up
        got = node.installer("status", tree, "--check")
        assert got.returncode == 1 and f"drift: {hooks_file}: gone, or no longer names" in got.stderr
        assert json.loads(got.stdout)["drift"]["registered"] == {"hooks.d": {"oci-device-hook.json": False}}
        got = node.installer("repair", tree)
        assert got.returncode == 0 and f"repaired: {hooks_file}: gone" in got.stderr, got.stderr
        assert hooks_file.read_text() == written and node.installer("status", tree, "--check").returncode == 0
    finally:
        node.installer("uninstall", tree)


def test_both_manifests_probe_and_mount_the_verdict_install_sh_keeps() -> None:
    """The installer container is ready only on the verdict install.sh writes in the pod's state
    dir; the metrics container reads that same file (read-only), in the kustomize base and the chart."""
    import yaml

    from tests.test_chart import objects

    base = yaml.safe_load((REPO / "packaging/kubernetes/daemonset.yaml").read_text())
    for ds in (base, objects()["DaemonSet/oci-device-hook"]):
        containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
        probe = " ".join(containers["installer"]["readinessProbe"]["exec"]["command"])
        assert "/run/pod/registration.json" in probe and '"ok": true' in probe
        mounts = {m["name"]: m for m in containers["metrics"]["volumeMounts"]}
        assert mounts["pod-state"]["mountPath"] == "/run/pod" and mounts["pod-state"]["readOnly"] is True
    scripts = next(d for d in yaml.safe_load_all((REPO / "packaging/kubernetes/configmap.yaml").read_text())
                   if d["metadata"]["name"] == "oci-device-hook-scripts")["data"]  # fmt: skip
    assert '--write "$state/registration.json"' in scripts["install.sh"]
    assert '--registration "${POD_STATE:-/run/pod}/registration.json"' in scripts["metrics.sh"]
