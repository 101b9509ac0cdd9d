"""The real hook under runc on the shuffled node: GPU index != device minor, majors 507/511/509,
MIG on index 2 (minor 6). What the container can open shows which card it really got.

Rule: the container's ``linux.devices`` carry the host's real numbers; a hook that reasons in
indices or in the usual majors leaves the wrong node reachable, and the probes see it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.hosttree import HostSpec, cap_minor, make_host_tree
from tests.live.livekit import build_bundle, char_device, hook, parse_probe, probe_args, run_container
from tests.nvidia.fake_pynvml import FakeNvml

CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_MKNOD", "CAP_SETGID", "CAP_SETUID", "CAP_KILL"]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, object]:
    from hook.sources.nvidia.inventory import dumps, load

    root = tmp_path / "driver-root"
    spec = make_host_tree(root, "8x-shuffled", mknod=True)
    inventory = tmp_path / "inventory.json"
    inventory.write_text(dumps(load(root, None, None, True, nvml_module=FakeNvml(spec))))
    (tmp_path / "no-cdi").mkdir()
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"log_file: {tmp_path}/hook.log\ncache_dir: {tmp_path}/cache\n")
    return {"root": root, "spec": spec, "inventory": inventory, "settings": settings, "tmp": tmp_path}


def _hook(node: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    args = [sys.executable, "-I", "-m", "hook", "prestart", "--driver-root", str(node["root"]),
            "--inventory", str(node["inventory"]), "--config", str(node["settings"]),
            "--cdi-spec-dir", str(node["tmp"] / "no-cdi")]  # type: ignore[operator]  # fmt: skip
    return {"prestart": [hook(sys.executable, args)]}


def _host_nodes(spec: HostSpec) -> list[dict[str, object]]:
    caps = [1, 2] + [cap_minor(m.parent_minor, m.gi, c) for m in spec.migs for c in (None, m.ci)]
    return (
        [char_device(f"/dev/nvidia{g.minor}", spec.nvidia_major, g.minor) for g in spec.gpus]
        + [char_device("/dev/nvidiactl", spec.nvidia_major, 255)]
        + [char_device("/dev/nvidia-uvm", spec.uvm_major, 0)]
        + [char_device(f"/dev/nvidia-caps/nvidia-cap{m}", spec.caps_major, m, 0o444) for m in caps]
    )


def _privileged(bundle_dir: Path, node: dict[str, object], env: list[str], probes: list[str], plant):
    spec: HostSpec = node["spec"]  # type: ignore[assignment]
    b = build_bundle(
        bundle_dir,
        probe_args(probes),
        hooks=_hook(node),
        devices=_host_nodes(spec),
        cgroup_devices=[{"allow": True, "access": "rwm"}],
        env=["PATH=/bin", *env],
    )
    b.config["process"]["capabilities"] = {
        k: [*CAPS, "CAP_SYS_ADMIN"] for k in ("bounding", "effective", "permitted")
    }
    for path, major, minor in plant:
        os.mknod(b.rootfs / path.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return b.write()


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_slice_of_index_1_keeps_minor_0_not_nvidia1(bundle_dir: Path, node, cgroup2: bool) -> None:
    spec: HostSpec = node["spec"]
    card = spec.gpus[1]  # index 1 is minor 0; /dev/nvidia1 is index 3
    assert (card.index, card.minor) == (1, 0), "the 8x-shuffled fixture changed"
    b = _privileged(
        bundle_dir,
        node,
        [f"NVIDIA_VISIBLE_DEVICES={card.uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m"],
        ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/tmp/n1", "/tmp/n0"],
        plant=[("/tmp/n1", spec.nvidia_major, 1), ("/tmp/n0", spec.nvidia_major, 0)],
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {
        "/dev/nvidia0": "ENXIO",  # its card (minor 0): allowed
        "/dev/nvidia1": "ENOENT",  # index 1's name but another card: removed...
        "/tmp/n1": "EPERM",  # ...and denied
        "/tmp/n0": "ENXIO",
        "/dev/nvidiactl": "ENXIO",
    }
    record = json.loads((node["tmp"] / "hook.log").read_text().splitlines()[-1])
    assert record["verdict"] == "apply"


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_mig_on_index_2_keeps_minor_6_and_its_caps(bundle_dir: Path, node, cgroup2: bool) -> None:
    spec: HostSpec = node["spec"]
    mig, sibling = spec.migs
    gi, ci = cap_minor(mig.parent_minor, mig.gi), cap_minor(mig.parent_minor, mig.gi, mig.ci)
    sib = cap_minor(sibling.parent_minor, sibling.gi)
    b = _privileged(
        bundle_dir,
        node,
        ["NVIDIA_VISIBLE_DEVICES=2:0", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"],
        [f"/dev/nvidia{mig.parent_minor}", f"/dev/nvidia-caps/nvidia-cap{gi}",
         f"/dev/nvidia-caps/nvidia-cap{ci}", "/dev/nvidia2", f"/dev/nvidia-caps/nvidia-cap{sib}", "/tmp/sib"],
        plant=[("/tmp/sib", spec.caps_major, sib)],
    )  # fmt: skip
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {
        f"/dev/nvidia{mig.parent_minor}": "ENXIO",
        f"/dev/nvidia-caps/nvidia-cap{gi}": "ENXIO",
        f"/dev/nvidia-caps/nvidia-cap{ci}": "ENXIO",
        "/dev/nvidia2": "ENOENT",  # index 2's name, minor 2's card (index 5)
        f"/dev/nvidia-caps/nvidia-cap{sib}": "ENOENT",
        "/tmp/sib": "EPERM",
    }


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
def test_a_sibling_instances_caps_with_no_host_node_stay_denied(
    bundle_dir: Path, node, cgroup2: bool
) -> None:
    """Issue 36 item 5: the sibling MIG instance's GI/CI caps exist (the driver's capability files)
    but the host never made their /dev/nvidia-caps nodes; the MIG pod keeps the caps major for its
    own instance, and a node of the sibling's made in its rootfs opened (ENXIO) before the fix."""
    spec: HostSpec = node["spec"]
    mig, sibling = spec.migs
    sib = [
        cap_minor(sibling.parent_minor, sibling.gi),
        cap_minor(sibling.parent_minor, sibling.gi, sibling.ci),
    ]
    for minor in sib:
        (node["root"] / f"dev/nvidia-caps/nvidia-cap{minor}").unlink()
    gi = cap_minor(mig.parent_minor, mig.gi)
    b = _privileged(
        bundle_dir,
        node,
        ["NVIDIA_VISIBLE_DEVICES=2:0", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"],
        ["/tmp/gi", "/tmp/sib-gi", "/tmp/sib-ci"],
        plant=[
            ("/tmp/gi", spec.caps_major, gi),
            *((f"/tmp/sib-{n}", spec.caps_major, m) for n, m in zip(("gi", "ci"), sib, strict=True)),
        ],
    )
    b.config["linux"]["devices"] = [
        d for d in b.config["linux"]["devices"] if d["minor"] not in sib or d["major"] != spec.caps_major
    ]
    b.write()
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert parse_probe(res.stdout) == {"/tmp/gi": "ENXIO", "/tmp/sib-gi": "EPERM", "/tmp/sib-ci": "EPERM"}
