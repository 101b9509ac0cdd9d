"""Issue 12 in simulation: a Kubernetes container's env needs the kubelet's word, and a known
allocation bounds every accelerator the container was given (hook --bundle on the 4x-k8s node,
where NVML index 2 is /dev/nvidia3, with a real protobuf checkpoint file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hook.sources.kubelet.podid import identify
from tests.bundles import (
    ALLOW_ALL,
    DEFAULT_RULES,
    POD_CAPS,
    alloc_resp,
    checkpoint,
    checkpoint_entry,
    settings_file,
    simulate,
    write_bundle,
)
from tests.dra_shapes import claim, device, dra_state
from tests.hosttree import CAPS_MAJOR, make_host_tree
from tests.k8s_shapes import (
    CONTAINER,
    GPUS,
    IMAGE_ENV,
    MOUNT_ROOT,
    POD_UID,
    allow,
    annotations,
    cgroups_path,
    control_devs,
    env,
    gpu_dev,
    gpu_path,
    null_mount,
    nvidia_runtime,
    write_cdi,
)

UUID2 = GPUS[2].uuid
ALL_GPU_KEYS = {("c", 195, g.minor) for g in GPUS.values()}
MIG_CAPS = {("c", CAPS_MAJOR, 1), ("c", CAPS_MAJOR, 2)}
ENGINES = ["containerd", "crio"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("k8s-node")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


def pod_config(
    engine: str = "containerd",
    *,
    cri_env: list[str] | None = None,
    image_env: list[str] | None = None,
    namespace: str = "ml",
    k8s: bool = True,
    devices: list[dict[str, Any]] | None = None,
    rules: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    extra_annotations: dict[str, str] | None = None,
    caps: list[str] | None = None,
) -> dict[str, Any]:
    ann = annotations(engine, namespace) if k8s else {}
    return {
        "ociVersion": "1.1.0",
        "process": {
            "args": ["sh"],
            "cwd": "/",
            "env": env(engine, IMAGE_ENV if image_env is None else image_env, cri_env or []),
            "capabilities": {k: caps or POD_CAPS for k in ("bounding", "effective", "permitted")},
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *(mounts or [])],
        "annotations": {**ann, **(extra_annotations or {})},
        "linux": {
            "cgroupsPath": cgroups_path(engine),
            "devices": list(devices or []),
            "resources": {"devices": list(rules if rules is not None else DEFAULT_RULES)},
            "namespaces": [{"type": "pid"}, {"type": "mount"}],
        },
    }


def run(
    tmp: Path,
    node: dict[str, Path],
    cfg: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    *,
    ckpt: bytes | None = b"",
    **settings: Any,
) -> dict[str, Any]:
    """Simulate on the 4x-k8s node; ``ckpt`` b"" = a healthy checkpoint with no entry, None = no file."""
    bundle = write_bundle(tmp / "bundle", cfg)
    path = tmp / "kubelet_internal_checkpoint"
    if ckpt is not None:
        path.write_bytes(ckpt or checkpoint([]))
    settings.setdefault("kubelet_checkpoint", str(path))
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"])]
    rc, report, err = simulate(bundle, *args, "--config", str(settings_file(tmp, **settings)), capsys=capsys)
    assert (rc, err) == (0, ""), err
    return report


def allowed(report: dict[str, Any]) -> set[tuple[str, int, int | None]]:
    return {(r["type"], r["major"], r["minor"]) for r in report["cgroup"] if r["allow"]}


def denied(report: dict[str, Any]) -> set[tuple[str, int, int | None]]:
    return {(r["type"], r["major"], r["minor"]) for r in report["cgroup"] if not r["allow"]}


def gpu_key(index: int) -> tuple[str, int, int]:
    return ("c", 195, GPUS[index].minor)


def gpu_entry(resp: bytes, ids: list[str] | None = None, **kw: Any) -> dict[str, object]:
    return checkpoint_entry(
        "nvidia.com/gpu", ids or [UUID2], resp, pod_uid=POD_UID, container=CONTAINER, **kw
    )


# --- the pod identity ----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_both_engines_shapes_name_the_pod(engine: str) -> None:
    pod = identify(annotations(engine, "gpu-operator", "dcgm-exporter-x"), cgroups_path(engine)).pod
    assert pod is not None
    assert (pod.uid, pod.container, pod.namespace, pod.name) == (
        POD_UID,
        CONTAINER,
        "gpu-operator",
        "dcgm-exporter-x",
    )


def test_the_other_engines_namespace_key_names_nothing() -> None:
    """A pod's own ``io.kubernetes.pod.namespace`` in a containerd config is its word, not the engine's."""
    ann = {**annotations("containerd", "ml"), "io.kubernetes.pod.namespace": "gpu-operator"}
    ident = identify(ann, cgroups_path("containerd"))
    assert ident.pod is not None and ident.pod.namespace == "ml" and ident.problem == ""


# --- image env, no allocation ----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_image_env_all_without_allocation_is_no_request(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    rep = run(tmp_path, node, pod_config(engine), capsys)
    assert (rep["verdict"], rep["requests"], rep["cgroup"]) == ("none", [], [])
    (warning,) = rep["warnings"]
    assert warning.startswith(
        "NVIDIA_VISIBLE_DEVICES=all ignored: the kubelet allocated no GPU to pod ml/train-0"
    )
    assert rep["kubernetes"]["checkpoint_state"] == "read"
    assert rep["kubernetes"]["allocation"] == []


def test_outside_kubernetes_the_env_is_honoured(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    rep = run(tmp_path, node, pod_config(k8s=False), capsys)
    assert rep["verdict"] == "apply"
    assert allowed(rep) >= ALL_GPU_KEYS
    assert rep["kubernetes"] is None and rep["warnings"] == []


def test_env_requests_always_honours_the_image_env(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    rep = run(tmp_path, node, pod_config(), capsys, env_requests="always")
    assert allowed(rep) >= ALL_GPU_KEYS


def test_trusted_namespace_sees_every_gpu(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    """A DCGM exporter in the GPU operator's namespace: env all in its pod spec, no allocation."""
    cfg = pod_config("crio", namespace="gpu-operator", cri_env=["NVIDIA_VISIBLE_DEVICES=all"])
    rep = run(tmp_path, node, cfg, capsys)
    assert allowed(rep) >= ALL_GPU_KEYS
    assert rep["evidence"] == ["trusted-namespace:gpu-operator"]
    assert rep["kubernetes"]["trusted_namespace"] is True
    untrusted = run(tmp_path, node, cfg, capsys, env_trusted_namespaces=[])
    assert untrusted["cgroup"] == []


@pytest.mark.parametrize(
    "namespace", ["kube-system-evil", "kube", "gpu-operator2", "Kube-System", "kube-system "]
)
def test_trusted_namespaces_match_exactly_not_by_prefix(
    namespace: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """Issue 21, item 11: ``kube-system-evil`` is not ``kube-system`` (a prefix-matching mutant survived)."""
    cfg = pod_config("crio", namespace=namespace, cri_env=["NVIDIA_VISIBLE_DEVICES=all"])
    rep = run(tmp_path, node, cfg, capsys)
    assert (rep["verdict"], rep["cgroup"], rep["evidence"]) == ("none", [], [])
    assert rep["kubernetes"]["trusted_namespace"] is False
    exact = run(tmp_path, node, cfg, capsys, env_trusted_namespaces=[namespace])
    assert exact["kubernetes"]["trusted_namespace"] is True and allowed(exact) >= ALL_GPU_KEYS


@pytest.mark.parametrize(
    ("ckpt", "state"),
    [
        pytest.param(None, "absent", id="absent"),
        pytest.param(b"{oops", "corrupt", id="not-json"),
        pytest.param(b'{"Data": []}', "corrupt", id="data-list"),
        pytest.param(
            checkpoint([{"PodUID": POD_UID, "ContainerName": CONTAINER, "AllocResp": 7}]),
            "corrupt",
            id="resp-int",
        ),
        pytest.param(
            checkpoint([{"PodUID": POD_UID, "ContainerName": CONTAINER, "AllocResp": "KgmA"}]),
            "corrupt",
            id="truncated-protobuf",
        ),
    ],
)
def test_no_checkpoint_answer_never_stops_a_container_and_says_so(
    ckpt: bytes | None, state: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    rep = run(tmp_path, node, pod_config(), capsys, ckpt=ckpt)
    assert (rep["verdict"], rep["requests"]) == ("none", [])
    assert rep["kubernetes"]["checkpoint_state"] == state
    assert any(f"is {state} and nothing a plugin sets corroborates" in w for w in rep["warnings"])


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_unreadable_checkpoint_is_a_state_too(
    kind: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """Neither a directory nor a FIFO (whose read would block the container's start) is read."""
    import os

    odd = tmp_path / "not-a-file"
    if kind == "directory":
        odd.mkdir()
    else:
        os.mkfifo(odd)
    rep = run(tmp_path, node, pod_config(), capsys, kubelet_checkpoint=str(odd))
    assert (rep["verdict"], rep["kubernetes"]["checkpoint_state"]) == ("none", "unreadable")
    assert any(w.startswith(f"{odd}: ") for w in rep["warnings"])


# --- allocated GPU 2 (index 2 = /dev/nvidia3), by each strategy -----------------------------------------


def strategy(name: str) -> tuple[bytes, list[str], list[dict[str, Any]], dict[str, str]]:
    """(AllocResp, CRI env the plugin adds, mounts, annotations) of k8s-device-plugin's strategies."""
    if name == "envvar":
        return alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2}), [f"NVIDIA_VISIBLE_DEVICES={UUID2}"], [], {}
    if name == "volume-mounts":
        resp = alloc_resp(
            envs={"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, mounts=[(f"{MOUNT_ROOT}/{UUID2}", "/dev/null")]
        )
        return resp, [f"NVIDIA_VISIBLE_DEVICES={MOUNT_ROOT}"], [null_mount(f"{MOUNT_ROOT}/{UUID2}")], {}
    key = f"cdi.k8s.io/nvidia-device-plugin_{UUID2}"
    ann = {key: f"nvidia.com/gpu={UUID2}"}
    return alloc_resp(annotations=ann), [], [], ann


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["envvar", "volume-mounts", "cdi-annotations"])
def test_allocated_gpu2_by_each_strategy_opens_gpu2_only(
    name: str, engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    resp, plugin_env, mounts, ann = strategy(name)
    cfg = pod_config(engine, cri_env=plugin_env, mounts=mounts, extra_annotations=ann)
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert rep["verdict"] == "apply"
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(2)}
    assert [n["path"] for n in rep["nodes"]["create"] if n["major"] == 195 and n["minor"] < 8] == [
        gpu_path(2)
    ]
    assert rep["kubernetes"]["allocation"] == ["nvidia.com/gpu"]


# --- issue 21, item 10: a /dev/null volume mount needs the kubelet's word too ---------------------------


def _mount_of(index: int) -> dict[str, Any]:
    return null_mount(f"{MOUNT_ROOT}/{GPUS[index].uuid}")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_volume_mount_the_allocation_does_not_carry_is_no_request(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The checkpoint was read and allocated this container nothing: a hostPath /dev/null mount
    under the volume-mount root is something any pod allowed that volume can write."""
    cfg = pod_config(engine, mounts=[_mount_of(2)])
    rep = run(tmp_path, node, cfg, capsys)
    assert (rep["verdict"], rep["requests"], allowed(rep) & ALL_GPU_KEYS) == ("none", [], set())
    assert rep["kubernetes"]["checkpoint_state"] == "read"
    ignored = f"{MOUNT_ROOT}/{UUID2}: /dev/null volume mount ignored"
    assert any(w.startswith(ignored) for w in rep["warnings"])
    assert rep["reason"].startswith("no device requested: ")
    assert f"mount {MOUNT_ROOT}/{UUID2}" in rep["reason"]


def test_only_the_mounts_the_allocation_carries_count(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    resp, plugin_env, mounts, _ = strategy("volume-mounts")
    cfg = pod_config(cri_env=plugin_env, mounts=[*mounts, _mount_of(3)])  # GPU 3: the pod's own addition
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(2)}
    ignored = f"{MOUNT_ROOT}/{GPUS[3].uuid}: /dev/null volume mount ignored"
    assert any(w.startswith(ignored) for w in rep["warnings"])


@pytest.mark.parametrize(("ckpt", "state"), [(None, "absent"), (b"{oops", "corrupt")])
def test_a_volume_mount_counts_as_before_when_the_checkpoint_cannot_answer(
    ckpt: bytes | None, state: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    rep = run(tmp_path, node, pod_config(mounts=[_mount_of(2)]), capsys, ckpt=ckpt)
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(2)}
    path = tmp_path / "kubelet_internal_checkpoint"
    said = f"counted without the kubelet's word: its checkpoint {path} is {state}"
    assert any(
        w.startswith(f"{MOUNT_ROOT}/{UUID2}: /dev/null volume mount(s) of pod ml/") and w.endswith(said)
        for w in rep["warnings"]
    ), rep["warnings"]


def test_pod_spec_env_all_after_the_plugins_does_not_widen(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """containerd: image all, plugin GPU 2, then the pod spec's own all: the last one wins the env,
    and the kubelet's allocation still decides."""
    resp, plugin_env, _, _ = strategy("envvar")
    cfg = pod_config("containerd", cri_env=[*plugin_env, "NVIDIA_VISIBLE_DEVICES=all"])
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(2)}
    assert rep["warnings"] == [
        "NVIDIA_VISIBLE_DEVICES=all ignored: the allocation came from kubelet-checkpoint:nvidia.com/gpu"
    ]


def test_sibling_containers_allocation_vouches_for_nothing(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    resp, plugin_env, _, _ = strategy("envvar")
    sibling = checkpoint_entry("nvidia.com/gpu", [UUID2], resp, pod_uid=POD_UID, container="sidecar")
    rep = run(tmp_path, node, pod_config(cri_env=plugin_env), capsys, ckpt=checkpoint([sibling]))
    assert (rep["verdict"], rep["requests"]) == ("none", [])
    assert "the kubelet allocated no GPU" in rep["warnings"][0]


def test_a_nics_allocation_vouches_for_nothing(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    """An RDMA NIC of the same vendor, even one whose response carried the env, is not a GPU."""
    nic = checkpoint_entry(
        "nvidia.com/hostdev",
        ["0000:5e:00.1"],
        alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": "all"}),
        pod_uid=POD_UID,
        container=CONTAINER,
    )
    rep = run(tmp_path, node, pod_config(), capsys, ckpt=checkpoint([nic]))
    assert (rep["verdict"], rep["requests"]) == ("none", [])
    assert rep["kubernetes"]["allocation"] == ["nvidia.com/hostdev"]


def test_hami_slice_with_its_allocation_gets_its_card(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    hami = {
        "NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    cfg = pod_config(cri_env=[f"{k}={v}" for k, v in hami.items()])
    rep = run(
        tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(alloc_resp(envs=hami), [GPUS[1].uuid])])
    )
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(1)}
    assert rep["warnings"] == []


@pytest.mark.parametrize(
    ("ckpt", "state"), [pytest.param(b"", "read", id="not-listed"), pytest.param(None, "absent", id="absent")]
)
def test_hami_slice_corroborated_by_its_plugin_only_siblings(
    ckpt: bytes | None, state: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A plugin that speaks env only (HAMi#469): its sibling env vouches, as outside Kubernetes."""
    cfg = pod_config(cri_env=[f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}", "CUDA_DEVICE_MEMORY_LIMIT_0=20000m"])
    rep = run(tmp_path, node, cfg, capsys, ckpt=ckpt)
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(1)}
    assert rep["evidence"] == ["env", "corroborated-by:env:CUDA_DEVICE_MEMORY_LIMIT_0"]
    assert rep["kubernetes"]["checkpoint_state"] == state
    alone = pod_config(cri_env=[f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}"])
    assert run(tmp_path, node, alone, capsys, ckpt=ckpt)["cgroup"] == []


def test_corroborated_slice_still_bounds_a_runtimes_over_grant(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The vouched env is the allocation: NVIDIA's runtime honoured the image's all, the rest goes."""
    cri = [f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}", "CUDA_DEVICE_SM_LIMIT=30"]
    cfg = nvidia_runtime(pod_config(image_env=IMAGE_ENV, cri_env=cri), "legacy", list(GPUS), "/bin/true")
    rep = run(tmp_path, node, cfg, capsys)
    assert denied(rep) == ALL_GPU_KEYS - {gpu_key(1)} | MIG_CAPS


def test_mig_monitor_env_counts_when_the_gpu_allocation_carries_it(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    caps = sorted([*POD_CAPS, "CAP_SYS_ADMIN"])
    envs = {"NVIDIA_VISIBLE_DEVICES": UUID2, "NVIDIA_MIG_MONITOR_DEVICES": "all"}
    cfg = pod_config(cri_env=[f"{k}={v}" for k, v in envs.items()], caps=caps)
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(alloc_resp(envs=envs))]))
    assert ("c", CAPS_MAJOR, 2) in allowed(rep) and gpu_key(2) in allowed(rep)
    other = {"NVIDIA_VISIBLE_DEVICES": UUID2}  # the allocation does not carry the MIG env: no cap
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(alloc_resp(envs=other))]))
    assert ("c", CAPS_MAJOR, 2) not in allowed(rep) and gpu_key(2) in allowed(rep)


def test_mig_monitor_env_needs_the_kubelets_word_too(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    caps = sorted([*POD_CAPS, "CAP_SYS_ADMIN"])
    cfg = pod_config(image_env=["PATH=/bin", "NVIDIA_MIG_MONITOR_DEVICES=all"], caps=caps)
    rep = run(tmp_path, node, cfg, capsys)
    assert (rep["verdict"], rep["requests"]) == ("none", [])
    assert rep["warnings"][0].startswith("NVIDIA_MIG_MONITOR_DEVICES=all ignored")
    trusted = run(  # with a GPU request: NVIDIA ignores MIG envs in a container that asks for no GPU
        tmp_path,
        node,
        pod_config(
            image_env=[*cfg["process"]["env"], "NVIDIA_VISIBLE_DEVICES=all"],
            caps=caps,
            namespace="kube-system",
        ),
        capsys,
    )
    assert ("c", CAPS_MAJOR, 2) in allowed(trusted)


# --- over-grants beyond a known allocation --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cdi", "legacy"])
@pytest.mark.parametrize("engine", ENGINES)
def test_nvidia_runtime_all_gpus_narrowed_to_the_allocation(
    mode: str, engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    resp, _, _, _ = strategy("envvar")
    cfg = nvidia_runtime(
        pod_config(engine, cri_env=["NVIDIA_VISIBLE_DEVICES=all"]), mode, list(GPUS), "/bin/true"
    )
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert rep["verdict"] == "apply"
    assert denied(rep) == ALL_GPU_KEYS - {gpu_key(2)} | MIG_CAPS  # no MIG here: config/monitor too
    assert {r["access"] for r in rep["cgroup"] if not r["allow"]} == {"rw"}  # runc's c *:* m stays
    assert sorted(rep["nodes"]["remove"]) == sorted(gpu_path(i) for i in GPUS if i != 2)
    assert rep["container"]["widened"] is True and rep["container"]["privileged"] is False
    assert rep["kubernetes"]["bounded"] is True


def test_nvidia_runtime_all_gpus_for_a_pod_allocated_none(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = nvidia_runtime(pod_config(), "cdi", list(GPUS), "/bin/true")
    rep = run(tmp_path, node, cfg, capsys)
    assert denied(rep) == ALL_GPU_KEYS | MIG_CAPS
    assert "kubelet allocated this container no GPU" in rep["reason"]
    audit = run(tmp_path, node, cfg, capsys, privileged_allocation="audit")
    assert (audit["verdict"], audit["cgroup"]) == ("none", [])


def test_nvidia_runtime_outside_kubernetes_is_left_as_asked(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = nvidia_runtime(pod_config(k8s=False), "cdi", list(GPUS), "/bin/true")
    rep = run(tmp_path, node, cfg, capsys)
    assert denied(rep) == set() and rep["nodes"]["remove"] == []


def test_rules_alone_over_grant_is_denied(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    """A specific allow rule with no node (a shim's, or --device-cgroup-rule) is an over-grant too."""
    resp, plugin_env, _, _ = strategy("envvar")
    rules = [
        *DEFAULT_RULES,
        {"allow": True, "type": "c", "major": 195, "minor": GPUS[0].minor, "access": "rw"},
    ]
    cfg = pod_config(cri_env=plugin_env, rules=rules, devices=[gpu_dev(2), *control_devs()])
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert gpu_key(0) in denied(rep) and gpu_key(2) not in denied(rep)
    assert rep["nodes"]["remove"] == []


def test_privileged_pod_without_allocation_is_still_left_alone(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = pod_config(rules=ALLOW_ALL, devices=[gpu_dev(i) for i in GPUS])
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["verdict"] == "none" and rep["cgroup"] == []


def test_reject_policy_refuses_the_over_granted_pod(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    from hook.cli import run as cli

    cfg = nvidia_runtime(pod_config(), "cdi", list(GPUS), "/bin/true")
    bundle = write_bundle(tmp_path / "bundle", cfg)
    (tmp_path / "ck").write_bytes(checkpoint([]))
    settings = settings_file(
        tmp_path, kubelet_checkpoint=str(tmp_path / "ck"), privileged_allocation="reject"
    )
    args = [
        "--bundle",
        str(bundle),
        "--driver-root",
        str(node["root"]),
        "--config",
        str(settings),
        "--format",
        "json",
    ]
    capsys.readouterr()
    assert cli([*args, "--cdi-spec-dir", str(node["cdi"])]) == 3
    assert json.loads(capsys.readouterr().out)["verdict"] == "deny"


def test_a_pod_with_dra_claims_is_not_bounded_by_the_device_plugin_checkpoint(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """DRA injects CDI devices (nodes with their own allow rule) that kubelet_internal_checkpoint
    never lists; its own state file (beside device-plugins/) names the pod, so nothing is denied."""
    ckpt_dir = tmp_path / "kubelet" / "device-plugins"
    ckpt_dir.mkdir(parents=True)
    (ckpt_dir / "kubelet_internal_checkpoint").write_bytes(checkpoint([]))
    devices = [gpu_dev(2), *control_devs()]
    cfg = pod_config(devices=devices, rules=[*DEFAULT_RULES, *(allow(d) for d in devices)])
    settings = {"kubelet_checkpoint": str(ckpt_dir / "kubelet_internal_checkpoint")}
    bounded = run(tmp_path, node, cfg, capsys, ckpt=None, **settings)
    assert denied(bounded) == ALL_GPU_KEYS | MIG_CAPS  # without DRA state: an over-grant
    (tmp_path / "kubelet" / "dra_manager_state").write_bytes(
        dra_state([claim("c-1", "gpu", [POD_UID], [device(["k8s.gpu.nvidia.com/claim=c-1-gpu-3"])])])
    )
    rep = run(tmp_path, node, cfg, capsys, ckpt=None, **settings)
    assert (rep["verdict"], denied(rep)) == ("none", set())
    assert rep["kubernetes"]["dra_claims"] is True and rep["kubernetes"]["bounded"] is False


def test_text_report_says_what_kubelet_evidence_was_used(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    bundle = write_bundle(tmp_path / "bundle", pod_config("crio"))
    (tmp_path / "ck").write_bytes(checkpoint([]))
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"])]
    args += ["--config", str(settings_file(tmp_path, kubelet_checkpoint=str(tmp_path / "ck")))]
    rc, text, _ = simulate(bundle, *args, capsys=capsys, fmt="text")
    assert rc == 0
    assert (
        f"kubernetes: pod ml/train-0 container cuda; checkpoint {tmp_path / 'ck'} read, allocated nothing"
        in text
    )
    assert (
        "why:      no device requested: NVIDIA_VISIBLE_DEVICES=all is no request here (see warnings)" in text
    )


# --- legacy CUDA images (issue #13): an env request like any other -----------------------------------


def test_legacy_cuda_image_without_allocation_is_no_request(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """CUDA_VERSION alone asks for every GPU (NVIDIA's semantics), but the kubelet allocated none."""
    rep = run(tmp_path, node, pod_config(image_env=["PATH=/bin", "CUDA_VERSION=12.4.1"]), capsys)
    assert (rep["verdict"], rep["requests"], rep["cgroup"]) == ("none", [], [])
    (warning,) = rep["warnings"]
    assert warning.startswith("NVIDIA_VISIBLE_DEVICES=all (legacy CUDA image) ignored: the kubelet allocated")


def test_legacy_cuda_image_outside_kubernetes_gets_every_gpu(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = pod_config(image_env=["PATH=/bin", "CUDA_VERSION=12.4.1"], k8s=False)
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["verdict"] == "apply"
    assert allowed(rep) >= ALL_GPU_KEYS
    assert [r["value"] for r in rep["requests"]] == ["all"]


@pytest.mark.parametrize("name", ["envvar", "cdi-annotations"])
def test_legacy_cuda_image_with_allocation_gets_only_it(
    name: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    resp, plugin_env, mounts, ann = strategy(name)
    cfg = pod_config(
        image_env=["PATH=/bin", "CUDA_VERSION=12.4.1"],
        cri_env=plugin_env,
        mounts=mounts,
        extra_annotations=ann,
    )
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert rep["verdict"] == "apply"
    assert allowed(rep) & ALL_GPU_KEYS == {gpu_key(2)}
