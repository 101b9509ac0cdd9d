"""The kubelet device-plugin checkpoint: the one node-local record tying a container to its allocation.

Rule: the checkpoint is authoritative when it names this pod and container, and optional
otherwise. Parsing takes bytes; a corrupt file is reported to the caller, which turns it into a
warning and carries on with the other evidence. ``AllocResp`` is the plugin's own
``ContainerAllocateResponse`` (protobuf); we decode just the fields that name devices.
"""

from __future__ import annotations

import json

from hook.core.errors import InputError
from hook.core.kubelet import Allocation, Kubelet, Pod
from hook.core.protowire import Fields, decode
from hook.core.record import field, record

__all__ = [
    "Allocation",
    "Pod",
    "Kubelet",
    "KNOWN_PATHS",
    "parse_checkpoint",
    "find_allocations",
]

# Where kubelets keep the checkpoint: upstream default (--root-dir /var/lib/kubelet), k3s/rke2's
# agent dir, microk8s' snap dir. ``hook doctor`` looks in each; the hook reads kubelet_checkpoint.
KNOWN_PATHS = (
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
    "/var/lib/rancher/k3s/agent/kubelet/device-plugins/kubelet_internal_checkpoint",
    "/var/lib/rancher/rke2/agent/kubelet/device-plugins/kubelet_internal_checkpoint",
    "/var/snap/microk8s/common/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
)


def _text(msg: Fields, number: int) -> str:
    """A string field as Go's protobuf reads it (the last occurrence wins); strict UTF-8: a
    response that is not is a corrupt checkpoint, not a name to match."""
    values = msg.raws(number)
    return values[-1].decode() if values else ""


@record
class _Resp:
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[tuple[str, str]] = field(default_factory=list)
    cdi: list[str] = field(default_factory=list)
    mounts: list[tuple[str, str]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def _decode_alloc_resp(data: bytes) -> _Resp:
    """``ContainerAllocateResponse``: envs=1 (map), mounts=2 (Mount{container_path, host_path}),
    devices=3 (DeviceSpec{container_path, host_path, permissions}), annotations=4 (map),
    cdi_devices=5 (CDIDevice{name}); kubelet's deviceplugin/v1beta1 api.proto."""
    msg, resp = decode(data), _Resp()
    for entry in msg.messages(1):
        resp.envs[_text(entry, 1)] = _text(entry, 2)
    resp.mounts.extend((_text(m, 1), _text(m, 2)) for m in msg.messages(2))
    resp.devices.extend((_text(d, 1), _text(d, 2)) for d in msg.messages(3))
    for entry in msg.messages(4):
        resp.annotations[_text(entry, 1)] = _text(entry, 2)
    resp.cdi.extend(_text(c, 1) for c in msg.messages(5))
    return resp


def _entry(e: object, source: str, i: int) -> Allocation:
    name = f"Data.PodDeviceEntries[{i}]"
    if not isinstance(e, dict):
        raise InputError(source, name, "expected an object")
    ids = e.get("DeviceIDs") or {}
    if isinstance(ids, list):  # pre-1.20 kubelets wrote a flat list
        ids = {"": ids}
    if not isinstance(ids, dict) or not all(isinstance(v, list) for v in ids.values()):
        raise InputError(source, f"{name}.DeviceIDs", "expected a map of NUMA node to IDs")
    resp = _Resp()
    if e.get("AllocResp"):
        import base64
        import binascii

        try:
            resp = _decode_alloc_resp(base64.b64decode(e["AllocResp"], validate=True))
        except (ValueError, binascii.Error, UnicodeDecodeError, TypeError) as exc:
            raise InputError(source, f"{name}.AllocResp", f"cannot decode ({exc})") from None
    return Allocation(
        pod_uid=str(e.get("PodUID", "")),
        container=str(e.get("ContainerName", "")),
        resource=str(e.get("ResourceName", "")),
        device_ids=tuple(sorted({str(d) for v in ids.values() for d in v})),
        envs=resp.envs,
        device_paths=tuple(resp.devices),
        cdi_devices=tuple(resp.cdi),
        mounts=tuple(resp.mounts),
        annotations=resp.annotations,
    )


def parse_checkpoint(data: bytes, source: str, only: tuple[str, str] | None = None) -> tuple[Allocation, ...]:
    """Every entry, or with ``only=(pod_uid, container)`` just that container's: the hook decodes
    (and so can be failed by) its own container's AllocResp only, not every pod's on the node."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(source, "", f"not valid JSON ({exc})") from None
    data_obj = obj.get("Data") if isinstance(obj, dict) else None
    if data_obj is not None and not isinstance(data_obj, dict):
        raise InputError(source, "Data", "expected an object")
    entries = (data_obj or {}).get("PodDeviceEntries")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise InputError(source, "Data.PodDeviceEntries", "expected a list")
    return tuple(_entry(e, source, i) for i, e in enumerate(entries) if only is None or _is(e, only))


def _is(e: object, ident: tuple[str, str]) -> bool:
    """Whether a raw entry is this container's; a malformed entry is decoded (and reported)."""
    if not isinstance(e, dict):
        return True
    return (str(e.get("PodUID", "")), str(e.get("ContainerName", ""))) == ident


def find_allocations(allocs: tuple[Allocation, ...], pod_uid: str, container: str) -> tuple[Allocation, ...]:
    return tuple(a for a in allocs if a.pod_uid == pod_uid and a.container == container)
