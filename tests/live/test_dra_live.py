"""Issue 20 with real runc containers, cgroup v1 and v2: a privileged pod whose GPU came from a DRA
claim (and one whose device-plugin GPU reached it only through the CRI's CDI field) opens that
GPU and no other card.

The bundle is what containerd and CRI-O hand runc for such a pod (tests/dra_shapes.py): every
host node and one allow-all rule (privileged), then the claim's CDI devices injected (moved to
the end of ``linux.devices``, an allow rule each after the allow-all); the pod identity in the
engine's annotations; no ``cdi.k8s.io/*`` annotation. The node is the 4x-k8s host tree (real
``mknod`` nodes), NVIDIA's DRA driver's claim spec (nodes by path only) and the kubelet's DRA
state. Each container probes every GPU node and a planted copy of each (ENXIO = opens, ENOENT =
not in its /dev, EPERM = its device cgroup denies it).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import alloc_resp, checkpoint, checkpoint_entry
from tests.dra_shapes import (
    claim,
    device,
    dra_state,
    gpu_id,
    host_devices,
    inject,
    injected_nodes,
    mig_id,
    write_claim_spec,
)
from tests.hosttree import CAPS_MAJOR, cap_minor, make_host_tree
from tests.k8s_shapes import CONTAINER, GPUS, POD_UID, annotations, cgroups_path, write_cdi
from tests.live.livekit import build_bundle, hook, parse_probe, probe_args, run_container
from tests.live.test_hook_scenarios import CAPS, plant

CLAIM = "3f6b2a1c-8d4e-4f5a-9b6c-7d8e9f0a1b2c"
V1V2 = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])
ENGINES = pytest.mark.parametrize("engine", ["containerd", "crio"])


class Node:
    """A DRA node: driver root, CDI dir, kubelet root (checkpoint, DRA state), settings."""

    def __init__(self, tmp: Path, topology: str) -> None:
        self.tmp = tmp
        self.root = tmp / "driver-root"
        self.spec = make_host_tree(self.root, topology, mknod=True)
        self.minors = sorted(g.minor for g in self.spec.gpus)
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        kubelet = tmp / "kubelet"
        (kubelet / "device-plugins").mkdir(parents=True)
        self.ckpt = kubelet / "device-plugins" / "kubelet_internal_checkpoint"
        self.ckpt.write_bytes(checkpoint([]))
        self.dra = kubelet / "dra_manager_state"
        self.settings = tmp / "settings.yaml"
        doc = {
            "log_file": str(tmp / "hook.log"),
            "cache_dir": str(tmp / "cache"),
            "kubelet_checkpoint": str(self.ckpt),
        }
        self.settings.write_text(json.dumps(doc))

    def pod(
        self, bundle_dir: Path, engine: str, injected: list[dict[str, Any]], caps: tuple[int, ...] = ()
    ) -> Any:
        """A privileged pod container with ``injected`` nodes, probing every GPU (and ``caps``)."""
        args = [sys.executable, "-I", "-m", "hook", "prestart", "--driver-root", str(self.root)]
        args += ["--config", str(self.settings), "--cdi-spec-dir", str(self.cdi)]
        planted = [f"/tmp/g{m}" for m in self.minors]
        probes = [*(f"/dev/nvidia{m}" for m in self.minors), "/dev/nvidiactl", *planted]
        probes += [f"/dev/nvidia-caps/nvidia-cap{c}" for c in caps]
        b = build_bundle(
            bundle_dir,
            probe_args(probes),
            hooks={"prestart": [hook(sys.executable, args)]},
            devices=host_devices(self.minors, sorted({1, 2, *caps})),
            cgroup_devices=[{"allow": True, "access": "rwm"}],
            env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"],
            annotations=annotations(engine, cid=(cid := uuid.uuid4().hex * 2)),
        )
        # the engine's own cgroupsPath (what hook.sources.kubelet.podid tells the engine by), in the
        # scratch tree
        b.config["linux"]["cgroupsPath"] = cgroups_path(engine, cid, parent="/odh-live")
        inject(b.config["linux"], injected)
        all_caps = [*CAPS, "CAP_SYS_ADMIN"]
        b.config["process"]["capabilities"] = {k: all_caps for k in ("bounding", "effective", "permitted")}
        plant(b.rootfs, [(p, 195, m) for p, m in zip(planted, self.minors, strict=True)])
        return b.write()

    def opens(self, seen: dict[str, str]) -> set[int]:
        return {
            m for m in self.minors if seen[f"/dev/nvidia{m}"] == "ENXIO" and seen[f"/tmp/g{m}"] == "ENXIO"
        }

    def only(self, seen: dict[str, str], minor: int) -> None:
        """Its GPU opens; every other card is gone from /dev and denied when re-created."""
        assert self.opens(seen) == {minor}, seen
        for m in self.minors:
            if m != minor:
                assert (seen[f"/dev/nvidia{m}"], seen[f"/tmp/g{m}"]) == ("ENOENT", "EPERM"), (m, seen)
        assert seen["/dev/nvidiactl"] == "ENXIO"

    def last_log(self) -> dict[str, Any]:
        return json.loads((self.tmp / "hook.log").read_text().splitlines()[-1])


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "4x-k8s")


def gpu_claim(minor: int) -> dict[str, Any]:
    return claim(CLAIM, "gpu", [POD_UID], [device([gpu_id(CLAIM, minor)], f"gpu-{minor}")])


@ENGINES
@V1V2
def test_privileged_dra_pod_opens_its_claims_gpu_only(
    bundle_dir: Path, node: Node, engine: str, cgroup2: bool
) -> None:
    write_claim_spec(node.cdi, CLAIM, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(2)]))
    res = run_container(node.pod(bundle_dir, engine, injected_nodes(gpus=[2])), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    node.only(parse_probe(res.stdout), 2)
    record = node.last_log()
    assert record["verdict"] == "apply" and f"dra-claim:{CLAIM}" in record["reason"]
    assert record["kubernetes"]["dra"]["decided"] == [f"ml/gpu ({CLAIM})"]


@V1V2
def test_without_the_dra_state_the_same_pod_sees_every_card(
    bundle_dir: Path, node: Node, cgroup2: bool
) -> None:
    """The issue's measurement: no DRA evidence, so "all devices on purpose, left alone"."""
    write_claim_spec(node.cdi, CLAIM, gpus=[2])
    res = run_container(node.pod(bundle_dir, "containerd", injected_nodes(gpus=[2])), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert node.opens(parse_probe(res.stdout)) == set(node.minors)
    assert node.last_log()["kubernetes"]["dra"]["state"] == "absent"


@V1V2
def test_privileged_mig_claim_keeps_its_own_caps_only(
    bundle_dir: Path, tmp_path: Path, cgroup2: bool
) -> None:
    mig = Node(tmp_path, "8x-mig")
    write_claim_spec(mig.cdi, CLAIM, migs=[(0, 1, 0)])
    entry = claim(CLAIM, "mig", [POD_UID], [device([mig_id(CLAIM, 0, 1)], "gpu-0-mig-9-4-4")])
    mig.dra.write_bytes(dra_state([entry]))
    own, sibling = (cap_minor(0, 1), cap_minor(0, 1, 0)), (cap_minor(0, 2), cap_minor(0, 2, 0))
    b = mig.pod(bundle_dir, "containerd", injected_nodes(migs=[(0, 1, 0)]), caps=(*own, *sibling))
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    mig.only(seen, 0)
    assert [seen[f"/dev/nvidia-caps/nvidia-cap{c}"] for c in own] == ["ENXIO", "ENXIO"]
    assert [seen[f"/dev/nvidia-caps/nvidia-cap{c}"] for c in sibling] == ["ENOENT", "ENOENT"]
    assert CAPS_MAJOR in {r["major"] for r in mig.last_log()["cgroup"] if not r["allow"]}


@V1V2
def test_an_unresolvable_claim_stops_the_privileged_container(
    bundle_dir: Path, node: Node, cgroup2: bool
) -> None:
    node.dra.write_bytes(dra_state([gpu_claim(2)]))  # the driver's claim spec is gone
    res = run_container(node.pod(bundle_dir, "containerd", injected_nodes(gpus=[2])), cgroup2=cgroup2)
    assert res.rc != 0 and "PROBE" not in res.stdout
    assert f"DRA claim ml/gpu ({CLAIM}): {gpu_id(CLAIM, 2)}: no CDI spec defines this device" in res.stderr


@ENGINES
@V1V2
def test_device_plugin_cdi_without_annotations_is_narrowed_live(
    bundle_dir: Path, node: Node, engine: str, cgroup2: bool
) -> None:
    """Kubelet 1.32+: the plugin's ``cdi_devices`` reach the engine only through the CRI field;
    the checkpoint's AllocResp names them, config.json has the injected nodes and no annotation."""
    write_cdi(node.cdi)
    uuid = GPUS[2].uuid  # NVML index 2 is /dev/nvidia3 on this node
    resp = alloc_resp(cdi=[f"nvidia.com/gpu={uuid}"])
    entry = checkpoint_entry("nvidia.com/gpu", [uuid], resp, pod_uid=POD_UID, container=CONTAINER)
    node.ckpt.write_bytes(checkpoint([entry]))
    injected = [n for n in injected_nodes(gpus=[3]) if n["path"] != "/dev/nvidia-uvm-tools"]
    b = node.pod(bundle_dir, engine, injected)
    assert not [k for k in b.config["annotations"] if k.startswith("cdi.k8s.io/")]
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    node.only(parse_probe(res.stdout), 3)
    assert node.last_log()["evidence"] == ["kubelet-checkpoint"]
