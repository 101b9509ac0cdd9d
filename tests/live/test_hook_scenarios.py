"""The real ``hook`` as a runc prestart hook, on the seed scenarios, cgroup v1 and v2.

Each container probes its nodes: EPERM = the device cgroup denies, ENXIO = allowed (a fake
node with no driver behind it), ENOENT = the node is gone. ``mknod`` inside the container
re-creates a removed node, so a test can tell "removed" from "removed *and* denied".
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.hosttree import CAPS_MAJOR, UVM_MAJOR, cap_minor
from tests.live.livekit import (
    Bundle,
    build_bundle,
    char_device,
    hook,
    parse_probe,
    private_host,
    probe_args,
    run_container,
)

REPO = Path(__file__).resolve().parents[2]
SLICE_UUID = "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"
MIG_UUID = "MIG-07ad8e7c-0197-5973-bd05-7fcd18ae754e"
CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_MKNOD", "CAP_SETGID", "CAP_SETUID", "CAP_KILL"]
OWN_GI, OWN_CI = cap_minor(0, 1), cap_minor(0, 1, 0)
SIBLING_GI = cap_minor(0, 2)


def the_hook(host: dict[str, Path], *cdi_dirs: Path) -> dict[str, list[dict[str, object]]]:
    args = [
        sys.executable,
        "-I",
        "-m",
        "hook",
        "prestart",
        "--driver-root",
        str(host["root"]),
        "--config",
        str(host["settings"]),
    ]
    for d in cdi_dirs or (host["no_cdi"],):
        args += ["--cdi-spec-dir", str(d)]
    return {"prestart": [hook(sys.executable, args)]}


def host_nodes() -> list[dict[str, object]]:
    caps = [1, 2, OWN_GI, OWN_CI, SIBLING_GI, SIBLING_GI + 1]
    return (
        [char_device(f"/dev/nvidia{i}", 195, i) for i in range(8)]
        + [char_device("/dev/nvidiactl", 195, 255), char_device("/dev/nvidia-uvm", UVM_MAJOR, 0)]
        + [char_device(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m) for m in caps]
    )


def privileged(
    bundle_dir: Path,
    host: dict[str, Path],
    env: list[str],
    probes: list[str],
    *,
    mknods: Sequence[tuple[str, int, int]] = (),
    annotations: dict[str, str] | None = None,
    cdi: tuple[Path, ...] = (),
):
    """The live privileged shape: allow-all rule, every host node, a bounding set with SYS_ADMIN."""
    b = build_bundle(
        bundle_dir,
        probe_args(probes),
        hooks=the_hook(host, *cdi),
        devices=host_nodes(),
        cgroup_devices=[{"allow": True, "access": "rwm"}],
        env=["PATH=/bin", *env],
        annotations=annotations,
    )
    caps = [*CAPS, "CAP_SYS_ADMIN"]
    b.config["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    plant(b.rootfs, mknods)
    return b.write()


def plant(rootfs: Path, nodes: Sequence[tuple[str, int, int]]) -> None:
    """Device nodes put in the rootfs before start: opening one shows the cgroup's verdict alone."""
    for path, major, minor in nodes:
        os.mknod(rootfs / path.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def slice_pod(bundle_dir: Path, host: dict[str, Path], probes: Sequence[str] = ()) -> Bundle:
    """Seed 000's privileged pod with a HAMi slice of GPU-a158631e (host index 1); /tmp/n0 is a
    planted c 195:0 node, so a probe of it shows the cgroup's verdict on card 0 alone."""
    return privileged(
        bundle_dir,
        host,
        [f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m"],
        list(probes) or ["/dev/nvidia1", "/dev/nvidia0", "/tmp/n0"],
        mknods=[("/tmp/n0", 195, 0)],
    )


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_seed000_slice_pod_is_narrowed_to_its_card(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    probes = ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia7", "/tmp/n0"]
    b = slice_pod(bundle_dir, host, [*probes, "/dev/nvidia-caps/nvidia-cap2"])
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert seen == {
        "/dev/nvidia1": "ENXIO",  # the allocated card: allowed
        "/dev/nvidiactl": "ENXIO",  # control node kept
        "/dev/nvidia0": "ENOENT",  # other cards removed...
        "/dev/nvidia7": "ENOENT",
        "/tmp/n0": "EPERM",  # ...and denied even when re-created
        "/dev/nvidia-caps/nvidia-cap2": "ENOENT",
    }
    record = json.loads(host["log"].read_text().splitlines()[-1])
    assert record["verdict"] == "apply" and record["cgroup_version"] == (2 if cgroup2 else 1)
    if cgroup2:  # runc's own program was replaced by ours (which falls through to it)
        ids = record["program_ids"]
        assert ids["changed"] is True and len(ids["replaced"]) == 1 and ids["attached"] != ids["replaced"]


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_seed000_mig_pod_sees_only_parent_and_own_caps(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    own = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (OWN_GI, OWN_CI)]
    b = privileged(
        bundle_dir,
        host,
        [],
        [
            "/dev/nvidia0",
            *own,
            "/dev/nvidia1",
            f"/dev/nvidia-caps/nvidia-cap{SIBLING_GI}",
            "/tmp/sib",
            "/tmp/cfg",
        ],
        mknods=[("/tmp/sib", CAPS_MAJOR, SIBLING_GI), ("/tmp/cfg", CAPS_MAJOR, 1)],
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={MIG_UUID}"},
        cdi=(REPO / "examples" / "node" / "cdi",),
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert {p: seen[p] for p in ["/dev/nvidia0", *own]} == dict.fromkeys(["/dev/nvidia0", *own], "ENXIO")
    assert seen["/dev/nvidia1"] == "ENOENT"
    assert seen[f"/dev/nvidia-caps/nvidia-cap{SIBLING_GI}"] == "ENOENT"
    assert seen["/tmp/sib"] == "EPERM" and seen["/tmp/cfg"] == "EPERM"


def seed001(bundle_dir: Path, host: dict[str, Path], caps: list[str]):
    nodes = [n for n in host_nodes() if n["minor"] not in (1, 2) or n["major"] != CAPS_MAJOR]
    rules = [{"allow": False, "access": "rwm"}] + [
        {"allow": True, "type": "c", "major": n["major"], "minor": n["minor"], "access": "rwm"} for n in nodes
    ]
    env = [
        "PATH=/bin",
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_MIG_MONITOR_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    ]
    script = probe_args(
        ["/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap1", "/tmp/cfg", "/dev/nvidia3"]
    )
    b = build_bundle(bundle_dir, script, hooks=the_hook(host), devices=nodes, cgroup_devices=rules, env=env)
    b.config["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    plant(b.rootfs, [("/tmp/cfg", CAPS_MAJOR, 1)])
    return b.write()


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_seed001_plugin_pod_opens_monitor_not_config(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    res = run_container(seed001(bundle_dir, host, [*CAPS, "CAP_SYS_ADMIN"]), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {
        "/dev/nvidia-caps/nvidia-cap2": "ENXIO",  # monitor: created and allowed
        "/dev/nvidia-caps/nvidia-cap1": "ENOENT",  # config: never created...
        "/tmp/cfg": "EPERM",  # ...nor allowed
        "/dev/nvidia3": "ENXIO",
    }


def test_seed001_without_sys_admin_is_refused_with_one_line(bundle_dir: Path, host: dict[str, Path]) -> None:
    res = run_container(seed001(bundle_dir, host, CAPS))
    assert res.rc != 0
    assert "needs CAP_SYS_ADMIN" in res.stderr
    assert "PROBE" not in res.stdout


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_plain_container_is_untouched(bundle_dir: Path, host: dict[str, Path], cgroup2: bool) -> None:
    b = build_bundle(bundle_dir, probe_args(["/dev/null", "/dev/nvidia0"]), hooks=the_hook(host))
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/null": "OK", "/dev/nvidia0": "ENOENT"}


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_running_the_hook_twice_changes_nothing_more(
    bundle_dir: Path, host: dict[str, Path], cgroup2: bool
) -> None:
    """Two registrations of the same hook (e.g. hooks.d plus a base spec) narrow exactly once."""
    b = slice_pod(bundle_dir, host)
    b.config["hooks"]["prestart"] *= 2
    res = run_container(b.write(), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
    first, second = (json.loads(line) for line in host["log"].read_text().splitlines()[-2:])
    assert first["cgroup"] == second["cgroup"]
    if cgroup2:  # the second run finds its own program (same rule digest) and attaches nothing new
        assert second["program_ids"] == {**second["program_ids"], "changed": False}


def test_crun_on_cgroup_v2_narrows_the_slice_pod(bundle_dir: Path, host: dict[str, Path]) -> None:
    """crun loads its own eBPF program; the hook must wrap it the same way it wraps runc's."""
    crun = shutil.which("crun")
    if crun is None:
        pytest.skip("crun is not installed")
    b = slice_pod(bundle_dir, host)
    state = bundle_dir / "crun-state"
    proc = subprocess.run(
        private_host([crun, "--root", str(state), "run", "--bundle", str(b.path), b.id], cgroup2=True),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    delete = [crun, "--root", str(state), "delete", "-f", b.id]
    subprocess.run(private_host(delete, cgroup2=True), capture_output=True, timeout=30)
    if "setrlimit (RLIM_MEMLOCK)" in proc.stderr:
        # crun raises RLIMIT_MEMLOCK to infinity before loading eBPF: that needs CAP_SYS_RESOURCE,
        # which this machine's bounding set lacks. Nothing of the hook ran.
        pytest.skip("crun cannot raise RLIMIT_MEMLOCK here (no CAP_SYS_RESOURCE)")
    assert proc.returncode == 0, proc.stderr
    assert parse_probe(proc.stdout) == {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
