"""Issue 28 items 1-2 in simulation: only the kubelet's word allocates, and untrusted means narrowed.

A pod writes its own annotations (CRI-O copies every pod annotation into each container's
config; containerd passes those its ``pod_annotations``/``container_annotations`` allow), so in
a Kubernetes container a ``cdi.k8s.io/*`` annotation counts only where this container's
checkpoint allocation or a DRA claim of the pod names the device. A pod's sandbox (pause)
container is granted nothing, and a container with no trusted pod identity is one the kubelet
allocated nothing: its over-grants are narrowed. Each case here was answered the other way by
the code before this round (the 4x-k8s node: NVML index 2 is /dev/nvidia3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bundles import ALLOW_ALL, alloc_resp, checkpoint, settings_file, simulate, write_bundle
from tests.dra_shapes import dra_state, gpu_id, write_claim_spec
from tests.hosttree import make_host_tree
from tests.k8s_shapes import (
    CONTAINER_ID,
    GPUS,
    POD_UID,
    allow,
    annotations,
    cgroups_path,
    control_devs,
    gpu_dev,
    nvidia_runtime,
    write_cdi,
)
from tests.test_dra import CLAIM_A, CLAIM_B, K8S_MINORS, OTHER_POD, gpu_claim, gpus_denied, privileged_pod
from tests.test_dra import Node as DraNode
from tests.test_k8s import ALL_GPU_KEYS, UUID2, allowed, denied, gpu_entry, gpu_key, pod_config, run
from tests.test_pod_identity import unmarked

ENGINES = ["containerd", "crio"]
ALL = {"cdi.k8s.io/x": "nvidia.com/gpu=all"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("k8s-node")
    make_host_tree(base / "root", "4x-k8s", mknod=True)
    return {"root": base / "root", "cdi": write_cdi(base / "cdi")}


def sandbox_annotations(engine: str, **extra: str) -> dict[str, str]:
    """The pod's sandbox (pause) container's keys as its engine writes them: containerd names no
    container (``container-type: sandbox``); CRI-O's ``ContainerType`` is ``sandbox``."""
    ann = annotations(engine)
    if engine == "containerd":
        del ann["io.kubernetes.cri.container-name"]
        ann["io.kubernetes.cri.container-type"] = "sandbox"
        ann["io.kubernetes.cri.sandbox-id"] = CONTAINER_ID
    else:
        del ann["io.kubernetes.container.name"]
        ann["io.kubernetes.cri-o.ContainerType"] = "sandbox"
    return {**ann, **extra}


def no_gpu_granted(rep: dict[str, Any]) -> None:
    assert not {k for k in allowed(rep) if k[1] == 195}, rep["cgroup"]
    assert not [n for n in rep["nodes"]["create"] if n["path"].startswith("/dev/nvidia")], rep["nodes"]


# --- item 1: a pod's own CDI annotation ------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pods_own_cdi_annotation_allocates_nothing(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = pod_config(engine, image_env=["PATH=/bin"], extra_annotations=ALL)
    rep = run(tmp_path, node, cfg, capsys)  # the checkpoint lists nothing for this container
    assert rep["verdict"] == "none"
    no_gpu_granted(rep)
    assert rep["requests"] == []
    assert rep["reason"] == ("no device requested: annotation cdi.k8s.io/x is no request here (see warnings)")
    (warning,) = rep["warnings"]
    assert warning.startswith(
        "annotation cdi.k8s.io/x=nvidia.com/gpu=all ignored: neither the kubelet's allocation to "
        "pod ml/train-0 container cuda"
    )


@pytest.mark.parametrize("ckpt", [None, b"{corrupt"], ids=["absent", "corrupt"])
def test_a_checkpoint_that_cannot_answer_vouches_for_no_annotation(
    ckpt: bytes | None, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = pod_config(image_env=["PATH=/bin"], extra_annotations=ALL)
    rep = run(tmp_path, node, cfg, capsys, ckpt=ckpt)
    assert rep["verdict"] == "none"
    no_gpu_granted(rep)
    assert any("nor a DRA claim of the pod names it" in w for w in rep["warnings"]), rep["warnings"]


def test_an_annotation_no_one_vouches_for_fails_nothing(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """Not even a CDI name: outside Kubernetes that is a one-line error; here it is ignored."""
    cfg = pod_config(image_env=["PATH=/bin"], extra_annotations={"cdi.k8s.io/x": "not a name"})
    rep = run(tmp_path, node, cfg, capsys)  # run() asserts exit 0 and no stderr
    assert rep["verdict"] == "none"


def test_the_checkpoint_carrying_the_annotation_still_grants_it(
    tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """The device plugin's cdi-annotations answer: the kubelet passed it on, its checkpoint has it."""
    plugin = {f"cdi.k8s.io/nvidia-device-plugin_{UUID2}": f"nvidia.com/gpu={UUID2}"}
    own = {"cdi.k8s.io/y": "nvidia.com/gpu=0"}
    cfg = pod_config(image_env=["PATH=/bin"], extra_annotations={**plugin, **own})
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(alloc_resp(annotations=plugin))]))
    assert rep["verdict"] == "apply"
    assert {k for k in allowed(rep) if k[1] == 195 and k[2] < 254} == {gpu_key(2)}
    assert any(w.startswith("annotation cdi.k8s.io/y=nvidia.com/gpu=0 ignored") for w in rep["warnings"])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_privileged_pods_own_annotation_keeps_no_unallocated_gpu(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """Allocated GPU 2 (env strategy); the pod's own annotation names GPU 0: only GPU 2 stays."""
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    cfg = pod_config(
        engine,
        cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"],
        rules=ALLOW_ALL,
        devices=[gpu_dev(i) for i in GPUS],
        extra_annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"},
        caps=["CAP_SYS_ADMIN"],
    )
    rep = run(tmp_path, node, cfg, capsys, ckpt=checkpoint([gpu_entry(resp)]))
    assert rep["verdict"] == "apply"
    assert {k for k in denied(rep) if k[1] == 195 and k[2] < 254} == ALL_GPU_KEYS - {gpu_key(2)}


def test_a_dra_pods_own_annotation_keeps_no_other_pods_claimed_gpu(tmp_path: Path, capsys: Any) -> None:
    """The pod's claim is GPU 2; another pod's claim is GPU 1, and this pod's annotation names it."""
    root = tmp_path / "root"
    make_host_tree(root, "4x-k8s", mknod=True)
    dra = DraNode(tmp_path, root)
    write_claim_spec(dra.cdi, CLAIM_A, gpus=[2])
    write_claim_spec(dra.cdi, CLAIM_B, gpus=[1])
    dra.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2), gpu_claim(CLAIM_B, 1, pods=(OTHER_POD,))]))
    cfg = privileged_pod("containerd", K8S_MINORS, {"gpus": [2]})
    cfg["annotations"]["cdi.k8s.io/x"] = gpu_id(CLAIM_B, 1)
    rc, rep, err = dra.simulate(cfg, capsys)
    assert (rc, err, rep["verdict"]) == (0, "", "apply"), (err, rep)
    assert gpus_denied(rep) == {0, 1, 3}


def test_a_dra_claim_of_the_pod_vouches_for_its_annotation(tmp_path: Path, capsys: Any) -> None:
    """Kubernetes before 1.31 passed a claim's CDI devices as annotations: the claim names them."""
    root = tmp_path / "root"
    make_host_tree(root, "4x-k8s", mknod=True)
    dra = DraNode(tmp_path, root)
    write_claim_spec(dra.cdi, CLAIM_A, gpus=[2])
    dra.dra.write_bytes(dra_state([gpu_claim(CLAIM_A, 2)]))
    cfg = pod_config(image_env=["PATH=/bin"], extra_annotations={"cdi.k8s.io/claim": gpu_id(CLAIM_A, 2)})
    rc, rep, err = dra.simulate(cfg, capsys)
    assert (rc, err, rep["verdict"]) == (0, "", "apply"), (err, rep)
    assert ("c", 195, 2) in allowed(rep)


# --- item 1: the sandbox -----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_the_pods_sandbox_is_never_granted_a_device(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    cfg = pod_config(engine, image_env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"])
    cfg["annotations"] = sandbox_annotations(engine, **ALL)
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["verdict"] == "none"
    no_gpu_granted(rep)
    assert rep["kubernetes"]["checkpoint_state"] == "sandbox"
    assert rep["kubernetes"]["pod_uid"] == POD_UID and rep["kubernetes"]["container"] == ""
    assert rep["warnings"] == [
        "annotation cdi.k8s.io/x ignored: a pod's sandbox (pause) container is never granted a device",
        "NVIDIA_VISIBLE_DEVICES=all ignored: a pod's sandbox (pause) container is never granted a device",
    ]


def test_the_text_report_says_it_is_the_sandbox(tmp_path: Path, node: dict[str, Path], capsys: Any) -> None:
    cfg = pod_config(image_env=["PATH=/bin"])
    cfg["annotations"] = sandbox_annotations("containerd", **ALL)
    (tmp_path / "ck").write_bytes(checkpoint([]))
    settings = settings_file(tmp_path, kubelet_checkpoint=str(tmp_path / "ck"))
    args = ["--driver-root", str(node["root"]), "--cdi-spec-dir", str(node["cdi"]), "--config", str(settings)]
    rc, text, _ = simulate(write_bundle(tmp_path / "b", cfg), *args, capsys=capsys, fmt="text")
    assert rc == 0
    assert "kubernetes: pod ml/train-0 sandbox (pause) container: the kubelet allocates it nothing" in text
    assert "evidence absent" not in text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sandbox_over_granted_by_a_runtime_is_narrowed(
    engine: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """NVIDIA's runtime in CDI mode honoured the annotation in the pause container too."""
    cfg = nvidia_runtime(pod_config(engine, image_env=["PATH=/bin"]), "cdi", list(GPUS), "/bin/true")
    cfg["annotations"] = sandbox_annotations(engine, **ALL)
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["verdict"] == "apply"
    assert denied(rep) >= ALL_GPU_KEYS
    assert "(none: a pod's sandbox container is allocated no device)" in rep["reason"]


@pytest.mark.parametrize(
    ("engine", "other_key"),
    [("crio", "io.kubernetes.cri.container-type"), ("containerd", "io.kubernetes.cri-o.ContainerType")],
)
def test_only_the_engines_own_key_makes_a_sandbox(
    engine: str, other_key: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A pod writing the other engine's sandbox key is still its own container (and still refused)."""
    cfg = pod_config(engine, image_env=["PATH=/bin"], extra_annotations=ALL)
    cfg["annotations"][other_key] = "sandbox"
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["kubernetes"]["checkpoint_state"] == "read" and rep["kubernetes"]["container"] == "cuda"
    no_gpu_granted(rep)


# --- item 2: no trusted identity ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["cdi-runtime", "device-specs"])
def test_no_trusted_identity_is_an_empty_allocation_not_left_alone(
    shape: str, tmp_path: Path, node: dict[str, Path], capsys: Any
) -> None:
    """A pod's identity keys without CRI-O's own marks, over-granted every GPU (a runtime in CDI
    mode, or DeviceSpecs with their rules): narrowed to nothing, and the reason says why."""
    cfg = pod_config("crio", cri_env=["NVIDIA_VISIBLE_DEVICES=all"])
    cfg["annotations"] = unmarked("crio")
    cfg["linux"]["cgroupsPath"] = cgroups_path("crio")
    if shape == "cdi-runtime":
        cfg = nvidia_runtime(cfg, "cdi", list(GPUS), "/bin/true")
    else:
        devs = [*(gpu_dev(i) for i in GPUS), *control_devs()]
        cfg["linux"]["devices"] += devs
        cfg["linux"]["resources"]["devices"] += [allow(d, "rw") for d in devs]
    rep = run(tmp_path, node, cfg, capsys)
    assert rep["verdict"] == "apply"
    assert denied(rep) >= ALL_GPU_KEYS
    assert sorted(rep["nodes"]["remove"]) == sorted(f"/dev/nvidia{g.minor}" for g in GPUS.values())
    assert "(none: no trusted pod identity, so nothing is allocated)" in rep["reason"]
    k = rep["kubernetes"]
    assert (k["checkpoint_state"], k["bounded"]) == ("untrusted", True)
    assert any(w.startswith("no trusted pod identity: ") for w in rep["warnings"])
