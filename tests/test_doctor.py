"""hook doctor: each check on a fake host, the text checklist, the JSON list and the exit status."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hook.tools import checks, doctor, doctorhooks
from tests.bundles import hook_cli
from tests.hosttree import make_host_tree

REPO = Path(__file__).resolve().parents[1]
V1_HYBRID = (
    "sysfs /sys sysfs rw 0 0\n"
    "tmpfs /sys/fs/cgroup tmpfs ro,nosuid 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    "cgroup /sys/fs/cgroup/devices cgroup rw,nosuid,devices 0 0\n"
)
V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
SPEC = """cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0
"""


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A healthy host: driver tree, one CDI spec, the hooks.d file pointing at an executable."""
    root = tmp_path / "root"
    make_host_tree(root, "8x-mig", mknod=False)
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(SPEC)
    exe = tmp_path / "hook-exe"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    doc = json.loads((REPO / "nvidia-hook.json").read_text())
    doc["hook"]["path"] = str(exe)
    (hooks / doctorhooks.HOOKS_FILE).write_text(json.dumps(doc))
    mounts = tmp_path / "mounts"
    mounts.write_text(V1_HYBRID)
    settings = tmp_path / "config.yaml"
    shutil.copy(REPO / "packaging/config.yaml", settings)
    host = tmp_path / "host"  # the kubelet's files: none (not a Kubernetes node) unless a test adds them
    host.mkdir()
    return {
        "root": root,
        "specs": specs,
        "hooks": hooks,
        "exe": exe,
        "mounts": mounts,
        "settings": settings,
        "host": host,
    }


def _run(h: dict[str, Path], fmt: str = "json") -> tuple[list[dict], int]:
    out, code = doctor.run_doctor(
        h["root"],
        [h["specs"]],
        [h["hooks"]],
        h["settings"],
        fmt,
        mounts_file=h["mounts"],
        containerd_config=h["root"] / "etc/containerd/config.toml",
        host_root=h["host"],
    )
    return (json.loads(out) if fmt == "json" else out), code


def _by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


def test_healthy_host_passes_every_check(host: dict[str, Path]) -> None:
    checks, code = _run(host)
    assert code == 0, checks
    assert [c["name"] for c in checks] == [
        "driver", "cdi", "cgroup", "hooks.d", "hooks.d order", "containerd", "settings", "kubelet",
        "kubelet DRA", "decider", "crun systemd driver", "interpreter",
    ]  # fmt: skip
    assert all(set(c) >= {"name", "ok", "detail"} for c in checks)
    by = _by_name(checks)
    assert "nvidia 195" in by["driver"]["detail"] and "nvidia-caps 237" in by["driver"]["detail"]
    assert "8 GPU node(s)" in by["driver"]["detail"]
    assert by["cgroup"]["detail"].startswith("v1 hybrid")


def test_text_checklist_marks_and_hints(host: dict[str, Path]) -> None:
    (host["root"] / "proc/devices").write_text("Character devices:\n  1 mem\n195 nvidia\n")
    text, code = _run(host, "text")
    assert code == 1
    assert "✓ cgroup: v1 hybrid" in text
    assert "✗ driver: " in text and "no major for nvidia-uvm, nvidia-caps" in text
    assert "    fix: load the NVIDIA kernel modules" in text
    assert text.splitlines()[-1] == "11 of 12 checks passed"


def test_driver_missing(host: dict[str, Path], tmp_path: Path) -> None:
    check = doctor.check_driver(tmp_path / "empty")
    assert not check.ok and "proc/devices" in check.detail and check.fix
    (host["root"] / "dev/nvidiactl").unlink()
    assert not doctor.check_driver(host["root"]).ok


def test_block_devices_do_not_count_as_driver_majors(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(
        "Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia\n237 nvidia-caps\n511 nvidia-uvm\n"
    )
    assert not doctor.check_driver(tmp_path).ok


def test_broken_cdi_spec_fails(host: dict[str, Path]) -> None:
    (host["specs"] / "broken.yaml").write_text('cdiVersion: "0.6.0"\nkind: bad\ndevices: []\n')
    check = doctor.check_cdi([host["specs"]])
    assert not check.ok and "broken.yaml" in check.detail


def test_no_cdi_dirs_is_fine(tmp_path: Path) -> None:
    assert doctor.check_cdi([tmp_path / "none"]).ok


def test_cgroup_versions(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(V2)
    check = doctor.check_cgroup(mounts)
    assert check.detail.startswith("v2")
    mounts.write_text("sysfs /sys sysfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    assert not doctor.check_cgroup(mounts).ok
    assert not doctor.check_cgroup(tmp_path / "missing").ok


def test_hooks_file_missing(host: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty-hooks"
    empty.mkdir()
    check = doctorhooks.check_hooks([empty, tmp_path / "absent"])
    assert not check.ok and "oci-device-hook.json" in check.fix


def test_hooks_file_pointing_at_missing_binary(host: dict[str, Path]) -> None:
    host["exe"].unlink()
    check = doctorhooks.check_hooks([host["hooks"]])
    assert not check.ok and "not an executable" in check.detail


def test_hooks_file_with_wrong_stage_or_no_when(host: dict[str, Path]) -> None:
    path = host["hooks"] / doctorhooks.HOOKS_FILE
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "stages": ["poststop"]}))
    assert not doctorhooks.check_hooks([host["hooks"]]).ok
    path.write_text(json.dumps({**doc, "when": {}}))
    assert not doctorhooks.check_hooks([host["hooks"]]).ok
    path.write_text("{not json")
    assert not doctorhooks.check_hooks([host["hooks"]]).ok


def test_later_hooks_dir_overrides_earlier(host: dict[str, Path], tmp_path: Path) -> None:
    override = tmp_path / "etc-hooks.d"
    override.mkdir()
    (override / doctorhooks.HOOKS_FILE).write_text('{"version": "0.1.0"}')
    assert not doctorhooks.check_hooks([host["hooks"], override]).ok
    assert doctorhooks.check_hooks([override, host["hooks"]]).ok


def test_hooks_file_under_another_name_is_found(host: dict[str, Path]) -> None:
    (host["hooks"] / doctorhooks.HOOKS_FILE).rename(host["hooks"] / "50-gpu.json")
    doc = json.loads((host["hooks"] / "50-gpu.json").read_text())
    assert not doctorhooks.check_hooks([host["hooks"]]).ok  # it points at a test binary, not HOOK_PATH
    doc["hook"]["path"] = checks.HOOK_PATH
    (host["hooks"] / "50-gpu.json").write_text(json.dumps(doc))
    check = doctorhooks.check_hooks([host["hooks"]])
    assert "50-gpu.json" in check.detail


def test_settings(host: dict[str, Path], tmp_path: Path) -> None:
    assert doctor.check_settings(host["settings"]).ok
    assert doctor.check_settings(tmp_path / "absent.yaml").ok
    bad = tmp_path / "bad.yaml"
    bad.write_text("privileged_allocation: maybe\n")
    check = doctor.check_settings(bad)
    assert not check.ok and "privileged_allocation" in check.detail


def test_failed_check_gives_exit_1_and_json_list(host: dict[str, Path]) -> None:
    host["settings"].write_text("no_such_key: 1\n")
    checks, code = _run(host)
    assert code == 1
    assert isinstance(checks, list)
    failed = [c["name"] for c in checks if not c["ok"]]
    assert failed == ["settings"]


# --- kubelet checkpoint (issue 12) ----------------------------------------------------------------

K3S = "var/lib/rancher/k3s/agent/kubelet/device-plugins/kubelet_internal_checkpoint"
MICROK8S = "var/snap/microk8s/common/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
DEFAULT = "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _checkpoint_at(host: Path, rel: str, data: bytes | None = None) -> Path:
    from tests.bundles import alloc_resp, checkpoint, checkpoint_entry

    path = host / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [
        checkpoint_entry("nvidia.com/gpu", ["GPU-1"], alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1"})),
        checkpoint_entry("rdma/hca", ["0"], pod_uid="other-pod"),
    ]
    path.write_bytes(checkpoint(entries) if data is None else data)
    return path


def test_kubelet_no_checkpoint_is_not_a_kubernetes_node(host: dict[str, Path]) -> None:
    c = doctor.check_kubelet(host["settings"], host["host"])
    assert c.ok and c.detail.startswith("no kubelet checkpoint at /var/lib/kubelet/")
    assert (
        "env_trusted_namespaces: gpu-operator, nvidia-gpu-operator, nvidia-device-plugin, kube-system"
        in c.detail
    )


def test_kubelet_default_checkpoint_covers_the_pods(host: dict[str, Path]) -> None:
    _checkpoint_at(host["host"], DEFAULT)
    c = doctor.check_kubelet(host["settings"], host["host"])
    assert c.ok, c.detail
    assert "2 allocation(s) of 2 pod(s), 1 of a GPU resource; pods on this node are covered" in c.detail


@pytest.mark.parametrize("rel", [K3S, MICROK8S], ids=["k3s", "microk8s"])
def test_kubelet_checkpoint_elsewhere_is_found_and_named_in_the_fix(host: dict[str, Path], rel: str) -> None:
    _checkpoint_at(host["host"], rel)
    checks, code = _run(host)
    (c,) = [c for c in checks if c["name"] == "kubelet"]
    assert (c["ok"], code) == (False, 1)
    assert "pods on this node are not covered" in c["detail"]
    assert c["fix"] == f"set kubelet_checkpoint: /{rel} in {host['settings']}"
    host["settings"].write_text(f"kubelet_checkpoint: /{rel}\n")
    c2 = doctor.check_kubelet(host["settings"], host["host"])
    assert c2.ok and "covered" in c2.detail


def test_kubelet_corrupt_checkpoint_fails_the_check(host: dict[str, Path]) -> None:
    _checkpoint_at(host["host"], DEFAULT, b'{"Data": []}')
    c = doctor.check_kubelet(host["settings"], host["host"])
    assert not c.ok and "Data: expected an object" in c.detail


# --- kubelet DRA state (issue 20) -------------------------------------------------------------------

RKE2_DRA = "var/lib/rancher/rke2/agent/kubelet/dra_manager_state"


def _dra_at(host: Path, rel: str, data: bytes | None = None) -> Path:
    from tests.dra_shapes import FIXTURES

    path = host / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((FIXTURES / "entries-two-claims.json").read_bytes() if data is None else data)
    return path


def test_doctor_prints_what_the_dra_state_holds(host: dict[str, Path]) -> None:
    _dra_at(host["host"], "var/lib/kubelet/dra_manager_state")
    text, code = _run(host, "text")
    assert code == 0, text
    assert (
        "✓ kubelet DRA: /var/lib/kubelet/dra_manager_state: 2 claim(s) of 1 pod(s), 1 CDI device(s) "
        "(drivers: test-driver.cdi.k8s.io; checksum verified); "
        "privileged pods with claims are narrowed to them"
    ) in text


def test_doctor_says_a_1_30_state_is_not_verified(host: dict[str, Path]) -> None:
    from tests.dra_shapes import FIXTURES

    legacy = (FIXTURES / "legacy-1.30-single.json").read_bytes()
    _dra_at(host["host"], "var/lib/kubelet/dra_manager_state", legacy)
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert c.ok and "Kubernetes 1.30 format, checksum not verified" in c.detail


def test_doctor_no_dra_state_is_no_dra_on_this_node(host: dict[str, Path]) -> None:
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert c.ok and c.detail.startswith("no kubelet DRA state at /var/lib/kubelet/dra_manager_state nor at")


@pytest.mark.parametrize(
    "rel",
    ["var/lib/rancher/k3s/agent/kubelet/dra_manager_state", RKE2_DRA,
     "var/snap/microk8s/common/var/lib/kubelet/dra_manager_state"],
    ids=["k3s", "rke2", "microk8s"],
)  # fmt: skip
def test_doctor_finds_the_dra_state_of_k3s_rke2_microk8s(host: dict[str, Path], rel: str) -> None:
    _dra_at(host["host"], rel)
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert not c.ok and "privileged pods with DRA claims on this node are not narrowed" in c.detail
    assert c.fix == f"set kubelet_dra_state: /{rel} in {host['settings']}"
    host["settings"].write_text(f"kubelet_dra_state: /{rel}\n")
    c2 = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert c2.ok and "2 claim(s) of 1 pod(s)" in c2.detail


def test_doctor_follows_kubelet_checkpoint_to_its_root(host: dict[str, Path]) -> None:
    _dra_at(host["host"], "var/lib/rancher/k3s/agent/kubelet/dra_manager_state")
    host["settings"].write_text(f"kubelet_checkpoint: /{K3S}\n")
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert c.ok and c.detail.startswith("/var/lib/rancher/k3s/agent/kubelet/dra_manager_state: 2 claim(s)")


def test_doctor_fails_a_corrupt_dra_state(host: dict[str, Path]) -> None:
    from tests.dra_shapes import FIXTURES

    bad = (FIXTURES / "entries-incorrect-checksum.json").read_bytes()
    _dra_at(host["host"], "var/lib/kubelet/dra_manager_state", bad)
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert not c.ok and "checksum mismatch" in c.detail and "left alone" in c.detail


def test_doctor_never_hangs_on_a_fifo_dra_state(host: dict[str, Path]) -> None:
    path = host["host"] / "var/lib/kubelet/dra_manager_state"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    c = doctor.check_kubelet_dra(host["settings"], host["host"])
    assert not c.ok and "not a regular file" in c.detail


def test_decider_check_says_whether_one_answers(tmp_path: Path, monkeypatch) -> None:
    """Issue 23 item 4: none is fine; one answering shows version, uptime, requests; a socket
    nobody answers on fails."""
    import socket
    import threading

    from hook.routes import serve, wire

    sockdir = tmp_path / "run"
    sockdir.mkdir(mode=0o700)
    monkeypatch.setattr(wire, "SOCKET_DIR", str(sockdir))
    monkeypatch.setattr(wire, "KEY_DIR", str(tmp_path / "keys"))
    none = doctor.check_decider()
    assert none.ok and none.detail.startswith("not running")
    d = serve.Decider(str(sockdir), key=wire.make_key())
    d.listen()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        up = doctor.check_decider()
    finally:
        d.close()
        t.join(5)
    assert up.ok and up.detail.startswith(f"answering: version {serve.VERSION}, pid ")
    assert " up " in up.detail and "0 request(s)" in up.detail
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sockdir / wire.SOCKET_NAME))
    down = doctor.check_decider()
    stale.close()
    assert not down.ok and "Connection refused" in down.detail


# --- issue 28 item 4: crun, the systemd driver and a minor-0 accelerator --------------------------


@pytest.mark.parametrize(
    ("crun", "systemd", "gpus", "warn"),
    [(True, True, (0, 1), True), (False, True, (0, 1), False), (True, False, (0, 1), False),
     (True, True, (1, 2), False)],
    ids=["all-three", "no-crun", "no-systemd", "no-minor-0"],
)  # fmt: skip
def test_doctor_warns_where_crun_systemd_and_a_minor_0_accelerator_meet(
    tmp_path: Path, crun: bool, systemd: bool, gpus: tuple[int, ...], warn: bool
) -> None:
    import os
    import stat

    from hook.tools.checks import render
    from hook.tools.doctorcrun import check_crun_systemd

    host, root = tmp_path / "host", tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for minor in gpus:
        os.mknod(root / "dev" / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
    if crun:
        (host / "usr/bin").mkdir(parents=True)
        (host / "usr/bin/crun").write_text("")
    if systemd:
        (host / "run/systemd/system").mkdir(parents=True)
    check = check_crun_systemd(root, host)
    assert check.ok and check.warn is warn, check
    if warn:
        assert "/dev/nvidia0 (195:0)" in check.detail and "DeviceAllow=char-195" in check.detail
        text = render([check], "text")
        assert "! crun systemd driver: /usr/bin/crun with systemd" in text
        assert "    fix: run GPU containers" in text


def test_a_broken_settings_file_is_not_reported_as_the_driver_missing(
    host: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 37 item 6: the settings file names the driver root; when it does not load (and no
    --driver-root was given), the driver line says the file is at fault, not "no major"."""
    host["settings"].write_text(f"driver_root: {host['root']}\nprivileged_alocation: narrow\n")
    default_root = tmp_path / "default-root"  # what the defaults point at: no driver there
    for given in (False, True):
        out, code = doctor.run_doctor(
            default_root, [host["specs"]], [host["hooks"]], host["settings"], "json",
            mounts_file=host["mounts"], host_root=host["host"], driver_root_given=given,
        )  # fmt: skip
        by = _by_name(json.loads(out))
        assert code == 1 and not by["driver"]["ok"] and "privileged_alocation" in by["settings"]["detail"]
        if given:  # --driver-root named it: the driver is judged there, as before
            assert "proc/devices" in by["driver"]["detail"] and "not judged" not in by["driver"]["detail"]
        else:
            assert by["driver"]["detail"].startswith(f"not judged: {host['settings']} does not load")
            assert by["driver"]["fix"] == f"fix {host['settings']} first"
    host["settings"].write_text(f"driver_root: {host['root']}\n")  # valid: the CLI reads the root from it
    res = hook_cli("doctor", "--config", str(host["settings"]), "--cdi-spec-dir", str(host["specs"]),
                   "--hooks-dir", str(host["hooks"]), "--format", "json")  # fmt: skip
    assert _by_name(json.loads(res.stdout))["driver"]["ok"]
