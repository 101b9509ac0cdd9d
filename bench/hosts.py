"""Large fake hosts for the scaling rows: N GPUs, MIG instances on some of them.

Rule: the tree is written by ``tests.hosttree.make_host_tree`` (the one fake-driver writer), from
a ``HostSpec`` built here and registered under its own name; only the shape is new. The driver's
mig-minors file covers 32 GPUs, so MIG instances live on GPUs 0-31; GPU minors stop at 253
(254 and 255 are nvidia-modeset and nvidiactl), so a "256-GPU" host cannot exist with one major
and the big row uses every regular minor there is (254 GPUs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import hosttree
from tests.hosttree import CAPS_MAJOR, UVM_MAJOR, GpuSpec, HostSpec, MigSpec, cap_minor

__all__ = ["SHAPES", "build", "slice_devices"]

MAX_REGULAR_MINOR = 253

# name -> (GPUs, GPUs with MIG on, MIG instances per such GPU)
SHAPES: dict[str, tuple[int, int, int]] = {
    "8x7-mig": (8, 8, 7),
    "64+224-mig": (64, 32, 7),
    "254-gpus": (MAX_REGULAR_MINOR + 1, 0, 0),
    "16-gpus": (16, 0, 0),
    "64-gpus": (64, 0, 0),
}


def _uuid(kind: str, *parts: int) -> str:
    tail = "".join(f"{p:04x}" for p in parts).rjust(12, "0")[-12:]
    return f"{kind}-5eed{parts[0]:04x}-0000-4000-8000-{tail}"


def spec(name: str) -> HostSpec:
    gpus, mig_gpus, per_gpu = SHAPES[name]
    if gpus > MAX_REGULAR_MINOR + 1 or mig_gpus > 32 or per_gpu > 7:
        raise ValueError(f"{name}: not a shape a driver can show")
    gpu_specs = tuple(
        GpuSpec(
            index=i,
            minor=i,
            bus=f"0000:{i:02x}:00.0" if i < 256 else f"0001:{i - 256:02x}:00.0",
            uuid=_uuid("GPU", i),
            mig_enabled=i < mig_gpus,
        )
        for i in range(gpus)
    )
    migs = tuple(
        MigSpec(parent_minor=g, gi=gi, ci=0, uuid=_uuid("MIG", g, gi), profile="1g.10gb")
        for g in range(mig_gpus)
        for gi in range(1, per_gpu + 1)
    )
    return HostSpec(name=f"bench-{name}", gpus=gpu_specs, migs=migs)


def build(root: Path, name: str) -> HostSpec:
    """Write the shape's driver tree (real char nodes: root only) under ``root``."""
    s = spec(name)
    hosttree.TOPOLOGIES[s.name] = s
    try:
        return hosttree.make_host_tree(root, s.name, mknod=True)
    finally:
        del hosttree.TOPOLOGIES[s.name]


def _dev(path: str, major: int, minor: int) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0}


def slice_devices(s: HostSpec) -> list[dict[str, Any]]:
    """Every accelerator node of the host, as a privileged device plugin passes them in."""
    devs = [_dev("/dev/null", 1, 3)]
    devs += [_dev(f"/dev/nvidia{g.minor}", 195, g.minor) for g in s.gpus]
    devs += [_dev("/dev/nvidiactl", 195, 255), _dev("/dev/nvidia-uvm", UVM_MAJOR, 0)]
    devs.append(_dev("/dev/nvidia-uvm-tools", UVM_MAJOR, 1))
    minors = {1, 2} | {cap_minor(m.parent_minor, m.gi) for m in s.migs}
    minors |= {cap_minor(m.parent_minor, m.gi, m.ci) for m in s.migs}
    devs += [_dev(f"/dev/nvidia-caps/nvidia-cap{n}", CAPS_MAJOR, n) for n in sorted(minors)]
    return devs


def slice_config(base: dict[str, Any], s: HostSpec) -> dict[str, Any]:
    """``base`` (the seed 000 slice pod) on host ``s``: all its nodes, the slice of GPU 1."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    config["linux"]["devices"] = slice_devices(s)
    env = [e for e in config["process"]["env"] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    config["process"]["env"] = [*env, f"NVIDIA_VISIBLE_DEVICES={s.gpus[1].uuid}"]
    return config
