"""Issue 20: the kubelet's DRA state (parser on the public fixtures) and what it decides for a pod
whose GPUs came from DRA claims (simulation and ``hook precreate`` on real host nodes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hook.core.errors import InputError
from hook.sources.kubelet.dra import default_path, parse_state
from tests.bundles import (
    _hook_exe,
    alloc_resp,
    checkpoint,
    checkpoint_entry,
    denied_among,
    settings_file,
    simulate,
    write_bundle,
)
from tests.dra_shapes import (
    FIXTURES,
    claim,
    device,
    dra_state,
    gpu_id,
    inject,
    injected_nodes,
    legacy_state,
    mig_id,
    privileged_linux,
    write_claim_spec,
)
from tests.hosttree import CAPS_MAJOR, NVIDIA_MAJOR, cap_minor, make_host_tree
from tests.k8s_shapes import CONTAINER, POD_UID, annotations, cgroups_path

CLAIM_A = "3f6b2a1c-8d4e-4f5a-9b6c-7d8e9f0a1b2c"
CLAIM_B = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"
OTHER_POD = "ffffffff-1111-4222-8333-444444444444"
K8S_MINORS = (0, 1, 2, 3)
MIG_MINORS = tuple(range(8))
MIG_CAPS = (1, 2, 12, 13, 21, 22)  # config, monitor, GI1/CI0 of GPU 0, GI2/CI0 of GPU 0
C195 = {("c", NVIDIA_MAJOR, m) for m in range(8)}


# --- the parser, on the kubelet's own test data (tests/fixtures/dra/README.md) -------------------


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name", ["entries-single.json", "claiminfostatelist-single.json"])
def test_the_kubelets_checkpoint_parses_with_its_checksum_verified(name: str) -> None:
    state = parse_state(fixture(name), name)
    assert state.verified
    (c,) = state.claims
    assert (c.uid, c.name, c.namespace) == ("067798be-454e-4be4-9047-1aa06aea63f7", "example", "default")
    assert c.pod_uids == ("139cdb46-f989-4f17-9561-ca10cfb509a6",)
    (d,) = c.devices
    assert (d.driver, d.pool, d.device, d.requests) == (
        "test-driver.cdi.k8s.io",
        "worker-1",
        "dev-1",
        ("test request",),
    )
    assert d.cdi_ids == ("example.com/example=cdi-example",)


@pytest.mark.parametrize("name", ["entries-two-claims.json", "claiminfostatelist-two-claims.json"])
def test_null_lists_are_empty_and_every_claim_is_read(name: str) -> None:
    state = parse_state(fixture(name), name)
    assert [c.name for c in state.claims] == ["example-1", "example-2"]
    assert state.claims[1].devices[0].cdi_ids == () and state.claims[1].devices[0].requests == ()


def test_the_kubelets_incorrect_checksum_example_is_refused() -> None:
    with pytest.raises(InputError) as exc:
        parse_state(fixture("entries-incorrect-checksum.json"), "/var/lib/kubelet/dra_manager_state")
    assert str(exc.value).startswith(
        "/var/lib/kubelet/dra_manager_state: Checksum: checksum mismatch (2930258365"
    )


@pytest.mark.parametrize("name", ["legacy-1.30-single.json", "legacy-1.30-multiple-drivers.json"])
def test_the_1_30_format_is_read_unverified(name: str) -> None:
    state = parse_state(fixture(name), name)
    assert not state.verified
    ids = {i for c in state.claims for d in c.devices for i in d.cdi_ids}
    assert ids and all("=" in i for i in ids)
    assert state.claims[0].pod_uids == ("139cdb46-f989-4f17-9561-ca10cfb509a6",)


def test_unknown_fields_are_accepted() -> None:
    entry = claim(CLAIM_A, "gpu", [POD_UID], [{**device([gpu_id(CLAIM_A, 2)]), "ShareID": "x", "New": 1}])
    entry["Tombstone"] = True
    state = parse_state(dra_state([entry]), "s")
    assert state.claims[0].devices[0].cdi_ids == (gpu_id(CLAIM_A, 2),)


def _driver_state(state: object) -> bytes:
    return dra_state([claim(CLAIM_A, "x", [POD_UID], []) | {"DriverState": {"gpu.nvidia.com": state}}])


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (fixture("entries-single.json")[:-20], ""),  # truncated
        (b"[]", ""),
        (b'{"Data": 5, "Checksum": 1}', "Data"),
        (dra_state([{"ClaimUID": 5}]), "Data.Entries[0].ClaimUID"),
        (dra_state([claim(CLAIM_A, "x", [POD_UID], [device(["a/b=c"])]) | {"PodUIDs": ["p"]}]), "PodUIDs"),
        (
            dra_state([claim(CLAIM_A, "x", [POD_UID], [device(["a/b=c"])]) | {"DriverState": []}]),
            "DriverState",
        ),
        # issue 31 (s142737-025): a driver's state, its device list and each device are checked too
        (
            _driver_state(["a/b=c"]),
            "DriverState[gpu.nvidia.com]",
        ),
        (
            _driver_state({"Devices": 5}),
            "DriverState[gpu.nvidia.com].Devices",
        ),
        (
            _driver_state({"Devices": [5]}),
            "DriverState[gpu.nvidia.com].Devices[0]",
        ),
        (b'{"version": "v2", "entries": []}', "version"),
    ],
)
def test_malformed_states_name_the_field(data: bytes, field: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_state(data, "f")
    assert field in exc.value.field


def test_both_list_keys_at_once_are_refused() -> None:
    data = json.dumps({"kind": "DRACheckpoint", "Entries": [], "ClaimInfoStateList": []})
    import zlib

    raw = json.dumps({"Data": data, "Checksum": zlib.crc32(data.encode())}).encode()
    with pytest.raises(InputError, match="cannot tell which"):
        parse_state(raw, "f")


def test_default_path_is_in_the_checkpoints_kubelet_root() -> None:
    assert default_path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint") == (
        "/var/lib/kubelet/dra_manager_state"
    )
    assert default_path("/var/lib/rancher/k3s/agent/kubelet/device-plugins/kubelet_internal_checkpoint") == (
        "/var/lib/rancher/k3s/agent/kubelet/dra_manager_state"
    )


# --- decisions: a privileged pod with claims, in simulation --------------------------------------


@pytest.fixture(scope="module")
def k8s_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dra-node") / "root"
    make_host_tree(root, "4x-k8s", mknod=True)
    return root


@pytest.fixture(scope="module")
def mig_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dra-mig-node") / "root"
    make_host_tree(root, "8x-mig", mknod=True)
    return root


def pod_config(
    engine: str,
    linux: dict[str, Any],
    *,
    env: list[str] | None = None,
) -> dict[str, Any]:
    caps = ["CAP_SYS_ADMIN", "CAP_CHOWN"]
    return {
        "ociVersion": "1.1.0",
        "process": {
            "args": ["sh"],
            "cwd": "/",
            "env": env or ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"],
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": annotations(engine),
        # the engine's, as hook.sources.kubelet.podid reads it
        "linux": {"cgroupsPath": cgroups_path(engine), **linux},
    }


def privileged_pod(
    engine: str, gpus: tuple[int, ...] = K8S_MINORS, *claims: dict[str, Any]
) -> dict[str, Any]:
    """A privileged pod container whose engine injected ``claims`` (kw of ``injected_nodes``)."""
    caps = MIG_CAPS if len(gpus) == 8 else (1, 2)
    linux = privileged_linux(gpus, caps)
    for c in claims:
        inject(linux, injected_nodes(**c))
    return pod_config(engine, linux)


class Node:
    """A kubelet root (checkpoint, DRA state), a CDI dir and settings under one temp dir."""

    def __init__(self, tmp: Path, root: Path) -> None:
        self.tmp, self.root = tmp, root
        self.kubelet = tmp / "kubelet"
        (self.kubelet / "device-plugins").mkdir(parents=True)
        self.ckpt = self.kubelet / "device-plugins" / "kubelet_internal_checkpoint"
        self.ckpt.write_bytes(checkpoint([]))
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        self.settings = settings_file(tmp, kubelet_checkpoint=str(self.ckpt))

    @property
    def dra(self) -> Path:
        return self.kubelet / "dra_manager_state"

    def args(self) -> list[str]:
        return [
            "--driver-root",
            str(self.root),
            "--cdi-spec-dir",
            str(self.cdi),
            "--config",
            str(self.settings),
        ]

    def simulate(self, cfg: dict[str, Any], capsys: Any, fmt: str = "json") -> tuple[int, Any, str]:
        bundle = write_bundle(self.tmp / "bundle", cfg)
        return simulate(bundle, *self.args(), capsys=capsys, fmt=fmt)


@pytest.fixture
def node(tmp_path: Path, k8s_root: Path) -> Node:
    return Node(tmp_path, k8s_root)


@pytest.fixture
def mig_node(tmp_path: Path, mig_root: Path) -> Node:
    return Node(tmp_path, mig_root)


def gpu_claim(uid: str, minor: int, pods: tuple[str, ...] = (POD_UID,), name: str = "") -> dict[str, Any]:
    return claim(uid, name or f"gpu-{minor}", list(pods), [device([gpu_id(uid, minor)], f"gpu-{minor}")])


def denied(rep: dict[str, Any]) -> set[tuple[str, int, int]]:
    return {(r["type"], r["major"], r["minor"]) for r in rep["cgroup"] if not r["allow"]}


def gpus_denied(rep: dict[str, Any]) -> set[int]:
    return {m for t, ma, m in denied(rep) if ma == NVIDIA_MAJOR and m < 254}


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_privileged_pod_with_a_gpu_claim_is_narrowed_to_its_gpu(node: Node, capsys: Any, engine: str) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    rc, rep, err = node.simulate(privileged_pod(engine, K8S_MINORS, {"gpus": [2]}), capsys)
    assert (rc, err, rep["verdict"]) == (0, "", "apply"), (err, rep)
    assert gpus_denied(rep) == {0, 1, 3}
    caps = {("c", CAPS_MAJOR, 1), ("c", CAPS_MAJOR, 2)}
    assert denied_among(rep, caps) == caps  # the MIG caps' whole major: the pod was given none
    assert rep["nodes"]["remove"] == [
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia3",
    ]
    label = f"ml/gpu-2 ({CLAIM_A})"
    assert f"to its DRA claim ml/gpu-2 (dra-claim:{CLAIM_A}): {gpu_id(CLAIM_A, 2)}:" in rep["reason"]
    dra = rep["kubernetes"]["dra"]
    assert (dra["state_file"], dra["state"], dra["decided"]) == (str(node.dra), "read", [label])
    assert dra["claims"] == [
        {
            "uid": CLAIM_A,
            "name": "gpu-2",
            "namespace": "ml",
            "drivers": ["gpu.nvidia.com"],
            "devices": [
                {
                    "driver": "gpu.nvidia.com",
                    "pool": "node-a",
                    "device": "gpu-2",
                    "requests": ["gpu"],
                    "cdi_ids": [gpu_id(CLAIM_A, 2)],
                }
            ],
            "cdi_ids": [gpu_id(CLAIM_A, 2)],
        }
    ]
    assert rep["evidence"] == ["dra-claim"] and rep["kubernetes"]["dra_claims"] is True


def test_the_text_report_names_the_state_and_the_claims(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    rc, text, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys, fmt="text")
    assert rc == 0
    assert (
        f"kubernetes DRA: {node.dra} read; claims ml/gpu-2 ({gpu_id(CLAIM_A, 2)}); "
        f"decided by ml/gpu-2 ({CLAIM_A})" in text
    )


def test_a_mig_claim_keeps_its_gpu_and_its_own_gi_ci_caps_only(mig_node: Node, capsys: Any) -> None:
    write_claim_spec(mig_node.cdi, CLAIM_A, migs=[(0, 1, 0)])
    mig = claim(CLAIM_A, "mig", [POD_UID], [device([mig_id(CLAIM_A, 0, 1)], "gpu-0-mig-9-4-4")])
    mig_node.dra.write_bytes(dra_state([mig]))
    cfg = privileged_pod("containerd", MIG_MINORS, {"migs": [(0, 1, 0)]})
    rc, rep, err = mig_node.simulate(cfg, capsys)
    assert (rc, err, rep["verdict"]) == (0, "", "apply"), err
    assert gpus_denied(rep) == set(range(1, 8))
    caps_denied = {m for _, ma, m in denied(rep) if ma == CAPS_MAJOR}
    assert caps_denied == {1, 2, cap_minor(0, 2), cap_minor(0, 2, 0)}  # config, monitor, the sibling's GI/CI
    kept = [
        d["path"]
        for d in json.loads((mig_node.tmp / "bundle" / "config.json").read_text())["linux"]["devices"]
    ]
    assert {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"} <= set(kept)
    assert not {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"} & set(
        rep["nodes"]["remove"]
    )


def two_claims(node: Node) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    write_claim_spec(node.cdi, CLAIM_B, gpus=[0])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2), gpu_claim(CLAIM_B, 0)]))


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_of_two_claims_the_one_injected_into_this_container_decides(
    node: Node, capsys: Any, engine: str
) -> None:
    two_claims(node)
    rc, rep, _ = node.simulate(privileged_pod(engine, K8S_MINORS, {"gpus": [0]}), capsys)
    assert rc == 0 and rep["verdict"] == "apply"
    assert gpus_denied(rep) == {1, 2, 3}  # claim B's GPU 0 only: claim A went to a sibling container
    assert rep["kubernetes"]["dra"]["decided"] == [f"ml/gpu-0 ({CLAIM_B})"]
    assert len(rep["kubernetes"]["dra"]["claims"]) == 2


def test_with_nothing_injected_the_union_of_the_pods_claims_bounds_it(node: Node, capsys: Any) -> None:
    two_claims(node)
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS), capsys)
    assert rc == 0 and rep["verdict"] == "apply"
    assert gpus_denied(rep) == {1, 3}  # never wider than the pod's claims (GPUs 0 and 2)
    assert rep["kubernetes"]["dra"]["decided"] == [f"ml/gpu-0 ({CLAIM_B})", f"ml/gpu-2 ({CLAIM_A})"]


def test_injected_nodes_beyond_the_claims_are_still_denied(node: Node, capsys: Any) -> None:
    """A rule after the allow-all that no claim names (here GPU 3) widens nothing: the claims bound it."""
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2, 3]}), capsys)
    assert rc == 0 and gpus_denied(rep) == {0, 1, 3}


def test_claims_of_other_pods_only_leave_the_container_alone(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2, pods=(OTHER_POD,))]))
    rc, rep, _ = node.simulate(privileged_pod("containerd"), capsys)
    assert (rc, rep["verdict"], rep["cgroup"]) == (0, "none", [])
    assert rep["reason"].startswith("privileged container without a plugin allocation")
    assert rep["kubernetes"]["dra"]["state"] == "read" and rep["kubernetes"]["dra"]["claims"] == []


@pytest.mark.parametrize(
    ("content", "state"),
    [
        (lambda: dra_state([gpu_claim(CLAIM_A, 2)], checksum=12345), "corrupt"),
        (lambda: dra_state([gpu_claim(CLAIM_A, 2)])[:-30], "corrupt"),
        (lambda: b" " * (64 << 20) + b"{}", "unreadable"),
    ],
    ids=["checksum-mismatch", "truncated", "oversized"],
)
def test_a_state_that_cannot_be_trusted_is_a_warning_and_decides_nothing(
    node: Node, capsys: Any, content: Any, state: str
) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(content())
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert (rc, rep["verdict"], rep["cgroup"]) == (0, "none", [])
    assert rep["kubernetes"]["dra"]["state"] == state
    (warning,) = [w for w in rep["warnings"] if "DRA" in w]
    assert warning.startswith(str(node.dra)) and warning.endswith(
        "nothing decided from the kubelet's DRA state"
    )


def test_the_1_30_format_decides_and_says_it_was_not_verified(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(legacy_state([gpu_claim(CLAIM_A, 2)]))
    rc, rep, _ = node.simulate(privileged_pod("crio", K8S_MINORS, {"gpus": [2]}), capsys)
    assert rc == 0 and gpus_denied(rep) == {0, 1, 3}
    assert rep["kubernetes"]["dra"]["state"] == "unverified"


def test_the_newest_list_key_decides_the_same(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)], key="ClaimInfoStateList"))
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert rc == 0 and gpus_denied(rep) == {0, 1, 3}


def test_an_unprivileged_dra_pod_is_unchanged(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    linux = {"devices": [], "resources": {"devices": [{"allow": False, "access": "rwm"}]}}
    inject(linux, injected_nodes(gpus=[2]))
    rc, rep, _ = node.simulate(pod_config("containerd", linux), capsys)
    assert (rc, rep["verdict"], rep["cgroup"], rep["nodes"]["remove"]) == (0, "none", [], [])
    assert rep["reason"] == "the container already has exactly what it asked for"
    assert rep["kubernetes"]["bounded"] is False and rep["kubernetes"]["dra_claims"] is True


def test_an_unprivileged_pod_with_an_untrusted_state_is_not_bounded(node: Node, capsys: Any) -> None:
    """The pod may hold claims the state cannot show: its injected nodes are not over-grants."""
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)], checksum=1))
    linux = {"devices": [], "resources": {"devices": [{"allow": False, "access": "rwm"}]}}
    inject(linux, injected_nodes(gpus=[2]))
    rc, rep, _ = node.simulate(pod_config("containerd", linux), capsys)
    assert (rc, rep["verdict"], rep["cgroup"]) == (0, "none", [])
    assert rep["kubernetes"]["bounded"] is False


def test_a_missing_claim_spec_refuses_the_privileged_container_with_one_line(node: Node, capsys: Any) -> None:
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))  # no k8s.gpu.nvidia.com-claim_<uid>.yaml
    rc, out, err = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    line = (
        f"DRA claim ml/gpu-2 ({CLAIM_A}): {gpu_id(CLAIM_A, 2)}: no CDI spec defines this device "
        "(the driver's claim spec is gone?): the privileged container cannot be narrowed to its claims"
    )
    assert rc == 1 and err == f"hook: {line}\n"
    assert out["error"]["exit_code"] == 1 and line.endswith(out["error"]["message"])  # --format json


def test_a_missing_claim_spec_does_not_touch_an_unprivileged_container(node: Node, capsys: Any) -> None:
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    linux = {"devices": [], "resources": {"devices": [{"allow": False, "access": "rwm"}]}}
    inject(linux, injected_nodes(gpus=[2]))
    rc, rep, _ = node.simulate(pod_config("containerd", linux), capsys)
    assert (rc, rep["verdict"]) == (0, "none")


def test_a_setting_names_the_state_elsewhere(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    elsewhere = node.tmp / "elsewhere"
    elsewhere.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    node.settings = settings_file(
        node.tmp, kubelet_checkpoint=str(node.ckpt), kubelet_dra_state=str(elsewhere)
    )
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert rc == 0 and gpus_denied(rep) == {0, 1, 3}
    assert rep["kubernetes"]["dra"]["state_file"] == str(elsewhere)


def test_no_checkpoint_file_still_reads_the_dra_state(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    node.ckpt.unlink()
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert rc == 0 and gpus_denied(rep) == {0, 1, 3}
    assert rep["kubernetes"]["checkpoint_state"] == "absent"


def test_device_plugin_cdi_without_annotations_is_narrowed(node: Node, capsys: Any) -> None:
    """Kubelet 1.32+: the plugin's ``cdi_devices`` reach the engine through the CRI field only; the
    checkpoint's AllocResp names them, config.json has the injected node and no annotation."""
    from tests.k8s_shapes import GPUS, write_cdi

    write_cdi(node.cdi)
    uuid = GPUS[2].uuid  # NVML index 2 is /dev/nvidia3 on this node
    resp = alloc_resp(cdi=[f"nvidia.com/gpu={uuid}"])
    node.ckpt.write_bytes(
        checkpoint([checkpoint_entry("nvidia.com/gpu", [uuid], resp, pod_uid=POD_UID, container=CONTAINER)])
    )
    linux = privileged_linux(K8S_MINORS, (1, 2))
    inject(linux, [n for n in injected_nodes(gpus=[3]) if n["path"] != "/dev/nvidia-uvm-tools"])
    cfg = pod_config("containerd", linux)
    assert not [k for k in cfg["annotations"] if k.startswith("cdi.k8s.io/")]
    rc, rep, _ = node.simulate(cfg, capsys)
    assert (rc, rep["verdict"]) == (0, "apply")
    assert gpus_denied(rep) == {0, 1, 2}
    assert rep["evidence"] == ["kubelet-checkpoint"]


# --- hook precreate (the runtime wrapper's path) decides the same ---------------------------------

IN_NS = [
    "unshare", "-m", "--propagation", "private", "sh", "-c",
    'mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/log && exec "$@"', "sh",
]  # fmt: skip


def precreate(node: Node, cfg: dict[str, Any], timeout: int = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*IN_NS, *_hook_exe(), "precreate", *node.args()],
        input=json.dumps(cfg).encode(),
        capture_output=True,
        timeout=timeout,
        env=os.environ,
        check=False,
    )


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_precreate_leaves_the_claims_gpu_only(node: Node, capsys: Any, engine: str) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    cfg = privileged_pod(engine, K8S_MINORS, {"gpus": [2]})
    res = precreate(node, cfg)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    gpus = sorted(
        d["path"]
        for d in out["linux"]["devices"]
        if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit()
    )
    assert gpus == ["/dev/nvidia2"]
    from hook.core.oci import parse_rule
    from hook.core.rules import Access, DeviceType, evaluate

    rules = [parse_rule(r, "out", "r") for r in out["linux"]["resources"]["devices"]]
    opens = {m for m in K8S_MINORS if evaluate(rules, DeviceType.CHAR, NVIDIA_MAJOR, m, Access.R)}
    assert opens == {2}
    _, rep, _ = node.simulate(cfg, capsys)  # simulation says the same
    assert gpus_denied(rep) == {0, 1, 3}


def test_precreate_refuses_an_unresolvable_claim_with_one_line(node: Node) -> None:
    node.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    res = precreate(node, privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}))
    assert res.returncode == 1 and res.stdout == b""
    lines = res.stderr.decode().splitlines()
    assert (
        len(lines) == 1 and f"DRA claim ml/gpu-2 ({CLAIM_A})" in lines[0] and gpu_id(CLAIM_A, 2) in lines[0]
    )


def test_a_fifo_at_the_dra_state_never_hangs_precreate(node: Node) -> None:
    """Issue 21 item 8: opened like every other file (O_NONBLOCK, regular files only)."""
    os.mkfifo(node.dra)
    res = precreate(node, privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), timeout=30)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["linux"]["resources"]["devices"][0] == {"allow": True, "access": "rwm"}


def test_a_symlink_at_the_dra_state_is_not_followed(node: Node, capsys: Any) -> None:
    write_claim_spec(node.cdi, CLAIM_A, gpus=[2])
    real = node.tmp / "real-state"
    real.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    node.dra.symlink_to(real)
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert (rc, rep["verdict"], rep["kubernetes"]["dra"]["state"]) == (0, "none", "unreadable")


def test_a_privileged_pod_with_no_dra_state_is_left_alone_as_before(node: Node, capsys: Any) -> None:
    rc, rep, _ = node.simulate(privileged_pod("containerd", K8S_MINORS, {"gpus": [2]}), capsys)
    assert (rc, rep["verdict"], rep["kubernetes"]["dra"]["state"]) == (0, "none", "absent")


# --- the setting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"), [("", True), ("/var/lib/k/dra_manager_state", True), ("rel/x", False), (5, False)]
)
def test_kubelet_dra_state_setting(tmp_path: Path, value: object, ok: bool) -> None:
    from hook.cli import run as cli

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"kubelet_dra_state": value}))
    assert (cli(["settings", "check", str(path)]) == 0) is ok
    if ok:
        from hook.sources.settingsfile import load_settings

        expected = value or "/var/lib/kubelet/dra_manager_state"
        assert load_settings(path, required=True).dra_state_path == expected


def test_only_this_pods_claims_are_decoded() -> None:
    """Another pod's entry in a shape this hook does not know fails neither this pod nor the file;
    the same entry in this pod's claim is reported."""
    odd = claim(CLAIM_B, "odd", [OTHER_POD], []) | {"DriverState": ["future"]}
    data = dra_state([odd, claim(CLAIM_A, "gpu", [POD_UID], [device([gpu_id(CLAIM_A, 2)])])])
    assert [c.uid for c in parse_state(data, "s", POD_UID).claims] == [CLAIM_A]
    with pytest.raises(InputError, match="DriverState"):
        parse_state(data, "s", OTHER_POD)
    with pytest.raises(InputError, match="DriverState"):
        parse_state(data, "s")  # doctor reads every claim
