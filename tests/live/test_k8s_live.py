"""Issue 12 with real runc containers: Kubernetes-shaped bundles, a real protobuf checkpoint file,
and the 4x-k8s node (NVML index 2 is /dev/nvidia3), on cgroup v1 and v2.

Each container probes every GPU node (ENXIO = allowed and present, ENOENT = not in its /dev)
and a planted copy of each under /tmp (EPERM = the device cgroup denies it), so "opens GPU 2
only" means: /dev/nvidia3 opens, no other GPU node exists, and no other GPU opens even when
re-created.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.bundles import alloc_resp, checkpoint, checkpoint_entry
from tests.hosttree import make_host_tree
from tests.k8s_shapes import (
    CONTAINER,
    GPUS,
    IMAGE_ENV,
    MOUNT_ROOT,
    POD_UID,
    annotations,
    cgroups_path,
    env,
    null_mount,
    nvidia_runtime,
    write_cdi,
)
from tests.live.livekit import build_bundle, hook, parse_probe, probe_args, run_container
from tests.live.test_hook_scenarios import CAPS, plant

MINORS = sorted(g.minor for g in GPUS.values())
GPU_NODES = [f"/dev/nvidia{m}" for m in MINORS]
PLANTED = [f"/tmp/g{m}" for m in MINORS]
UUID2 = GPUS[2].uuid  # NVML index 2: /dev/nvidia3
V1V2 = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "driver-root"
    make_host_tree(root, "4x-k8s", mknod=True)
    return {"root": root, "cdi": write_cdi(tmp_path / "cdi"), "tmp": tmp_path}


def settings(node: dict[str, Path], ckpt: bytes | None) -> Path:
    tmp = node["tmp"]
    path = tmp / "kubelet_internal_checkpoint"
    if ckpt is not None:
        path.write_bytes(ckpt)
    doc = {
        "log_file": str(tmp / "hook.log"),
        "cache_dir": str(tmp / "cache"),
        "kubelet_checkpoint": str(path),
    }
    out = tmp / "settings.yaml"
    out.write_text(json.dumps(doc))
    return out


def pod(
    bundle_dir: Path,
    node: dict[str, Path],
    *,
    engine: str = "containerd",
    namespace: str = "ml",
    k8s: bool = True,
    cri_env: Sequence[str] = (),
    mounts: Sequence[dict[str, Any]] = (),
    extra_annotations: dict[str, str] | None = None,
    ckpt: bytes | None = None,
    runtime: str = "",
) -> Any:
    """An unprivileged pod container running the CUDA-style image (env ``all``) with the real hook."""
    args = [sys.executable, "-I", "-m", "hook", "prestart", "--driver-root", str(node["root"])]
    args += ["--config", str(settings(node, ckpt)), "--cdi-spec-dir", str(node["cdi"])]
    # the engine's 64-hex container id, in cgroupsPath (hook/sources/kubelet/podid.py)
    cid = uuid.uuid4().hex * 2
    ann = annotations(engine, namespace, cid=cid) if k8s else {}
    b = build_bundle(
        bundle_dir,
        probe_args([*GPU_NODES, "/dev/nvidiactl", *PLANTED]),
        hooks={"prestart": [hook(sys.executable, args)]},
        env=env(engine, ["PATH=/bin", *IMAGE_ENV[1:]], list(cri_env)),
        annotations={**ann, **(extra_annotations or {})},
    )
    b.config["process"]["capabilities"] = {k: CAPS for k in ("bounding", "effective", "permitted")}
    b.config["linux"]["cgroupsPath"] = cgroups_path(engine, cid, parent="/odh-live")
    b.config["mounts"] += list(mounts)
    if runtime:
        nvidia_runtime(b.config, runtime, list(GPUS), "/bin/true")
    plant(b.rootfs, [(p, 195, m) for p, m in zip(PLANTED, MINORS, strict=True)])
    return b.write()


def opens(seen: dict[str, str]) -> set[int]:
    """Minors the container can open: present in /dev and allowed by its cgroup."""
    return {m for m in MINORS if seen[f"/dev/nvidia{m}"] == "ENXIO" and seen[f"/tmp/g{m}"] == "ENXIO"}


def only(seen: dict[str, str], minor: int) -> None:
    """Exactly one GPU: its node opens; every other is absent from /dev and denied when re-created."""
    assert opens(seen) == {minor}, seen
    for m in MINORS:
        if m != minor:
            assert (seen[f"/dev/nvidia{m}"], seen[f"/tmp/g{m}"]) == ("ENOENT", "EPERM"), (m, seen)
    assert seen["/dev/nvidiactl"] == "ENXIO"


def gpu2_entry(resp: bytes) -> bytes:
    return checkpoint(
        [checkpoint_entry("nvidia.com/gpu", [UUID2], resp, pod_uid=POD_UID, container=CONTAINER)]
    )


def last_log(node: dict[str, Path]) -> dict[str, Any]:
    return json.loads((node["tmp"] / "hook.log").read_text().splitlines()[-1])


@V1V2
def test_dcgm_style_pod_in_trusted_namespace_sees_every_gpu(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    other = checkpoint_entry("nvidia.com/gpu", [UUID2], alloc_resp(), pod_uid="another-pod", container="x")
    b = pod(
        bundle_dir,
        node,
        engine="crio",
        namespace="gpu-operator",
        cri_env=["NVIDIA_VISIBLE_DEVICES=all"],
        ckpt=checkpoint([other]),
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert opens(parse_probe(res.stdout)) == set(MINORS)


@V1V2
def test_image_env_all_in_a_pod_without_allocation_starts_with_no_gpu(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    b = pod(bundle_dir, node, ckpt=checkpoint([]))
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert {seen[p] for p in GPU_NODES} == {"ENOENT"}
    assert {seen[p] for p in PLANTED} == {"EPERM"}
    record = last_log(node)  # the log says which env was ignored and why
    assert record["verdict"] == "none"
    assert record["warnings"][0].startswith("NVIDIA_VISIBLE_DEVICES=all ignored: the kubelet allocated no")


@pytest.mark.parametrize(
    ("strategy", "engine"),
    [("envvar", "containerd"), ("volume-mounts", "containerd"), ("cdi-annotations", "crio")],
)
@V1V2
def test_pod_allocated_gpu2_opens_gpu2_only(
    bundle_dir: Path, node: dict[str, Path], strategy: str, engine: str, cgroup2: bool
) -> None:
    mounts: list[dict[str, Any]] = []
    ann: dict[str, str] = {}
    if strategy == "envvar":
        resp, cri = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2}), [f"NVIDIA_VISIBLE_DEVICES={UUID2}"]
    elif strategy == "volume-mounts":
        dest = f"{MOUNT_ROOT}/{UUID2}"
        resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}, mounts=[(dest, "/dev/null")])
        cri, mounts = [f"NVIDIA_VISIBLE_DEVICES={MOUNT_ROOT}"], [null_mount(dest)]
    else:
        ann = {f"cdi.k8s.io/nvidia-device-plugin_{UUID2}": f"nvidia.com/gpu={UUID2}"}
        resp, cri = alloc_resp(annotations=ann), []
    b = pod(
        bundle_dir,
        node,
        engine=engine,
        cri_env=cri,
        mounts=mounts,
        extra_annotations=ann,
        ckpt=gpu2_entry(resp),
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    only(parse_probe(res.stdout), GPUS[2].minor)


@pytest.mark.parametrize("absent", [False, True], ids=["checkpoint-without-it", "checkpoint-absent"])
@V1V2
def test_hami_style_env_slice_with_corroboration_gets_its_card_only(
    bundle_dir: Path, node: dict[str, Path], absent: bool, cgroup2: bool
) -> None:
    """HAMi's env (its card's UUID and the plugin-only memory/SM limits): the siblings vouch."""
    cri = [
        f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}",
        "CUDA_DEVICE_MEMORY_LIMIT_0=20000m",
        "CUDA_DEVICE_SM_LIMIT=30",
    ]
    ckpt = None if absent else checkpoint([])
    res = run_container(pod(bundle_dir, node, cri_env=cri, ckpt=ckpt), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    only(parse_probe(res.stdout), GPUS[1].minor)
    assert last_log(node)["kubernetes"]["checkpoint_state"] == ("absent" if absent else "read")


@pytest.mark.parametrize("mode", ["cdi", "legacy"])
@V1V2
def test_nvidia_runtime_bundle_with_every_gpu_is_narrowed_to_the_allocation(
    bundle_dir: Path, node: dict[str, Path], mode: str, cgroup2: bool
) -> None:
    """NVIDIA's shim honoured the image's ``all``: every GPU in linux.devices with an allow rule.
    The kubelet allocated GPU 2 (env strategy): the rest are removed and denied (rw: runc's
    ``c *:* m`` stays on v1)."""
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    b = pod(
        bundle_dir, node, cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"], ckpt=gpu2_entry(resp), runtime=mode
    )
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    only(parse_probe(res.stdout), GPUS[2].minor)
    record = last_log(node)
    assert record["verdict"] == "apply" and record["container"]["widened"] is True


@pytest.mark.parametrize("runtime", ["", "legacy", "cdi"], ids=["plain", "nvidia-legacy", "nvidia-cdi"])
@V1V2
def test_same_bundle_outside_kubernetes_keeps_the_env_request(
    bundle_dir: Path, node: dict[str, Path], runtime: str, cgroup2: bool
) -> None:
    """``podman run`` / plain runc: no pod identity, so the image's ``all`` is honoured."""
    b = pod(bundle_dir, node, k8s=False, runtime=runtime)
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert opens(parse_probe(res.stdout)) == set(MINORS)


@V1V2
def test_wildcard_allow_beyond_the_allocation_is_never_left_widened(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    """``c 195:* rwm`` (a --device-cgroup-rule) for a pod allocated GPU 2: eBPF narrows it (a later
    exact deny wins); v1 cannot carve an exact deny out of a wildcard exception, so the hook
    refuses the container with one line instead of starting it widened."""
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    b = pod(bundle_dir, node, cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"], ckpt=gpu2_entry(resp))
    b.config["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": 195, "access": "rwm"}
    )
    res = run_container(b.write(), cgroup2=cgroup2)
    if cgroup2:
        assert res.rc == 0, res.stderr
        only(parse_probe(res.stdout), GPUS[2].minor)
    else:
        assert res.rc != 0 and "PROBE" not in res.stdout
        assert "rules without effect after writing: deny c 195:" in res.stderr
