"""The kubelet device-plugin checkpoint: the one node-local record tying a container to its allocation.

Rule: the checkpoint is authoritative when it names this pod and container, and optional
otherwise. Parsing takes bytes; a corrupt file is reported to the caller, which turns it into a
warning and carries on with the other evidence. ``AllocResp`` is the plugin's own
``ContainerAllocateResponse`` (protobuf); we decode just the fields that name devices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hook.errors import InputError
from hook.record import record

__all__ = ["Allocation", "parse_checkpoint", "find_allocations", "pod_identity"]

# Annotations that carry the pod UID and the container name (containerd, then CRI-O/kubelet).
POD_UID_KEYS = ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid")
CONTAINER_NAME_KEYS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")


@record
class Allocation:
    """One resource's allocation to one container, as the plugin answered it."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    device_paths: tuple[tuple[str, str], ...]  # (container path, host path)
    cdi_devices: tuple[str, ...]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, bytes]]:
    """Length-delimited fields of one protobuf message; other wire types are skipped."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            out.append((number, buf[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _text(sub: bytes, number: int) -> str:
    return next((v.decode() for n, v in _fields(sub) if n == number), "")


def _decode_alloc_resp(data: bytes) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    envs: dict[str, str] = {}
    devices: list[tuple[str, str]] = []
    cdi: list[str] = []
    for number, sub in _fields(data):
        if number == 1:  # map<string,string> envs
            envs[_text(sub, 1)] = _text(sub, 2)
        elif number == 3:  # DeviceSpec{container_path, host_path, permissions}
            devices.append((_text(sub, 1), _text(sub, 2)))
        elif number == 5:  # CDIDevice{name}
            cdi.append(_text(sub, 1))
    return envs, devices, cdi


def _entry(e: object, source: str, i: int) -> Allocation:
    name = f"Data.PodDeviceEntries[{i}]"
    if not isinstance(e, dict):
        raise InputError(source, name, "expected an object")
    ids = e.get("DeviceIDs") or {}
    if isinstance(ids, list):  # pre-1.20 kubelets wrote a flat list
        ids = {"": ids}
    if not isinstance(ids, dict) or not all(isinstance(v, list) for v in ids.values()):
        raise InputError(source, f"{name}.DeviceIDs", "expected a map of NUMA node to IDs")
    envs: dict[str, str] = {}
    devices: list[tuple[str, str]] = []
    cdi: list[str] = []
    if e.get("AllocResp"):
        import base64
        import binascii

        try:
            envs, devices, cdi = _decode_alloc_resp(base64.b64decode(e["AllocResp"], validate=True))
        except (ValueError, binascii.Error, UnicodeDecodeError, TypeError) as exc:
            raise InputError(source, f"{name}.AllocResp", f"cannot decode ({exc})") from None
    return Allocation(
        pod_uid=str(e.get("PodUID", "")),
        container=str(e.get("ContainerName", "")),
        resource=str(e.get("ResourceName", "")),
        device_ids=tuple(sorted({str(d) for v in ids.values() for d in v})),
        envs=envs,
        device_paths=tuple(devices),
        cdi_devices=tuple(cdi),
    )


def parse_checkpoint(data: bytes, source: str) -> tuple[Allocation, ...]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(source, "", f"not valid JSON ({exc})") from None
    entries = obj.get("Data", {}).get("PodDeviceEntries") if isinstance(obj, dict) else None
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise InputError(source, "Data.PodDeviceEntries", "expected a list")
    return tuple(_entry(e, source, i) for i, e in enumerate(entries))


def pod_identity(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    uid = next((annotations[k] for k in POD_UID_KEYS if annotations.get(k)), "")
    name = next((annotations[k] for k in CONTAINER_NAME_KEYS if annotations.get(k)), "")
    return (uid, name) if uid and name else None


def find_allocations(allocs: tuple[Allocation, ...], pod_uid: str, container: str) -> tuple[Allocation, ...]:
    return tuple(a for a in allocs if a.pod_uid == pod_uid and a.container == container)
