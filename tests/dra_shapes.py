"""DRA on the node, in the public formats: the kubelet's ``dra_manager_state``, NVIDIA's DRA
driver's per-claim CDI specs, and config.json as containerd and CRI-O write a privileged pod whose
claim devices the engine injected through CDI (no annotation names them).

Facts restated from research/dra-and-nri.md: the 1.31+ checkpoint is ``{"Data": <JSON text>,
"Checksum": CRC-32 IEEE of Data}`` (kubernetes pkg/kubelet/cm/dra/state, checkpointer_test.go;
the verbatim examples are in tests/fixtures/dra/); NVIDIA's driver (gpu.nvidia.com) writes
``/var/run/cdi/k8s.gpu.nvidia.com-claim_<claimUID>.yaml`` of kind ``k8s.gpu.nvidia.com/claim``,
devices ``<claimUID>-gpu-<minor>`` and ``<claimUID>-gpu-<parent>-mig-<profile>-<start>-<size>``,
nodes by ``path`` only (nvcdi), MIG devices with their GI/CI ``nvidia-caps`` nodes, the common
edits (control nodes, ``NVIDIA_VISIBLE_DEVICES=void``) folded in. A privileged container:
containerd ``WithHostDevices`` + ``WithAllDevicesAllowed`` (every host node, one allow-all rule),
CRI-O the same reset; then CDI injection moves each injected node to the end of
``linux.devices`` and appends its own allow rule after the allow-all.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.hosttree import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, cap_minor

FIXTURES = Path(__file__).parent / "fixtures" / "dra"
DRIVER = "gpu.nvidia.com"
KIND = "k8s.gpu.nvidia.com/claim"
ALLOW_ALL = {"allow": True, "access": "rwm"}
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
PLAIN = [("/dev/null", 1, 3), ("/dev/zero", 1, 5), ("/dev/fuse", 10, 229)]


def device(cdi_ids: Sequence[str], name: str = "gpu-0", requests: Sequence[str] = ("gpu",)) -> dict[str, Any]:
    return {
        "PoolName": "node-a",
        "DeviceName": name,
        "RequestNames": list(requests),
        "CDIDeviceIDs": list(cdi_ids),
    }


def claim(
    uid: str, name: str, pod_uids: Sequence[str], devices: Sequence[dict[str, Any]], ns: str = "ml"
) -> dict[str, Any]:
    return {
        "ClaimUID": uid,
        "ClaimName": name,
        "Namespace": ns,
        "PodUIDs": {p: {} for p in pod_uids},
        "DriverState": {DRIVER: {"Devices": list(devices)}},
    }


def dra_state(claims: Sequence[dict[str, Any]], key: str = "Entries", checksum: int | None = None) -> bytes:
    """The kubelet's 1.31+ checkpoint with a true CRC-32 of its Data (or the given checksum)."""
    data = json.dumps(
        {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", key: list(claims)},
        separators=(",", ":"),
    )
    crc = zlib.crc32(data.encode()) & 0xFFFFFFFF
    return json.dumps({"Data": data, "Checksum": crc if checksum is None else checksum}).encode()


def legacy_state(claims: Sequence[dict[str, Any]]) -> bytes:
    """The 1.27-1.30 format: ``CDIDevices`` per driver, a Go-specific checksum (opaque here)."""
    entries = [
        {
            "DriverName": DRIVER,
            "ClassName": "gpu.nvidia.com",
            "ClaimUID": c["ClaimUID"],
            "ClaimName": c["ClaimName"],
            "Namespace": c["Namespace"],
            "PodUIDs": c["PodUIDs"],
            "ResourceHandles": [{"driverName": DRIVER, "data": "{}"}],
            "CDIDevices": {
                DRIVER: [i for d in c["DriverState"][DRIVER]["Devices"] for i in d["CDIDeviceIDs"]]
            },
        }
        for c in claims
    ]
    return json.dumps({"version": "v1", "entries": entries, "checksum": 123456789}).encode()


def gpu_id(claim_uid: str, minor: int) -> str:
    return f"{KIND}={claim_uid}-gpu-{minor}"


def mig_name(parent: int, gi: int) -> str:
    """NVIDIA's canonical MIG name; profile/placement numbers are shaped, GI picks them apart."""
    return f"gpu-{parent}-mig-{9 if gi == 1 else 14}-{4 if gi == 1 else 0}-{4 if gi == 1 else 2}"


def mig_id(claim_uid: str, parent: int, gi: int) -> str:
    return f"{KIND}={claim_uid}-{mig_name(parent, gi)}"


def claim_spec(
    claim_uid: str, gpus: Sequence[int] = (), migs: Sequence[tuple[int, int, int]] = ()
) -> dict[str, Any]:
    """NVIDIA's per-claim spec: one device per GPU (its node) and per MIG device (its parent GPU and
    its own GI and CI caps, ``migs`` as (parent minor, gi, ci)); nodes by path only, as nvcdi writes."""
    devices = [
        {"name": f"{claim_uid}-gpu-{m}", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{m}"}]}}
        for m in gpus
    ]
    for parent, gi, ci in migs:
        caps = [cap_minor(parent, gi), cap_minor(parent, gi, ci)]
        nodes = [{"path": f"/dev/nvidia{parent}"}] + [
            {"path": f"/dev/nvidia-caps/nvidia-cap{c}"} for c in caps
        ]
        devices.append(
            {"name": f"{claim_uid}-{mig_name(parent, gi)}", "containerEdits": {"deviceNodes": nodes}}
        )
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": p} for p in CONTROL],
        },
    }


def write_claim_spec(cdi_dir: Path, claim_uid: str, **kw: Any) -> Path:
    """``k8s.gpu.nvidia.com-claim_<uid>.yaml`` (JSON is YAML; the CDI registry reads either)."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / f"k8s.gpu.nvidia.com-claim_{claim_uid}.yaml"
    path.write_text(json.dumps(claim_spec(claim_uid, **kw), indent=1))
    return path


def _dev(path: str, major: int, minor: int, mode: int = 0o666) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": mode, "uid": 0, "gid": 0}


def host_devices(gpu_minors: Sequence[int], caps: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Every device node of the host, as ``WithHostDevices`` (and CRI-O's privileged mode) list them."""
    out = [_dev(p, ma, mi) for p, ma, mi in PLAIN]
    out += [_dev(f"/dev/nvidia{m}", NVIDIA_MAJOR, m) for m in gpu_minors]
    out += [_dev("/dev/nvidiactl", NVIDIA_MAJOR, 255), _dev("/dev/nvidia-modeset", NVIDIA_MAJOR, 254)]
    out += [_dev("/dev/nvidia-uvm", UVM_MAJOR, 0), _dev("/dev/nvidia-uvm-tools", UVM_MAJOR, 1)]
    out += [_dev(f"/dev/nvidia-caps/nvidia-cap{c}", CAPS_MAJOR, c, 0o444) for c in caps]
    return out


def inject(linux: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> None:
    """CDI ``ContainerEdits.Apply`` on a privileged config: each node removed by path and appended,
    with its own allow rule after the allow-all (containerd ``WithCDI``, CRI-O ``SpecInjectCDIDevices``)."""
    for node in nodes:
        linux["devices"] = [d for d in linux["devices"] if d["path"] != node["path"]] + [node]
        rule = {"allow": True, "type": "c", "major": node["major"], "minor": node["minor"], "access": "rwm"}
        linux["resources"]["devices"].append(rule)


def injected_nodes(
    gpus: Sequence[int] = (), migs: Sequence[tuple[int, int, int]] = ()
) -> list[dict[str, Any]]:
    """The nodes one claim's CDI devices add (with the common control nodes), in spec order."""
    out = [_dev(f"/dev/nvidia{m}", NVIDIA_MAJOR, m) for m in gpus]
    for parent, gi, ci in migs:
        out.append(_dev(f"/dev/nvidia{parent}", NVIDIA_MAJOR, parent))
        out += [
            _dev(f"/dev/nvidia-caps/nvidia-cap{c}", CAPS_MAJOR, c, 0o444)
            for c in (cap_minor(parent, gi), cap_minor(parent, gi, ci))
        ]
    out += [
        _dev("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        _dev("/dev/nvidia-uvm", UVM_MAJOR, 0),
        _dev("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]
    return out


def privileged_linux(gpu_minors: Sequence[int], caps: Sequence[int] = ()) -> dict[str, Any]:
    """``linux`` of a privileged pod container before CDI injection: every host node, one allow-all."""
    return {
        "devices": host_devices(gpu_minors, caps),
        "resources": {"devices": [dict(ALLOW_ALL)]},
        "namespaces": [{"type": "pid"}, {"type": "mount"}],
    }
