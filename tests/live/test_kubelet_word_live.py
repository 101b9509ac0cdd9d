"""Issue 28 items 1-2 with real runc containers (cgroup v1 and v2): a pod's own CDI annotation, its
sandbox, and a pod with no trusted identity, on the 4x-k8s node with a real protobuf checkpoint.

Each container makes its own copy of every GPU node (``mknod`` inside, where runc's ``c *:* m``
or the narrowing's ``rwm`` deny decides) and opens it, next to the node in its /dev and a copy
planted before start: ENXIO = allowed, EPERM = the device cgroup denies it, ENOENT = no node
(for the inside copy: the cgroup refused the ``mknod`` itself).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundles import alloc_resp, checkpoint
from tests.hosttree import make_host_tree
from tests.k8s_shapes import GPUS, nvidia_runtime, write_cdi
from tests.live.livekit import Bundle, parse_probe, probe_args, run_container
from tests.live.test_k8s_live import GPU_NODES, MINORS, PLANTED, V1V2, gpu2_entry, last_log, opens, pod
from tests.test_kubelet_word import sandbox_annotations
from tests.test_pod_identity import OTHER_ENGINES_KEY, unmarked

UUID2 = GPUS[2].uuid
ALL = {"cdi.k8s.io/x": "nvidia.com/gpu=all"}
MADE = [f"/tmp/m{m}" for m in MINORS]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """The 4x-k8s driver root and its CDI spec (test_k8s_live's node)."""
    root = tmp_path / "driver-root"
    make_host_tree(root, "4x-k8s", mknod=True)
    return {"root": root, "cdi": write_cdi(tmp_path / "cdi"), "tmp": tmp_path}


def probing(b: Bundle) -> Bundle:
    """The container's own ``mknod`` of each GPU node (its verdict printed), then the usual probe."""
    made = "; ".join(
        f'if mknod {p} c 195 {m} 2>/dev/null; then r=OK; else r=EPERM; fi; echo "PROBE mknod{m} $r"'
        for p, m in zip(MADE, MINORS, strict=True)
    )
    probe = probe_args([*GPU_NODES, "/dev/nvidiactl", *PLANTED, *MADE])[2]
    b.config["process"]["args"] = ["/bin/sh", "-c", f"{made}; {probe}"]
    return b.write()


def opened_anywhere(seen: dict[str, str]) -> set[int]:
    return {m for m in MINORS if "ENXIO" in (seen[f"/dev/nvidia{m}"], seen[f"/tmp/g{m}"], seen[f"/tmp/m{m}"])}


def no_gpu(seen: dict[str, str]) -> None:
    """No GPU in /dev, none opens when planted, and none opens when the container makes it."""
    assert opened_anywhere(seen) == set(), seen
    assert {seen[p] for p in GPU_NODES} == {"ENOENT"}, seen
    assert {seen[p] for p in PLANTED} == {"EPERM"}, seen
    assert {seen[p] for p in MADE} <= {"EPERM", "ENOENT"}, seen


@pytest.mark.parametrize("engine", ["containerd", "crio"])
@V1V2
def test_a_pods_own_cdi_annotation_opens_no_gpu(
    bundle_dir: Path, node: dict[str, Path], engine: str, cgroup2: bool
) -> None:
    b = probing(pod(bundle_dir, node, engine=engine, extra_annotations=ALL, ckpt=checkpoint([])))
    res = run_container(b, cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    no_gpu(parse_probe(res.stdout))
    record = last_log(node)
    assert record["verdict"] == "none"
    assert any(w.startswith("annotation cdi.k8s.io/x=nvidia.com/gpu=all ignored") for w in record["warnings"])


@pytest.mark.parametrize("engine", ["containerd", "crio"])
@V1V2
def test_the_pods_sandbox_opens_no_gpu(
    bundle_dir: Path, node: dict[str, Path], engine: str, cgroup2: bool
) -> None:
    b = pod(bundle_dir, node, engine=engine, ckpt=checkpoint([]))
    cid = b.config["linux"]["cgroupsPath"].rsplit("/", 1)[-1].removeprefix("crio-")
    b.config["annotations"] = {**sandbox_annotations(engine, **ALL), **_engine_id(engine, cid)}
    res = run_container(probing(b), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    no_gpu(parse_probe(res.stdout))
    assert last_log(node)["kubernetes"]["checkpoint_state"] == "sandbox"


def _engine_id(engine: str, cid: str) -> dict[str, str]:
    """The engine's own id for this container (its cgroupsPath names it: hook/sources/kubelet/podid.py)."""
    if engine == "containerd":
        return {"io.kubernetes.cri.sandbox-id": cid}
    return {"io.kubernetes.cri-o.ContainerID": cid}


@V1V2
def test_a_privileged_pods_own_annotation_keeps_only_its_allocated_gpu(
    bundle_dir: Path, node: dict[str, Path], cgroup2: bool
) -> None:
    """Privileged (every GPU in linux.devices, allow-all), allocated GPU 2; its annotation names GPU 0."""
    b = _privileged_pod(bundle_dir, node, "containerd", {"cdi.k8s.io/x": "nvidia.com/gpu=0"})
    res = run_container(probing(b), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert opened_anywhere(seen) == {GPUS[2].minor}, seen
    assert opens(seen) == {GPUS[2].minor}, seen


@pytest.mark.parametrize("shape", ["nvidia-cdi", "own-rules"])
@V1V2
def test_no_trusted_identity_is_narrowed_to_nothing(
    bundle_dir: Path, node: dict[str, Path], shape: str, cgroup2: bool
) -> None:
    """A pod's identity keys without CRI-O's own mark, every GPU over-granted."""
    b = pod(bundle_dir, node, engine="crio", cri_env=["NVIDIA_VISIBLE_DEVICES=all"], ckpt=checkpoint([]))
    nvidia_runtime(b.config, "cdi", list(GPUS), "/bin/true")
    if shape == "own-rules":  # a DeviceSpec-like grant: the rules alone, nothing in the env
        b.config["process"]["env"] = [e for e in b.config["process"]["env"] if "VISIBLE" not in e]
    untrusted_opens_no_gpu(b, "crio", node, cgroup2)


def untrusted_opens_no_gpu(b: Bundle, engine: str, node: dict[str, Path], cgroup2: bool) -> None:
    """``b`` with its engine's identity keys but without the engine's own mark, run: no GPU opens,
    and its log line says it was narrowed for want of a trusted identity."""
    cid = b.config["linux"]["cgroupsPath"].rsplit("/", 1)[-1].removeprefix("crio-")
    b.config["annotations"] = unmarked(engine, cid)
    res = run_container(probing(b), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    no_gpu(parse_probe(res.stdout))
    record = last_log(node)
    assert record["verdict"] == "apply" and record["kubernetes"]["checkpoint_state"] == "untrusted"
    assert "no trusted pod identity" in record["reason"]


# --- issue 36 item 2: untrusted is never freer than trusted ------------------------------------------


def _privileged_pod(bundle_dir: Path, node: dict[str, Path], engine: str, extra: dict[str, str]) -> Bundle:
    """Privileged (every GPU in linux.devices, allow-all), allocated GPU 2 by the kubelet."""
    resp = alloc_resp(envs={"NVIDIA_VISIBLE_DEVICES": UUID2})
    b = pod(
        bundle_dir,
        node,
        engine=engine,
        cri_env=[f"NVIDIA_VISIBLE_DEVICES={UUID2}"],
        extra_annotations=extra,
        ckpt=gpu2_entry(resp),
        runtime="cdi",
    )
    b.config["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    return b


@pytest.mark.parametrize("engine", ["containerd", "crio"])
@V1V2
def test_a_privileged_pod_with_an_allocation_keeps_only_it_whatever_the_other_engines_key(
    bundle_dir: Path, node: dict[str, Path], engine: str, cgroup2: bool
) -> None:
    """The issue's escape: one pod annotation naming the other engine's UID made the identity
    "untrusted", and the privileged pod was left alone with every GPU."""
    b = _privileged_pod(bundle_dir, node, engine, OTHER_ENGINES_KEY[engine])
    res = run_container(probing(b), cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    seen = parse_probe(res.stdout)
    assert opened_anywhere(seen) == {GPUS[2].minor}, seen
    assert opens(seen) == {GPUS[2].minor}, seen
    record = last_log(node)
    assert record["verdict"] == "apply" and record["kubernetes"]["checkpoint_state"] == "read"


@pytest.mark.parametrize("engine", ["containerd", "crio"])
@V1V2
def test_a_privileged_container_with_no_trusted_identity_opens_no_gpu(
    bundle_dir: Path, node: dict[str, Path], engine: str, cgroup2: bool
) -> None:
    """Identity keys without the engine's own marks: a pod the kubelet allocated nothing, never a
    privileged container left alone (the checkpoint's GPU 2 for this very pod is not consulted)."""
    untrusted_opens_no_gpu(_privileged_pod(bundle_dir, node, engine, {}), engine, node, cgroup2)
