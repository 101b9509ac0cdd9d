"""Requests resolved and decided on two node topologies: seed 000 and one whose GPUs are shuffled.

Rule: every expectation is computed from the ``HostSpec`` (``tests/hosttree.py``), never written
as a number, so the same test pins the behaviour on ``8x-mig`` (index == minor, majors 195/237,
MIG on card 0) and on ``8x-shuffled`` (index != minor for every card, majors 507/511/509, MIG on
index 2 = minor 6). A hook that grants ``/dev/nvidia<index>``, assumes 195 or 237, or looks for
MIG on ``gpu0`` passes the seed-000 cases and fails the shuffled ones.

The driver root is a real host tree (character nodes made with mknod in a temp dir, so the
privileged host scan sees them), the inventory is the tree's own (fake NVML for MIG UUIDs), and
the CDI spec is NVIDIA-style, generated from the same spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.sources.nvidia.inventory import dumps, load
from tests.bundles import (
    ALL_CAPS,
    POD_ANNOTATIONS,
    POD_CAPS,
    alloc_resp,
    allow_keys,
    checkpoint,
    checkpoint_entry,
    config,
    denied_among,
    deny_keys,
    settings_file,
    simulate,
    write_bundle,
)
from tests.hosttree import HostSpec, cap_minor, make_host_tree
from tests.nvidia.fake_pynvml import FakeNvml

TOPOLOGIES = ["8x-mig", "8x-shuffled"]
Key = tuple[str, int, int]


class Node:
    """One topology on disk plus the facts the tests compare with."""

    def __init__(self, base: Path, topology: str) -> None:
        self.base = base
        self.root = base / "driver-root"
        self.spec: HostSpec = make_host_tree(self.root, topology, mknod=True)
        inv = load(self.root, None, None, True, nvml_module=FakeNvml(self.spec))
        self.inventory = base / "inventory.json"
        self.inventory.write_text(dumps(inv))
        self.cdi = base / "cdi"
        self.cdi.mkdir()
        (self.cdi / "nvidia.json").write_text(json.dumps(self.cdi_spec()))
        self.no_cdi = base / "no-cdi"
        self.no_cdi.mkdir()

    # --- facts -------------------------------------------------------------------------------
    def minor(self, index: int) -> int:
        return self.spec.gpus[index].minor

    def gpu(self, index: int) -> Key:
        return ("c", self.spec.nvidia_major, self.minor(index))

    @property
    def mig_parent(self) -> int:
        """The index of the card in MIG mode (0 on seed 000, 2 on the shuffled node)."""
        return next(g.index for g in self.spec.gpus if g.mig_enabled)

    def mig_caps(self, n: int) -> tuple[Key, Key]:
        mig = self.spec.migs[n]
        major = self.spec.caps_major
        return ("c", major, cap_minor(mig.parent_minor, mig.gi)), (
            "c",
            major,
            cap_minor(mig.parent_minor, mig.gi, mig.ci),
        )

    def cap(self, minor: int) -> Key:
        return ("c", self.spec.caps_major, minor)

    def accelerators(self) -> set[Key]:
        """Every accelerator node of the host tree: the cards and every existing capability."""
        keys = {self.gpu(g.index) for g in self.spec.gpus} | {self.cap(1), self.cap(2)}
        for n in range(len(self.spec.migs)):
            keys |= set(self.mig_caps(n))
        return keys

    def dev(self, key: Key, path: str, mode: int = 0o666) -> dict[str, object]:
        return {
            "path": path,
            "type": "c",
            "major": key[1],
            "minor": key[2],
            "fileMode": mode,
            "uid": 0,
            "gid": 0,
        }

    def gpu_dev(self, index: int) -> dict[str, object]:
        return self.dev(self.gpu(index), f"/dev/nvidia{self.minor(index)}")

    def host_devices(self) -> list[dict[str, object]]:
        """What a privileged container's linux.devices holds: every node of the host's /dev."""
        out = [self.gpu_dev(g.index) for g in self.spec.gpus]
        out += [self.dev(("c", self.spec.nvidia_major, 255), "/dev/nvidiactl")]
        out += [self.dev(("c", self.spec.uvm_major, 0), "/dev/nvidia-uvm")]
        out += [self.dev(("c", self.spec.uvm_major, 1), "/dev/nvidia-uvm-tools")]
        out += [
            self.dev(k, f"/dev/nvidia-caps/nvidia-cap{k[2]}", 0o444)
            for k in sorted(self.accelerators())
            if k[1] == self.spec.caps_major
        ]
        return out

    def cdi_spec(self) -> dict[str, object]:
        def edits(keys: list[tuple[str, Key]]) -> dict[str, object]:
            return {"deviceNodes": [{"path": p, "type": "c", "major": k[1], "minor": k[2]} for p, k in keys]}

        devices = []
        for g in self.spec.gpus:
            nodes = [(f"/dev/nvidia{g.minor}", self.gpu(g.index))]
            devices += [
                {"name": str(g.index), "containerEdits": edits(nodes)},
                {"name": g.uuid, "containerEdits": edits(nodes)},
            ]
        parent = self.mig_parent
        for n, mig in enumerate(self.spec.migs):
            gi, ci = self.mig_caps(n)
            nodes = [
                (f"/dev/nvidia{mig.parent_minor}", self.gpu(parent)),
                (f"/dev/nvidia-caps/nvidia-cap{gi[2]}", gi),
                (f"/dev/nvidia-caps/nvidia-cap{ci[2]}", ci),
            ]
            devices += [
                {"name": f"{parent}:{n}", "containerEdits": edits(nodes)},
                {"name": mig.uuid, "containerEdits": edits(nodes)},
            ]
        ctl = [("/dev/nvidiactl", ("c", self.spec.nvidia_major, 255))]
        return {
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": devices,
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], **edits(ctl)},
        }

    # --- running ------------------------------------------------------------------------------
    def decide(
        self,
        tmp: Path,
        cfg: dict[str, Any],
        capsys: pytest.CaptureFixture[str],
        *,
        cdi: bool = False,
        ckpt: bytes | None = None,
        **settings: Any,
    ) -> tuple[int, dict[str, Any]]:
        bundle = write_bundle(tmp / "bundle", cfg)
        (tmp / "ckpt").write_bytes(ckpt or b"")
        settings.setdefault("kubelet_checkpoint", str(tmp / "ckpt"))
        args = [
            "--driver-root", str(self.root), "--inventory", str(self.inventory),
            "--cdi-spec-dir", str(self.cdi if cdi else self.no_cdi),
            "--config", str(settings_file(tmp, **settings)),
        ]  # fmt: skip
        rc, rep, err = simulate(bundle, *args, capsys=capsys)
        assert isinstance(rep, dict), err
        return rc, rep


@pytest.fixture(scope="module", params=TOPOLOGIES)
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp(request.param), request.param)


def test_the_shuffled_topology_really_is_shuffled(tmp_path: Path) -> None:
    """The fixture's own precondition: no card's index is its minor, no major is the usual one."""
    node = Node(tmp_path, "8x-shuffled")
    assert all(g.index != g.minor for g in node.spec.gpus)
    assert (node.spec.nvidia_major, node.spec.caps_major, node.spec.uvm_major) == (507, 511, 509)
    assert node.mig_parent != 0 and node.minor(node.mig_parent) != node.mig_parent
    inv = json.loads(node.inventory.read_text())
    assert [(g["index"], g["minor"]) for g in inv["gpus"]] == [(g.index, g.minor) for g in node.spec.gpus]


# --- NVIDIA IDs: index, UUID, G:M, MIG UUID --------------------------------------------------------


@pytest.mark.parametrize("form", ["index", "uuid"])
@pytest.mark.parametrize("index", [1, 4, 7])
def test_unprivileged_gpu_request_gets_the_card_with_that_index(
    host: Node, form: str, index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ident = str(index) if form == "index" else host.spec.gpus[index].uuid
    rc, rep = host.decide(tmp_path, config([f"NVIDIA_VISIBLE_DEVICES={ident}"]), capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    allowed = allow_keys(rep)
    assert host.gpu(index) in allowed
    assert not allowed & (host.accelerators() - {host.gpu(index)})
    created = {n["path"]: (n["major"], n["minor"]) for n in rep["nodes"]["create"]}
    minor = host.minor(index)
    assert created[f"/dev/nvidia{minor}"] == (host.spec.nvidia_major, minor)
    assert created["/dev/nvidiactl"] == (host.spec.nvidia_major, 255)
    assert created["/dev/nvidia-uvm"] == (host.spec.uvm_major, 0)
    assert [p for p in created if p.startswith("/dev/nvidia") and p[11:].isdigit()] == [f"/dev/nvidia{minor}"]
    # rules and nodes come sorted by major, then minor (the report and the eBPF program are stable)
    numbers = [(r["major"], r["minor"]) for r in rep["cgroup"]]
    assert numbers == sorted(numbers) and len(set(r["major"] for r in rep["cgroup"])) > 1


@pytest.mark.parametrize("form", ["gpu-mig-index", "mig-uuid", "mig-gpu-uuid-gi-ci"])
def test_mig_request_gets_its_parent_and_its_own_caps(
    host: Node, form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mig = host.spec.migs[1]
    ident = {
        "gpu-mig-index": f"{host.mig_parent}:1",
        "mig-uuid": mig.uuid,
        "mig-gpu-uuid-gi-ci": f"MIG-{host.spec.gpus[host.mig_parent].uuid}/{mig.gi}/{mig.ci}",
    }[form]
    rc, rep = host.decide(tmp_path, config([f"NVIDIA_VISIBLE_DEVICES={ident}"]), capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    gi, ci = host.mig_caps(1)
    assert allow_keys(rep) & host.accelerators() == {host.gpu(host.mig_parent), gi, ci}
    created = {n["path"]: n for n in rep["nodes"]["create"]}
    parent = host.minor(host.mig_parent)
    assert created[f"/dev/nvidia{parent}"]["major"] == host.spec.nvidia_major
    for key in (gi, ci):
        cap = created[f"/dev/nvidia-caps/nvidia-cap{key[2]}"]
        assert (cap["major"], cap["minor"], cap["fileMode"]) == (key[1], key[2], 0o444)


def test_mig_request_through_cdi_keeps_the_hosts_cap_mode(
    host: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CDI spec names no mode for cap nodes: the host node's 0444 is kept, never widened to 0666."""
    cfg = config(annotations={"cdi.k8s.io/x": f"nvidia.com/gpu={host.spec.migs[0].uuid}"})
    rc, rep = host.decide(tmp_path, cfg, capsys, cdi=True)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    gi, ci = host.mig_caps(0)
    created = {(n["major"], n["minor"]): n["fileMode"] for n in rep["nodes"]["create"]}
    assert created[gi[1:]] == 0o444 and created[ci[1:]] == 0o444
    assert created[host.gpu(host.mig_parent)[1:]] == 0o666


# --- privileged narrowing ------------------------------------------------------------------------------


def closed(rep: dict[str, Any], host: Node) -> set[tuple[str, int, int]]:
    """The host's accelerator nodes the plan denies (exactly, or by denying their major whole);
    no exact deny of anything else."""
    assert {k for k in deny_keys(rep) if k[2] is not None} <= host.accelerators()
    return denied_among(rep, host.accelerators())


@pytest.mark.parametrize("cdi", [False, True], ids=["inventory", "cdi"])
def test_privileged_slice_narrowed_to_the_card_with_that_uuid(
    host: Node, cdi: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uuid = host.spec.gpus[1].uuid
    cfg = config(
        [f"NVIDIA_VISIBLE_DEVICES={uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m"],
        privileged=True,
        devices=host.host_devices(),
    )
    rc, rep = host.decide(tmp_path, cfg, capsys, cdi=cdi)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert closed(rep, host) == host.accelerators() - {host.gpu(1)}
    kept = f"/dev/nvidia{host.minor(1)}"
    assert kept not in rep["nodes"]["remove"]
    assert {f"/dev/nvidia{g.minor}" for g in host.spec.gpus} - set(rep["nodes"]["remove"]) == {kept}


def test_privileged_narrowing_denies_host_nodes_missing_from_linux_devices(
    host: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine may list only some nodes in linux.devices; the allow-all rule still reaches every
    node of the host, and a privileged container can mknod any of them: the host's /dev is scanned."""
    cfg = config(
        [f"NVIDIA_VISIBLE_DEVICES={host.spec.gpus[1].uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m"],
        privileged=True,
        devices=[host.gpu_dev(1)],
    )
    rc, rep = host.decide(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert closed(rep, host) == host.accelerators() - {host.gpu(1)}
    assert rep["nodes"]["remove"] == []  # nothing of theirs is in the container to remove


def test_privileged_mig_pod_keeps_parent_and_own_caps_only(
    host: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mig = host.spec.migs[0]
    cfg = config(
        privileged=True,
        devices=host.host_devices(),
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={mig.uuid}"},
    )
    rc, rep = host.decide(tmp_path, cfg, capsys, cdi=True)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert closed(rep, host) == host.accelerators() - {host.gpu(host.mig_parent), *host.mig_caps(0)}


@pytest.mark.parametrize("inventory", [True, False], ids=["inventory", "driver-caps"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_privileged_mig_pod_loses_another_instances_caps_the_host_has_no_node_of(
    topology: str, inventory: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other instance's GI/CI caps exist (the driver's capability files) but their
    /dev/nvidia-caps nodes were never made: a privileged MIG pod keeps the caps major for its own
    instance, and could make the other's node and open it (issue 36 item 5)."""
    host = Node(tmp_path / "node", topology)
    other = host.mig_caps(1)
    for _t, _major, minor in other:
        (host.root / f"dev/nvidia-caps/nvidia-cap{minor}").unlink()
    if not inventory:
        host.inventory.unlink()  # the caps come from the driver root itself
    mig = host.spec.migs[0]
    gone = {f"/dev/nvidia-caps/nvidia-cap{k[2]}" for k in other}
    cfg = config(
        privileged=True,
        devices=[d for d in host.host_devices() if d["path"] not in gone],  # the engine put in what /dev had
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={mig.uuid}"},
    )
    if not inventory:
        bundle = write_bundle(tmp_path / "bundle", cfg)
        (tmp_path / "ckpt").write_bytes(b"")
        args = ["--driver-root", str(host.root), "--cdi-spec-dir", str(host.cdi)]
        args += ["--config", str(settings_file(tmp_path, kubelet_checkpoint=str(tmp_path / "ckpt")))]
        rc, rep, _err = simulate(bundle, *args, capsys=capsys)
    else:
        rc, rep = host.decide(tmp_path, cfg, capsys, cdi=True)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert denied_among(rep, set(other)) == set(other), rep["cgroup"]
    assert not denied_among(rep, set(host.mig_caps(0)))


def test_privileged_checkpoint_allocation_by_uuid(
    host: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uuid = host.spec.gpus[5].uuid
    ck = checkpoint(
        [checkpoint_entry("nvidia.com/gpu", [uuid], alloc_resp({"NVIDIA_VISIBLE_DEVICES": uuid}))]
    )
    cfg = config(privileged=True, devices=host.host_devices(), annotations=POD_ANNOTATIONS)
    rc, rep = host.decide(tmp_path, cfg, capsys, ckpt=ck)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert closed(rep, host) == host.accelerators() - {host.gpu(5)}


# --- MIG management caps ---------------------------------------------------------------------------


def test_monitor_cap_for_a_sys_admin_plugin_pod(host: Node, tmp_path: Path, capsys) -> None:
    """Seed 001's shape: every card and instance cap by specific rules, config/monitor not given."""
    mgmt = {host.cap(1)[1:], host.cap(2)[1:]}
    devices = [d for d in host.host_devices() if (d["major"], d["minor"]) not in mgmt]
    specific = [
        {"allow": True, "type": "c", "major": d["major"], "minor": d["minor"], "access": "rwm"}
        for d in devices
    ]
    cfg = config(
        ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all"],
        caps=sorted([*POD_CAPS, "CAP_SYS_ADMIN"]),
        devices=devices,
        rules=[{"allow": False, "access": "rwm"}, *specific],
    )
    rc, rep = host.decide(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    monitor = host.cap(2)
    assert rep["cgroup"] == [
        {"allow": True, "type": "c", "major": monitor[1], "minor": monitor[2], "access": "r"}
    ]


def test_privileged_narrowed_pod_keeps_its_monitor_cap(host: Node, tmp_path: Path, capsys) -> None:
    """Narrowing denies every accelerator outside the allocation, except what management asked for."""
    cfg = config(
        [f"NVIDIA_VISIBLE_DEVICES={host.spec.gpus[3].uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=1g",
         "NVIDIA_MIG_MONITOR_DEVICES=all"],
        privileged=True,
        caps=ALL_CAPS,
        devices=host.host_devices(),
    )  # fmt: skip
    rc, rep = host.decide(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    assert closed(rep, host) == host.accelerators() - {host.gpu(3), host.cap(2)}
    assert f"/dev/nvidia-caps/nvidia-cap{host.cap(2)[2]}" not in rep["nodes"]["remove"]


def test_unprivileged_widened_pod_is_denied_rw_on_the_extra_cards(
    host: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unprivileged plugin pod that also got other cards in linux.devices is narrowed with
    ``rw`` denies: runc's default ``c *:* m`` keeps ``m`` on every char device in a v1 cgroup."""
    mine, extra = host.spec.gpus[1], host.spec.gpus[4]
    # card 4 is in linux.devices but has no rule of its own: no DeviceSpec, an over-grant
    rules = [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": host.gpu(4)[1], "access": "rw"},
    ]
    cfg = config(
        [f"NVIDIA_VISIBLE_DEVICES={mine.uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"],
        devices=[host.gpu_dev(1), host.gpu_dev(4)],
        rules=rules,
    )
    rc, rep = host.decide(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (0, "apply"), rep["reason"]
    denies = [r for r in rep["cgroup"] if not r["allow"]]
    assert {("c", r["major"], r["minor"]) for r in denies} == host.accelerators() - {host.gpu(1)}
    assert {r["access"] for r in denies} == {"rw"}
    assert rep["nodes"]["remove"] == [f"/dev/nvidia{extra.minor}"]
