"""Regenerate the bundled examples: the seed 000 node (8 x H100, MIG on card 0) and its bundles.

Run from the repo root: ``python3 examples/generate.py``. The node is written as an inventory
snapshot and NVIDIA-style CDI specs (explicit major/minor, so simulation needs no device nodes);
each bundle's config.json has the shape its engine writes (research/device-plugins.md §5).
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hook.sources.nvidia.inventory import dumps, load
from tests.hosttree import CAPS_MAJOR, UVM_MAJOR, cap_minor, make_host_tree
from tests.nvidia.fake_pynvml import FakeNvml

HERE = Path(__file__).resolve().parent
NODE = HERE / "node"
SLICE_UUID = "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"
MIG_UUID = "MIG-07ad8e7c-0197-5973-bd05-7fcd18ae754e"  # 3g.40gb, GPU 0 GI 1 CI 0
POD_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
]
ALL_CAPS = sorted(
    [*POD_CAPS, "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_RAWIO", "CAP_IPC_LOCK"]
)
DEFAULT_RULES = [
    {"allow": False, "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
    {"allow": True, "type": "c", "major": 5, "minor": 0, "access": "rwm"},
]


def node(path: str, major: int, minor: int, mode: int = 0o666) -> dict[str, object]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": mode, "uid": 0, "gid": 0}


def gpu_nodes() -> list[dict[str, object]]:
    return [node(f"/dev/nvidia{i}", 195, i) for i in range(8)]


def control() -> list[dict[str, object]]:
    return [
        node("/dev/nvidiactl", 195, 255),
        node("/dev/nvidia-uvm", UVM_MAJOR, 0),
        node("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]


def cap_nodes() -> list[dict[str, object]]:
    minors = [1, 2] + [cap_minor(0, gi, ci) for gi in (1, 2) for ci in (None, 0)]
    return [
        node(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m, 0o400 if m == 1 else 0o444) for m in minors
    ]


def cdi_spec() -> dict[str, object]:
    def dev(name: str, nodes: list[dict[str, object]]) -> dict[str, object]:
        return {
            "name": name,
            "containerEdits": {
                "deviceNodes": [
                    {"path": n["path"], "type": "c", "major": n["major"], "minor": n["minor"]} for n in nodes
                ]
            },
        }

    devices = []
    for i in range(8):
        uuid = ["GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34", SLICE_UUID][i] if i < 2 else None
        devices.append(dev(str(i), [gpu_nodes()[i]]))
        if uuid:
            devices.append(dev(uuid, [gpu_nodes()[i]]))
    migs = {"0:0": (1, MIG_UUID), "0:1": (2, "MIG-90825510-8f47-5052-8e15-ead851500769")}
    for name, (gi, uuid) in migs.items():
        caps = [
            node(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m)
            for m in (cap_minor(0, gi), cap_minor(0, gi, 0))
        ]
        devices += [dev(name, [gpu_nodes()[0], *caps]), dev(uuid, [gpu_nodes()[0], *caps])]
    devices.append(dev("all", gpu_nodes() + [n for n in cap_nodes() if n["minor"] > 2]))
    ctl = [{"path": n["path"], "type": "c", "major": n["major"], "minor": n["minor"]} for n in control()]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": ctl},
    }


def config(
    env: list[str],
    *,
    privileged: bool,
    caps: list[str],
    devices: list[dict[str, object]],
    rules: list[dict[str, object]],
    annotations: dict[str, str] | None = None,
    mounts: list[dict[str, object]] | None = None,
    cgroups_path: str = "",
) -> dict[str, object]:
    linux: dict[str, object] = {"cgroupsPath": cgroups_path} if cgroups_path else {}
    return {
        "ociVersion": "1.1.0",
        "process": {
            "args": ["sh"],
            "cwd": "/",
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *env],
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *(mounts or [])],
        "annotations": {"io.kubernetes.cri.container-type": "container", **(annotations or {})},
        "linux": {
            **linux,
            "devices": devices,
            "resources": {"devices": rules},
            "namespaces": [{"type": "pid"}, {"type": "mount"}],
        },
    }


def host_devices() -> list[dict[str, object]]:
    return [node("/dev/null", 1, 3), node("/dev/fuse", 10, 229), *gpu_nodes(), *control(), *cap_nodes()]


def bundles() -> dict[str, dict[str, object]]:
    allow_all = [{"allow": True, "access": "rwm"}]
    specific = [
        {"allow": True, "type": "c", "major": n["major"], "minor": n["minor"], "access": "rwm"}
        for n in gpu_nodes() + control() + cap_nodes()[2:]
    ]
    return {
        "slice-privileged": config(
            [
                f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}",
                "CUDA_DEVICE_MEMORY_LIMIT_0=40779m",
                "CUDA_DEVICE_SM_LIMIT=50",
            ],
            privileged=True,
            caps=ALL_CAPS,
            devices=host_devices(),
            rules=allow_all,
        ),
        "mig-privileged": config(
            [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID}"],
            privileged=True,
            caps=ALL_CAPS,
            devices=host_devices(),
            rules=allow_all,
            annotations={f"cdi.k8s.io/nvidia-device-plugin_{MIG_UUID[4:]}": f"nvidia.com/gpu={MIG_UUID}"},
        ),
        "device-plugin-seed001": config(
            [
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                "MIG_STRATEGY=mixed",
                "NVIDIA_MIG_MONITOR_DEVICES=all",
            ],
            privileged=False,
            caps=sorted([*POD_CAPS, "CAP_SYS_ADMIN"]),
            devices=gpu_nodes() + control() + cap_nodes()[2:],
            rules=DEFAULT_RULES + specific,
        ),
        "cpu": config([], privileged=False, caps=POD_CAPS, devices=[], rules=DEFAULT_RULES),
        "privileged-no-allocation": config(
            [], privileged=True, caps=ALL_CAPS, devices=host_devices(), rules=allow_all
        ),
    }


GPU2_UUID = "GPU-5c7e1d92-0b4a-4f3e-a6d8-91c2b7e4f058"  # host index 2, /dev/nvidia2
CUDA_IMAGE_ENV = [
    "NVIDIA_VISIBLE_DEVICES=all",  # baked into CUDA base images
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "CUDA_VERSION=12.4.1",
]
K8S_POD = {  # containerd's CRI annotations for pod ml/train-0, container cuda
    "io.kubernetes.cri.sandbox-id": "5f0c" * 16,
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.sandbox-name": "train-0",
    "io.kubernetes.cri.sandbox-uid": "0b7e5d2c-4a91-4f3e-8c6d-1e2f3a4b5c6d",
    "io.kubernetes.cri.container-name": "cuda",
}
# containerd's cgroupsPath for that container under the systemd driver (what tells containerd
# from CRI-O: a pod cannot write it; hook/sources/kubelet/podid.py)
K8S_CGROUPS_PATH = (
    "kubepods-besteffort-pod0b7e5d2c_4a91_4f3e_8c6d_1e2f3a4b5c6d.slice:cri-containerd:" + "7e1a" * 16
)


def k8s_bundles() -> dict[str, dict[str, object]]:
    """The Kubernetes pair: the same CUDA image in a pod that asked for no GPU, and in one the
    device plugin allocated GPU 2 to (volume-mounts strategy: the plugin's env after the image's)."""
    root = "/var/run/nvidia-container-devices"
    mount = {
        "destination": f"{root}/{GPU2_UUID}",
        "type": "bind",
        "source": "/dev/null",
        "options": ["rbind", "ro"],
    }
    return {
        "k8s-image-env": config(
            CUDA_IMAGE_ENV,
            privileged=False,
            caps=POD_CAPS,
            devices=[],
            rules=DEFAULT_RULES,
            annotations=K8S_POD,
            cgroups_path=K8S_CGROUPS_PATH,
        ),
        "k8s-allocated": config(
            [*CUDA_IMAGE_ENV, f"NVIDIA_VISIBLE_DEVICES={root}"],
            privileged=False,
            caps=POD_CAPS,
            devices=[],
            rules=DEFAULT_RULES,
            annotations=K8S_POD,
            mounts=[mount],
            cgroups_path=K8S_CGROUPS_PATH,
        ),
    }


def _pb(number: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (the lengths here are all under 128)."""
    return bytes([number << 3 | 2, len(data)]) + data


def _mount_entry(pod_uid: str, container: str, uuid: str) -> dict[str, object]:
    """A checkpoint entry for one GPU through the volume-mounts strategy: the AllocateResponse
    (deviceplugin v1beta1) holds one Mount{container_path=1, host_path=2, read_only=3}."""
    mount = _pb(1, f"/var/run/nvidia-container-devices/{uuid}".encode()) + _pb(2, b"/dev/null") + b"\x18\x01"
    return {"PodUID": pod_uid, "ContainerName": container, "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [uuid]}, "AllocResp": base64.b64encode(_pb(2, mount)).decode()}  # fmt: skip


def k8s_checkpoints() -> dict[str, bytes]:
    """Each Kubernetes example's kubelet device-plugin checkpoint, as the kubelet writes it, so the
    examples do not depend on the simulating machine's /var/lib/kubelet (hook --kubelet-checkpoint):
    k8s-image-env's lists another pod's GPU 3 and nothing of pod ml/train-0; k8s-allocated's lists
    GPU 2 for its container cuda with the plugin's /dev/null mount."""
    other = _mount_entry("8e1f0a3b-2c4d-4e5f-9a6b-7c8d9e0f1a2b", "other", "GPU-3")
    mine = _mount_entry(K8S_POD["io.kubernetes.cri.sandbox-uid"], "cuda", GPU2_UUID)

    def encode(entries: list[dict[str, object]]) -> bytes:
        data = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()

    return {"k8s-image-env": encode([other]), "k8s-allocated": encode([other, mine])}


DRA_CLAIM_UID = "9d2f4c1a-6b3e-4e8f-a0c7-5d1b2e3f4a6b"
DRA_POD = {  # containerd's CRI annotations for pod ml/infer-0 (its claim: GPU 2), container server
    "io.kubernetes.cri.sandbox-id": "3a9c" * 16,
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.sandbox-name": "infer-0",
    "io.kubernetes.cri.sandbox-uid": "4c8e2a6d-1f3b-4d5c-9e7a-0b2c4d6e8f1a",
    "io.kubernetes.cri.container-name": "server",
}


DRA_CGROUPS_PATH = "kubepods-pod4c8e2a6d_1f3b_4d5c_9e7a_0b2c4d6e8f1a.slice:cri-containerd:" + "6d0b" * 16


def dra_claim_spec() -> dict[str, object]:
    """NVIDIA's DRA driver's per-claim spec (k8s.gpu.nvidia.com-claim_<uid>.yaml) for GPU 2; the
    nodes name their numbers so simulation needs no device nodes (nvcdi writes the path only)."""
    ctl = [{"path": n["path"], "type": "c", "major": n["major"], "minor": n["minor"]} for n in control()]
    return {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [
            {
                "name": f"{DRA_CLAIM_UID}-gpu-2",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2}]
                },
            }
        ],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": ctl},
    }


def dra_state() -> str:
    """The kubelet's 1.31+ DRA checkpoint: claim ml/gpu-claim of pod infer-0, CRC-32 of its Data."""
    import zlib

    entry = {
        "ClaimUID": DRA_CLAIM_UID,
        "ClaimName": "gpu-claim",
        "Namespace": "ml",
        "PodUIDs": {DRA_POD["io.kubernetes.cri.sandbox-uid"]: {}},
        "DriverState": {
            "gpu.nvidia.com": {
                "Devices": [
                    {
                        "PoolName": "node-a",
                        "DeviceName": "gpu-2",
                        "RequestNames": ["gpu"],
                        "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={DRA_CLAIM_UID}-gpu-2"],
                    }
                ]
            }
        },
    }
    data = json.dumps(
        {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", "Entries": [entry]},
        separators=(",", ":"),
    )
    return json.dumps({"Data": data, "Checksum": zlib.crc32(data.encode()) & 0xFFFFFFFF}) + "\n"


def dra_bundles() -> dict[str, dict[str, object]]:
    """A privileged pod whose GPU 2 came from a DRA claim: containerd gave it every host node and
    one allow-all rule, then injected the claim's CDI devices (moved last, an allow rule each)."""
    injected = [node("/dev/nvidia2", 195, 2), *control()]
    paths = {n["path"] for n in injected}
    rules = [{"allow": True, "access": "rwm"}]
    rules += [
        {"allow": True, "type": "c", "major": n["major"], "minor": n["minor"], "access": "rwm"}
        for n in injected
    ]
    return {
        "dra-claim-privileged": config(
            ["NVIDIA_VISIBLE_DEVICES=void"],
            privileged=True,
            caps=ALL_CAPS,
            devices=[n for n in host_devices() if n["path"] not in paths] + injected,
            rules=rules,
            annotations=DRA_POD,
            cgroups_path=DRA_CGROUPS_PATH,
        )
    }


def write(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = make_host_tree(Path(tmp), "8x-mig", mknod=False)
        inv = load(Path(tmp), None, None, True, nvml_module=FakeNvml(spec))
    NODE.mkdir(parents=True, exist_ok=True)
    (NODE / "inventory.json").write_text(dumps(inv))
    write(NODE / "cdi" / "nvidia.json", cdi_spec())
    for name, cfg in {**bundles(), **k8s_bundles(), **dra_bundles()}.items():
        write(HERE / name / "config.json", cfg)
        (HERE / name / "rootfs").mkdir(exist_ok=True)
        (HERE / name / "rootfs" / ".keep").touch()
    for name, data in k8s_checkpoints().items():  # the kubelet root of each pod's node (README)
        plugins = HERE / name / "kubelet" / "device-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        (plugins / "kubelet_internal_checkpoint").write_bytes(data)
    dra = HERE / "dra-claim-privileged"
    write(dra / "cdi" / f"k8s.gpu.nvidia.com-claim_{DRA_CLAIM_UID}.yaml", dra_claim_spec())
    (dra / "kubelet").mkdir(exist_ok=True)
    (dra / "kubelet" / "dra_manager_state").write_text(dra_state())


if __name__ == "__main__":
    main()
