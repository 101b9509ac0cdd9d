"""The plugin-allocation policy (issue 5): gather + decide on real temp bundles and the seed 000 node.

gpustack's 13 privilege cases (device-plugins.md §1.5) restated for a hook, the seed pods, the
engines' privileged shapes (§5.3-5.5), and the policies. Node facts (examples/node): GPUs 195:0-7,
card 0 in MIG mode with GI 1 (caps 237:12, CI 237:13) and GI 2 (237:21, 237:22); cap1 config, cap2 monitor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import (
    ALLOW_ALL,
    CARD0_UUID,
    DEFAULT_RULES,
    MIG_UUID,
    POD_ANNOTATIONS,
    POD_CAPS,
    SLICE_UUID,
    alloc_resp,
    allow_keys,
    checkpoint,
    checkpoint_entry,
    config,
    control,
    denied_among,
    deny_keys,
    gen,
    gpu_nodes,
    host_devices,
    node,
    node_args,
    null_mount,
    settings_file,
    simulate,
    write_bundle,
)

GPU = {i: ("c", 195, i) for i in range(8)}
CAPS = {m: ("c", 237, m) for m in (1, 2, 12, 13, 21, 22)}
ALL_ACCEL = set(GPU.values()) | set(CAPS.values())
CARD3_UUID = "GPU-8e0a4b37-6c2f-4d19-b5e7-3f1a9c8d2e60"
HAMI = ["CUDA_DEVICE_MEMORY_LIMIT_0=40779m", "CUDA_DEVICE_SM_LIMIT=50"]
NV_NODE = re.compile(r"^/dev/nvidia[0-9]+$")


def decide_for(
    tmp: Path,
    cfg: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    *,
    ckpt: bytes | None = None,
    fmt: str = "json",
    **settings: Any,
) -> tuple[int, Any, str]:
    bundle = write_bundle(tmp / "bundle", cfg)
    if ckpt is not None:
        (tmp / "ckpt").write_bytes(ckpt)
    settings.setdefault("kubelet_checkpoint", str(tmp / "ckpt"))
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    args = [*node_args(root), "--config", str(settings_file(tmp, **settings))]
    return simulate(bundle, *args, capsys=capsys, fmt=fmt)


def narrowed_to(report: dict[str, Any], kept: set[tuple[str, int, int]]) -> None:
    """A narrowing plan: deny every seed-000 accelerator node except ``kept``, allow nothing new."""
    assert report["verdict"] == "apply", report["reason"]
    assert denied_among(report, ALL_ACCEL) == ALL_ACCEL - kept
    assert {k for k in deny_keys(report) if k[2] is not None} <= ALL_ACCEL  # and no other node
    assert allow_keys(report) == set()
    assert report["container"]["widened"] is True
    assert report["plugin_allocation"] is True
    assert report["reason"].startswith("narrowed a privileged container to its plugin allocation")


def left_alone(report: dict[str, Any]) -> None:
    assert report["verdict"] == "none"
    assert report["cgroup"] == []
    assert report["nodes"] == {"create": [], "remove": []}


def _priv(env: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    return config(env or [], privileged=True, devices=host_devices(), **kw)


# --- gpustack's 13 cases, restated -----------------------------------------------------------------


def test_01_no_device_cpu_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, rep, _ = decide_for(tmp_path, config(["LANG=C"]), capsys)
    assert rc == 0
    left_alone(rep)
    assert rep["reason"] == "no device requested"
    assert rep["container"] == {"id": "bundle", "privileged": False, "sys_admin": False, "widened": False}


def test_02_unprivileged_env_request_is_granted_never_widened(tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(tmp_path, config(["NVIDIA_VISIBLE_DEVICES=2"]), capsys)
    assert (rc, rep["verdict"]) == (0, "apply")
    assert deny_keys(rep) == set()
    allowed = allow_keys(rep)
    assert ("c", 195, 2) in allowed
    assert not allowed & (ALL_ACCEL - {GPU[2]})
    assert {n["path"] for n in rep["nodes"]["create"]} >= {"/dev/nvidia2", "/dev/nvidiactl"}
    assert not {n["path"] for n in rep["nodes"]["create"]} & {f"/dev/nvidia{i}" for i in range(8) if i != 2}
    assert rep["container"]["widened"] is False


@pytest.mark.parametrize(
    "env",
    [
        pytest.param([], id="03-no-resources"),
        pytest.param(["CPU_LIMIT=2", "MEMORY_LIMIT=4Gi"], id="04-non-device-resources"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=0,1"], id="05-whole-cards-env-injection"),
        pytest.param(["NVIDIA_VISIBLE_DEVICES=all"], id="06-all-devices-env"),
    ],
)
def test_privileged_without_plugin_allocation_left_alone(env: list[str], tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(tmp_path, _priv(env), capsys)
    assert rc == 0
    left_alone(rep)
    assert (
        rep["reason"]
        == "privileged container without a plugin allocation: all devices on purpose, left alone"
    )
    assert rep["container"]["privileged"] is True
    assert rep["plugin_allocation"] is False


def test_07_whole_cards_by_cdi_annotation_narrowed(tmp_path: Path, capsys) -> None:
    cfg = _priv(annotations={"cdi.k8s.io/gpustack-nvidia": "nvidia.com/gpu=0,nvidia.com/gpu=1"})
    rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert rc == 0
    narrowed_to(rep, {GPU[0], GPU[1]})
    assert "/dev/nvidia0" not in rep["nodes"]["remove"] and "/dev/nvidia1" not in rep["nodes"]["remove"]
    assert "/dev/nvidia7" in rep["nodes"]["remove"]


def test_08_auto_mapped_devices_by_checkpoint_cdi(tmp_path: Path, capsys) -> None:
    ck = checkpoint([checkpoint_entry("gpustack.ai/devices", ["0"], alloc_resp(cdi=["nvidia.com/gpu=3"]))])
    _rc, rep, _ = decide_for(tmp_path, _priv(annotations=POD_ANNOTATIONS), capsys, ckpt=ck)
    narrowed_to(rep, {GPU[3]})
    assert rep["requests"] == [
        {
            "source": "kubelet-checkpoint:gpustack.ai/devices",
            "value": "nvidia.com/gpu=3",
            "kind": "cdi",
            "from_plugin": True,
        }
    ]


def test_09_exclusive_whole_card_by_checkpoint_ids(tmp_path: Path, capsys) -> None:
    ck = checkpoint([checkpoint_entry("nvidia.com/gpu", [SLICE_UUID])])
    _rc, rep, _ = decide_for(tmp_path, _priv(annotations=POD_ANNOTATIONS), capsys, ckpt=ck)
    narrowed_to(rep, {GPU[1]})
    assert rep["evidence"] == ["kubelet-checkpoint"]


@pytest.mark.parametrize(
    ("env", "mounts", "narrowed"),
    [
        pytest.param(
            [f"NVIDIA_VISIBLE_DEVICES={CARD3_UUID}", "CUDA_DEVICE_SM_LIMIT=100"],
            [],
            True,
            id="env-corroborated-by-sibling",
        ),
        pytest.param(
            ["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"],
            [null_mount(f"/var/run/nvidia-container-devices/{CARD3_UUID}")],
            True,
            id="volume-mounts",
        ),
        pytest.param([f"NVIDIA_VISIBLE_DEVICES={CARD3_UUID}"], [], False, id="env-not-corroborated"),
    ],
)
def test_09_whole_card_env_corroborated_or_not(env, mounts, narrowed, tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(tmp_path, _priv(env, mounts=mounts), capsys)
    assert rc == 0
    if narrowed:
        narrowed_to(rep, {GPU[3]})
    else:
        left_alone(rep)


def _only_card_left(rep: dict[str, Any], cfg: dict[str, Any], card: str) -> None:
    removed = set(rep["nodes"]["remove"])
    denied = deny_keys(rep)
    left = {
        d["path"]
        for d in cfg["linux"]["devices"]
        if NV_NODE.match(d["path"])
        and d["path"] not in removed
        and (d["type"], d["major"], d["minor"]) not in denied
    }
    assert left == {card}


def test_10_soft_slice_hami_privileged_narrowed(tmp_path: Path, capsys) -> None:
    cfg = _priv([f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}", *HAMI])
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    narrowed_to(rep, {GPU[1]})
    _only_card_left(rep, cfg, "/dev/nvidia1")
    assert rep["evidence"] == ["env", "corroborated-by:env:CUDA_DEVICE_MEMORY_LIMIT_0"]


def test_11_hard_mig_partition_narrowed_to_parent_and_own_caps(tmp_path: Path, capsys) -> None:
    cfg = _priv(
        [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID}"],
        annotations={f"cdi.k8s.io/nvidia-device-plugin_{MIG_UUID[4:]}": f"nvidia.com/gpu={MIG_UUID}"},
    )
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    narrowed_to(rep, {GPU[0], CAPS[12], CAPS[13]})
    assert {
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    } <= set(rep["nodes"]["remove"])
    assert "/dev/nvidia-caps/nvidia-cap12" not in rep["nodes"]["remove"]


AMD = {"card0": (226, 0), "card1": (226, 1), "renderD128": (226, 128), "renderD129": (226, 129)}


def test_12_amd_soft_slice_privileged_narrowed_kfd_kept(tmp_path: Path, capsys) -> None:
    devices = [
        node("/dev/null", 1, 3),
        node("/dev/kfd", 235, 0),
        *(node(f"/dev/dri/{n}", *mm) for n, mm in AMD.items()),
    ]
    cfg = config(["VROCM_SLICE=50"], privileged=True, devices=devices, annotations=POD_ANNOTATIONS)
    resp = alloc_resp(
        devices=[("/dev/kfd", "/dev/kfd", "rw"), ("/dev/dri/renderD128", "/dev/dri/renderD128", "rw")]
    )
    ck = checkpoint([checkpoint_entry("amd.com/gpu.sliced", ["gpu-0"], resp)])
    rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=ck)
    assert (rc, rep["verdict"]) == (0, "apply")
    assert deny_keys(rep) == {("c", 226, 0), ("c", 226, 1), ("c", 226, 129)}
    assert allow_keys(rep) == set()
    assert rep["nodes"]["remove"] == ["/dev/dri/card0", "/dev/dri/card1", "/dev/dri/renderD129"]


def test_13_lookalike_resource_keeps_privilege(tmp_path: Path, capsys) -> None:
    """Keys merely prefixed like the real channels are no allocation; a checkpoint entry for another
    container of the pod does not count either."""
    cfg = _priv(
        ["NVIDIA_VISIBLE_DEVICES_ALIKE=0", "CUDA_DEVICE_MEMORY_LIMITS=1"],
        annotations={**POD_ANNOTATIONS, "cdi.k8s.io.alike/x": "nvidia.com/gpu=0"},
        mounts=[null_mount("/var/run/nvidia-container-devices-alike/0")],
    )
    ck = checkpoint([checkpoint_entry("nvidia.com/gpu-alike", ["0"], container="other")])
    rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=ck)
    assert rc == 0
    left_alone(rep)
    assert rep["requests"] == []


def test_13b_own_lookalike_checkpoint_entry_with_opaque_ids_is_not_read_as_nvidia_ids(
    tmp_path: Path, capsys
) -> None:
    """Only NVIDIA's own resources carry NVIDIA device IDs; opaque IDs of a look-alike are no request."""
    ck = checkpoint([checkpoint_entry("nvidia.com/gpu-alike", ["alike-0"])])
    rc, rep, err = decide_for(tmp_path, _priv([], annotations=POD_ANNOTATIONS), capsys, ckpt=ck)
    assert (rc, err) == (0, "")
    left_alone(rep)
    assert rep["requests"] == []


# --- seed pods --------------------------------------------------------------------------------------


def test_seed000_slice_pod(tmp_path: Path, capsys) -> None:
    cfg = gen.bundles()["slice-privileged"]
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    narrowed_to(rep, {GPU[1]})
    _only_card_left(rep, cfg, "/dev/nvidia1")
    assert rep["nodes"]["create"] == []


def test_seed000_mig_pod(tmp_path: Path, capsys) -> None:
    _rc, rep, _ = decide_for(tmp_path, gen.bundles()["mig-privileged"], capsys)
    narrowed_to(rep, {GPU[0], CAPS[12], CAPS[13]})
    assert rep["warnings"] == [
        f"NVIDIA_VISIBLE_DEVICES={MIG_UUID} ignored: the allocation came from "
        f"annotation:cdi.k8s.io/nvidia-device-plugin_{MIG_UUID[4:]}"
    ]


def test_seed001_plugin_pod_gets_exactly_the_monitor_cap(tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(tmp_path, gen.bundles()["device-plugin-seed001"], capsys)
    assert (rc, rep["verdict"]) == (0, "apply")
    assert rep["cgroup"] == [{"allow": True, "type": "c", "major": 237, "minor": 2, "access": "r"}]
    assert rep["nodes"] == {
        "create": [
            {
                "path": "/dev/nvidia-caps/nvidia-cap2",
                "type": "c",
                "major": 237,
                "minor": 2,
                "fileMode": 0o444,
                "uid": 0,
                "gid": 0,
            }
        ],
        "remove": [],
    }


def test_seed001_without_sys_admin_is_denied(tmp_path: Path, capsys) -> None:
    cfg = gen.bundles()["device-plugin-seed001"]
    for key in ("bounding", "effective", "permitted"):
        cfg["process"]["capabilities"][key] = POD_CAPS
    rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (3, "deny")
    assert "CAP_SYS_ADMIN" in rep["reason"]
    assert "add SYS_ADMIN to securityContext.capabilities.add" in rep["reason"]
    assert rep["cgroup"] == [] and rep["nodes"] == {"create": [], "remove": []}


@pytest.mark.parametrize("mig", [MIG_UUID, "0:0"], ids=["mig-uuid", "gpu-mig-index"])
@pytest.mark.parametrize("env", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_mig_management_with_specific_mig_devices_denied(mig: str, env: str, tmp_path: Path, capsys) -> None:
    cfg = config([f"NVIDIA_VISIBLE_DEVICES={mig}", f"{env}=all"], caps=sorted([*POD_CAPS, "CAP_SYS_ADMIN"]))
    rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert (rc, rep["verdict"]) == (3, "deny")
    assert rep["reason"].startswith(f"{env}=all refused: specific MIG devices are selected")


@pytest.mark.parametrize(
    ("mode", "caps", "verdict"),
    [
        pytest.param("never", ["CAP_SYS_ADMIN"], "deny", id="never"),
        pytest.param("privileged", ["CAP_SYS_ADMIN"], "deny", id="privileged-only-unprivileged-pod"),
        pytest.param("require_sys_admin", ["CAP_SYS_ADMIN"], "apply", id="sys-admin"),
    ],
)
def test_mig_management_setting(mode: str, caps: list[str], verdict: str, tmp_path: Path, capsys) -> None:
    cfg = config(["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all"], caps=[*POD_CAPS, *caps])
    rc, rep, _ = decide_for(tmp_path, cfg, capsys, mig_management=mode)
    assert rep["verdict"] == verdict
    assert rc == (3 if verdict == "deny" else 0)


# --- engines' privileged shapes -------------------------------------------------------------------------


def test_containerd_privileged_shape_plugin_nodes_duplicated(tmp_path: Path, capsys) -> None:
    """containerd: plugin DeviceSpec, then host devices (nvidia1 twice); allow-all replaced the rules."""
    devices = [gpu_nodes()[1], *host_devices()]
    cfg = config(
        [f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}"],
        privileged=True,
        devices=devices,
        rules=ALLOW_ALL,
        annotations=POD_ANNOTATIONS,
    )
    ck = checkpoint(
        [
            checkpoint_entry(
                "nvidia.com/gpu",
                [SLICE_UUID],
                alloc_resp(
                    envs={"NVIDIA_VISIBLE_DEVICES": SLICE_UUID},
                    devices=[("/dev/nvidia1", "/dev/nvidia1", "rw")],
                ),
            )
        ]
    )
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=ck)
    narrowed_to(rep, {GPU[1]})
    _only_card_left(rep, cfg, "/dev/nvidia1")


def test_crio_privileged_shape_annotation_visible(tmp_path: Path, capsys) -> None:
    """CRI-O: host devices, allow-all after clearing, CDI node rule appended; the annotation is
    visible, and the kubelet's checkpoint carries it (the plugin's cdi-annotations answer, issue 28)."""
    rules = [*ALLOW_ALL, {"allow": True, "type": "c", "major": 195, "minor": 4, "access": "rwm"}]
    plugin = {"cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=4"}
    cfg = config(
        ["NVIDIA_VISIBLE_DEVICES=void"],
        privileged=True,
        devices=host_devices(),
        rules=rules,
        annotations={
            **plugin,
            "io.kubernetes.pod.uid": "u1",
            "io.kubernetes.container.name": "c",
            "io.kubernetes.cri-o.ContainerID": "abc",
        },
    )
    cfg["linux"]["cgroupsPath"] = "/kubepods/podu1/crio-abc"
    resp = alloc_resp(annotations=plugin)
    entry = checkpoint_entry("nvidia.com/gpu", ["x"], resp, pod_uid="u1", container="c")
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=checkpoint([entry]))
    narrowed_to(rep, {GPU[4]})


def test_duplicate_env_last_wins(tmp_path: Path, capsys) -> None:
    cfg = _priv(["NVIDIA_VISIBLE_DEVICES=all", *HAMI, f"NVIDIA_VISIBLE_DEVICES={CARD3_UUID}"])
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    narrowed_to(rep, {GPU[3]})
    assert [r["value"] for r in rep["requests"]] == [CARD3_UUID]


def test_forged_env_in_unprivileged_pod_ignored(tmp_path: Path, capsys) -> None:
    """The real allocation came by CDI annotation (containerd applied it: node + rule); the pod's own
    NVIDIA_VISIBLE_DEVICES=all is ignored and nothing else is granted."""
    rules = [
        *DEFAULT_RULES,
        *(
            {"allow": True, "type": "c", "major": n["major"], "minor": n["minor"], "access": "rwm"}
            for n in [gpu_nodes()[5], *control()]
        ),
    ]
    cfg = config(
        ["NVIDIA_VISIBLE_DEVICES=all"],
        devices=[gpu_nodes()[5], *control()],
        rules=rules,
        annotations={"cdi.k8s.io/nvidia-device-plugin_y": "nvidia.com/gpu=5"},
    )
    rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert rc == 0
    assert rep["warnings"] == [
        "NVIDIA_VISIBLE_DEVICES=all ignored: the allocation came from "
        "annotation:cdi.k8s.io/nvidia-device-plugin_y"
    ]
    assert not allow_keys(rep) & ALL_ACCEL
    assert not [n for n in rep["nodes"]["create"] if NV_NODE.match(n["path"])]
    assert deny_keys(rep) == set()
    assert [r["value"] for r in rep["requests"] if r["source"].startswith("annotation:")] == [
        "nvidia.com/gpu=5"
    ]


def test_unprivileged_with_extra_accelerator_node_is_widened(tmp_path: Path, capsys) -> None:
    """An unprivileged pod whose engine added card 6 next to the annotated card 5: card 6 is taken away."""
    rules = [
        *DEFAULT_RULES,
        *({"allow": True, "type": "c", "major": 195, "minor": m, "access": "rwm"} for m in (5, 255)),
    ]
    cfg = config(
        [],
        devices=[gpu_nodes()[5], gpu_nodes()[6], control()[0]],
        rules=rules,
        annotations={"cdi.k8s.io/dp": "nvidia.com/gpu=5"},
    )
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert rep["container"] == {"id": "bundle", "privileged": False, "sys_admin": False, "widened": True}
    assert GPU[6] in deny_keys(rep)
    assert GPU[5] not in deny_keys(rep)
    assert rep["nodes"]["remove"] == ["/dev/nvidia6"]


# --- policies ----------------------------------------------------------------------------------------------


def test_policy_reject_denies_naming_the_allocation(tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(
        tmp_path, gen.bundles()["slice-privileged"], capsys, privileged_allocation="reject"
    )
    assert (rc, rep["verdict"]) == (3, "deny")
    assert SLICE_UUID in rep["reason"] and "(policy: reject)" in rep["reason"]
    assert rep["cgroup"] == [] and rep["nodes"]["remove"] == []


def test_policy_audit_changes_nothing_and_warns(tmp_path: Path, capsys) -> None:
    rc, rep, _ = decide_for(
        tmp_path, gen.bundles()["slice-privileged"], capsys, privileged_allocation="audit"
    )
    assert (rc, rep["verdict"]) == (0, "none")
    assert rep["cgroup"] == [] and rep["nodes"] == {"create": [], "remove": []}
    assert rep["warnings"] == [
        f"audit: would deny 13 accelerator node(s) outside {SLICE_UUID} (env:NVIDIA_VISIBLE_DEVICES)"
    ]
    assert (
        rep["reason"].startswith("widened beyond its plugin allocation")
        and "(policy: audit)" in rep["reason"]
    )


def test_policy_narrow_is_the_default(tmp_path: Path, capsys) -> None:
    """No privileged_allocation in the settings file: the plan is the explicit "narrow" one."""
    _rc, default, _ = decide_for(tmp_path / "default", gen.bundles()["slice-privileged"], capsys)
    narrowed_to(default, {GPU[1]})
    _rc, narrow, _ = decide_for(
        tmp_path / "narrow", gen.bundles()["slice-privileged"], capsys, privileged_allocation="narrow"
    )
    assert default["cgroup"] == narrow["cgroup"] and default["nodes"] == narrow["nodes"]


# --- kubelet checkpoint: present, absent, corrupt ----------------------------------------------------------


def test_checkpoint_is_authoritative_over_env(tmp_path: Path, capsys) -> None:
    cfg = _priv(["NVIDIA_VISIBLE_DEVICES=all"], annotations=POD_ANNOTATIONS)
    ck = checkpoint(
        [
            checkpoint_entry(
                "nvidia.com/gpu", [CARD3_UUID], alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": CARD3_UUID})
            )
        ]
    )
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=ck)
    narrowed_to(rep, {GPU[3]})
    assert rep["warnings"] == [
        "NVIDIA_VISIBLE_DEVICES=all ignored: the allocation came from kubelet-checkpoint:nvidia.com/gpu"
    ]


def test_checkpoint_absent_uses_other_evidence(tmp_path: Path, capsys) -> None:
    cfg = _priv(["NVIDIA_VISIBLE_DEVICES=all"], annotations=POD_ANNOTATIONS)
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys)
    assert not (tmp_path / "ckpt").exists()
    left_alone(rep)
    (warning,) = rep["warnings"]  # the image env is no request; the warning says what evidence was missing
    assert warning.startswith("NVIDIA_VISIBLE_DEVICES=all ignored: the kubelet's checkpoint")
    assert f"{tmp_path / 'ckpt'} is absent" in warning


def test_checkpoint_corrupt_warns_and_uses_other_evidence(tmp_path: Path, capsys) -> None:
    """A corrupt checkpoint is a warning, and the other evidence is weighed; a pod's own CDI
    annotation is not evidence (issue 28): this privileged pod has no allocation anyone vouches for."""
    cfg = _priv(annotations={**POD_ANNOTATIONS, "cdi.k8s.io/x": "nvidia.com/gpu=2"})
    _rc, rep, _ = decide_for(tmp_path, cfg, capsys, ckpt=b"{corrupt")
    left_alone(rep)
    ignored, corrupt = rep["warnings"]
    assert corrupt.startswith(f"{tmp_path / 'ckpt'}: not valid JSON")
    assert corrupt.endswith("; using the other evidence")
    assert ignored.startswith("annotation cdi.k8s.io/x=nvidia.com/gpu=2 ignored: the kubelet's checkpoint")
    assert f"{tmp_path / 'ckpt'} is corrupt" in ignored


def test_checkpoint_for_another_pod_is_ignored(tmp_path: Path, capsys) -> None:
    ck = checkpoint([checkpoint_entry("nvidia.com/gpu", [CARD0_UUID], pod_uid="someone-else")])
    _rc, rep, _ = decide_for(tmp_path, _priv(annotations=POD_ANNOTATIONS), capsys, ckpt=ck)
    left_alone(rep)


def test_text_format_renders_the_decision(tmp_path: Path, capsys) -> None:
    rc, text, _ = decide_for(tmp_path, gen.bundles()["slice-privileged"], capsys, fmt="text")
    assert rc == 0
    lines = text.splitlines()
    assert lines[0] == "container bundle [privileged, sys_admin, widened]"
    assert lines[1] == "verdict:  apply"
    assert "  deny  c 195:0 rwm" in lines
    assert "remove    /dev/nvidia7" in lines
    assert "remove    /dev/nvidia1" not in lines


@pytest.mark.parametrize(("n", "tail"), [(4, "gpu=3 (s)"), (5, "gpu=3 (s) and 1 more")])
def test_allocation_names_list_four_then_count_the_rest(n: int, tail: str) -> None:
    """Issue 24 (fresh mutant s530669-085, ``> 3``): a reason names up to four allocated devices;
    exactly four never ends in "and 0 more"."""
    from hook.core.decide import _allocation_names
    from hook.core.requests import DeviceRequest, Kind, Requests

    reqs = Requests(
        items=tuple(
            DeviceRequest(source="s", value=f"nvidia.com/gpu={i}", kind=Kind.CDI, from_plugin=True)
            for i in range(n)
        ),
        evidence=(),
        warnings=(),
        driver_capabilities="",
    )
    assert _allocation_names(reqs).endswith(tail)
