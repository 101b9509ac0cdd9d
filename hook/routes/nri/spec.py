"""The container NRI describes, as the OCI config every route decides on.

Rule: pure. NRI hands over the runtime's own view of the container (its spec's annotations, env,
mounts, device nodes, device-cgroup rules and ``cgroupsPath``) and, apart, the pod's uid, name and
namespace. The config built here is what ``hook.routes.gather`` reads on every route, with one
difference: the pod identity keys of the engine that ``linux.cgroupsPath`` names are written from
NRI's own pod and container fields (the runtime's word, which no pod annotation can change), and
only when that cgroup path names this container's id. Any other shape is left as the runtime
sent it, and ``hook.sources.kubelet.podid`` judges it as it judges every config.

CDI devices the runtime lists (NRI's ``CDI_devices``: what the kubelet put in the CRI request)
are already injected into the spec NRI shows; they become one CDI annotation request, weighed
like any other: a socket the daemon cannot authenticate cannot vouch for anything, so only the
kubelet's own files count an allocation.
"""

from __future__ import annotations

from typing import Any

from hook.routes.nri.messages import Container, Pod
from hook.sources.kubelet.podid import (
    CONTAINER_TYPE,
    CONTAINERD,
    CONTAINERD_SANDBOX_ID,
    CRIO,
    CRIO_CONTAINER_ID,
    KEYS,
    cgroup_engine,
)

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from hook.core.oci import LinuxDevice, OciConfig
    from hook.routes.nri.messages import Device

__all__ = ["CDI_KEY", "MAX_PARSED", "SYS_ADMIN", "names_container", "oci_config", "parsed_config"]

CDI_KEY = "nri-cdi-devices"  # below the first CDI annotation prefix
SYS_ADMIN = "CAP_SYS_ADMIN"
MAX_PARSED = 4096  # devices whose parse is kept (a 64 GPU + 224 MIG node's privileged container: ~520)
_parsed: dict[int, tuple[Device, LinuxDevice]] = {}  # by the id of the decoded device it holds


def names_container(cgroups_path: str, container_id: str) -> bool:
    """``linux.cgroupsPath`` ends in this container's id, as every engine that speaks NRI writes it
    (``<parent>/<id>``, ``crio-<id>``, ``slice:prefix:<id>``, ``<parent>/crio-<id>.scope``)."""
    if not container_id or not cgroups_path:
        return False
    parts = cgroups_path.split(":")
    systemd = len(parts) == 3 and not cgroups_path.startswith("/")
    last = parts[2] if systemd else cgroups_path.rstrip("/").rsplit("/", 1)[-1]
    return last in (container_id, f"crio-{container_id}", f"crio-{container_id}.scope")


def _annotations(pod: Pod, c: Container) -> dict[str, str]:
    out = dict(c.annotations)
    engine, cid = cgroup_engine(c.cgroups_path)
    if not engine or cid != c.id:
        return out
    uid_key, name_key, ns_key, pod_key = KEYS[engine]
    out.update({uid_key: pod.uid, name_key: c.name, ns_key: pod.namespace, pod_key: pod.name})
    if engine == CONTAINERD:
        out[CONTAINERD_SANDBOX_ID] = pod.id or c.pod_sandbox_id
    elif engine == CRIO:
        out[CRIO_CONTAINER_ID] = cid
    out[CONTAINER_TYPE[engine]] = "container"  # NRI's CreateContainer is never a pod's sandbox
    return out


def oci_config(pod: Pod, c: Container, bounding: frozenset[str], cdi_prefix: str) -> dict[str, Any]:
    """The config ``parse_config_object`` reads, from NRI's pod and container."""
    annotations = _annotations(pod, c)
    if c.cdi_devices:
        annotations[cdi_prefix + CDI_KEY] = ",".join(c.cdi_devices)
    devices = []
    for d in c.devices:
        dev: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
        for key, value in (("fileMode", d.file_mode), ("uid", d.uid), ("gid", d.gid)):
            if value is not None:
                dev[key] = value
        devices.append(dev)
    rules = []
    for r in c.rules:
        rule: dict[str, Any] = {"allow": r.allow, "type": r.type, "access": r.access}
        if r.major is not None:
            rule["major"] = r.major
        if r.minor is not None:
            rule["minor"] = r.minor
        rules.append(rule)
    return {
        "ociVersion": "1.0.2",
        "process": {"args": list(c.args), "env": list(c.env), "capabilities": {"bounding": sorted(bounding)}},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": m.destination, "type": m.type, "source": m.source, "options": list(m.options)}
            for m in c.mounts
        ],
        "annotations": annotations,
        "linux": {"cgroupsPath": c.cgroups_path, "devices": devices, "resources": {"devices": rules}},
    }


def parsed_config(doc: dict[str, Any], c: Container, source: str) -> OciConfig:
    """``parse_config_object`` of ``oci_config``'s ``doc`` for ``c``, each of NRI's devices parsed
    once per process: a decoded device is one value per distinct message bytes
    (``hook.routes.nri.messages``), and what ``hook.core.oci`` parsed it to the first time is
    what it parses to every time. Any device not seen parsed so is parsed with the whole config,
    as every route parses it (the same errors, each naming its ``linux.devices`` index)."""
    from hook.core.oci import parse_config_object
    from hook.core.record import replace

    held = [_parsed.get(id(d)) for d in c.devices]
    kept = [h[1] for h, d in zip(held, c.devices, strict=True) if h is not None and h[0] is d]
    if len(kept) == len(c.devices):
        bare = parse_config_object({**doc, "linux": {**doc["linux"], "devices": []}}, source, "")
        return replace(bare, devices=tuple(kept), raw=doc)
    config = parse_config_object(doc, source, "")
    if len(_parsed) + len(c.devices) > MAX_PARSED:
        _parsed.clear()
    for d, parsed in zip(c.devices, config.devices, strict=True):
        _parsed[id(d)] = (d, parsed)  # the device is held: its id names no other while kept
    return config
