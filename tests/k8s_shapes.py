"""Kubernetes-shaped OCI configs, as containerd's CRI plugin and CRI-O write them, and as NVIDIA's
runtime leaves them in CDI and legacy mode; the ``4x-k8s`` node (index != minor) and its CDI spec.

Shapes restated from research/device-plugins.md §5.3-5.5 (containerd: ``io.kubernetes.cri.*``
annotations, image env then the CRI env appended so a key can repeat and the last one wins;
CRI-O: ``io.kubernetes.pod.*`` / ``.container.*`` annotations, the CRI env replacing an image
key in place) and from the issue's description of NVIDIA's runtime (every GPU of an ``all`` env
in ``linux.devices``; in CDI mode with an allow rule each and ``NVIDIA_VISIBLE_DEVICES=void``
appended by the spec's container edits; in legacy mode with its prestart hook).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.hosttree import TOPOLOGIES, UVM_MAJOR

NODE = TOPOLOGIES["4x-k8s"]
GPUS = {g.index: g for g in NODE.gpus}  # by NVML index; GPUS[2].minor == 3
POD_UID = "0b7e5d2c-4a91-4f3e-8c6d-1e2f3a4b5c6d"
CONTAINER = "cuda"
CONTAINER_ID = "9d3e" * 16  # the engine's id for the container: 64 hex, in its cgroupsPath
IMAGE_ENV = [
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "CUDA_VERSION=12.4.1",
]
MOUNT_ROOT = "/var/run/nvidia-container-devices"


def gpu_path(index: int) -> str:
    return f"/dev/nvidia{GPUS[index].minor}"


def dev(path: str, major: int, minor: int, mode: int = 0o666) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": mode, "uid": 0, "gid": 0}


def gpu_dev(index: int) -> dict[str, Any]:
    return dev(gpu_path(index), 195, GPUS[index].minor)


def control_devs() -> list[dict[str, Any]]:
    return [dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia-uvm", UVM_MAJOR, 0)]


def allow(d: dict[str, Any], access: str = "rwm") -> dict[str, Any]:
    return {"allow": True, "type": "c", "major": d["major"], "minor": d["minor"], "access": access}


POD_CGROUP = f"/kubepods/besteffort/pod{POD_UID}"


def cgroups_path(engine: str, cid: str = CONTAINER_ID, parent: str = POD_CGROUP) -> str:
    """``linux.cgroupsPath`` as each engine writes it with the cgroupfs driver: containerd
    ``<parent>/<id>``, CRI-O ``<parent>/crio-<id>`` (what tells the engines apart:
    hook/sources/kubelet/podid.py)."""
    if engine == "containerd":
        return f"{parent}/{cid}"
    if engine == "crio":
        return f"{parent}/crio-{cid}"
    raise ValueError(engine)


def annotations(
    engine: str, namespace: str = "ml", pod: str = "train-0", cid: str = CONTAINER_ID, **extra: str
) -> dict[str, str]:
    """The pod identity each engine writes (containerd: io.kubernetes.cri.*; CRI-O: kubelet keys
    and its own io.kubernetes.cri-o.*, ``cid`` matching ``cgroups_path``)."""
    if engine == "containerd":
        base = {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "5f0c" * 16,
            "io.kubernetes.cri.sandbox-namespace": namespace,
            "io.kubernetes.cri.sandbox-name": pod,
            "io.kubernetes.cri.sandbox-uid": POD_UID,
            "io.kubernetes.cri.container-name": CONTAINER,
            "io.kubernetes.cri.image-name": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        }
    elif engine == "crio":
        base = {
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.name": pod,
            "io.kubernetes.pod.uid": POD_UID,
            "io.kubernetes.container.name": CONTAINER,
            "io.kubernetes.cri-o.ContainerType": "container",
            "io.kubernetes.cri-o.ContainerID": cid,
            "io.kubernetes.cri-o.Labels": json.dumps({"io.kubernetes.pod.namespace": namespace}),
        }
    else:
        raise ValueError(engine)
    return {**base, **extra}


def env(engine: str, image: Sequence[str], cri: Sequence[str]) -> list[str]:
    """The process env: containerd appends the CRI env (plugin env, then the pod spec's) after the
    image's, so a key can appear twice; CRI-O replaces an image key in place. Last one wins in both."""
    if engine == "containerd":
        return [*image, *cri]
    out = list(image)
    for item in cri:
        key = item.split("=", 1)[0] + "="
        at = next((i for i, e in enumerate(out) if e.startswith(key)), None)
        if at is None:
            out.append(item)
        else:
            out[at] = item
    return out


def null_mount(dest: str) -> dict[str, Any]:
    return {"destination": dest, "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]}


def nvidia_runtime(cfg: dict[str, Any], mode: str, indices: Sequence[int], hook_path: str) -> dict[str, Any]:
    """What NVIDIA's runtime shim does to a config whose env asked for ``indices``: every one of
    those GPUs and the control nodes go into linux.devices with an allow rule; CDI mode appends the
    spec's ``NVIDIA_VISIBLE_DEVICES=void``, legacy mode its prestart hook."""
    added = [gpu_dev(i) for i in indices] + control_devs()
    linux = cfg["linux"]
    linux["devices"] = [*linux.get("devices", []), *added]
    linux["resources"]["devices"] = [*linux["resources"]["devices"], *(allow(d) for d in added)]
    if mode == "cdi":
        cfg["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=void")
    elif mode == "legacy":
        hook = {"path": hook_path, "args": ["nvidia-container-runtime-hook", "prestart"], "env": []}
        cfg.setdefault("hooks", {}).setdefault("prestart", []).insert(0, hook)
    else:
        raise ValueError(mode)
    return cfg


def cdi_spec() -> dict[str, Any]:
    """An NVIDIA-style spec of the 4x-k8s node: each GPU by index and by UUID, and ``all``."""

    def node(index: int) -> dict[str, Any]:
        return {"path": gpu_path(index), "type": "c", "major": 195, "minor": GPUS[index].minor}

    devices: list[dict[str, Any]] = []
    for i, g in GPUS.items():
        devices += [
            {"name": str(i), "containerEdits": {"deviceNodes": [node(i)]}},
            {"name": g.uuid, "containerEdits": {"deviceNodes": [node(i)]}},
        ]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(i) for i in GPUS]}})
    ctl = [{k: d[k] for k in ("path", "type", "major", "minor")} for d in control_devs()]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": ctl},
    }


def write_cdi(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia.json").write_text(json.dumps(cdi_spec()))
    return directory
