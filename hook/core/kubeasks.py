"""The kubelet's word on a Kubernetes container's requests: what its checkpoint allocation and the
pod's DRA claims grant, and which of the container's own asks they vouch for.

Rule: only what the kubelet wrote allocates. A pod can write its own annotations, env and
``/dev/null`` mounts (CRI-O copies every pod annotation into each container; containerd passes
those its ``pod_annotations``/``container_annotations`` allow), so in a Kubernetes container
each of them counts only where the kubelet's allocation to this very container, or a DRA claim
of this pod, carries it. A pod's sandbox (pause) container is allocated nothing, and so is a
container with no trusted pod identity (``hook.sources.kubelet.podid``): both are bounded by an
empty allocation, never left alone.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from hook.core.accel import is_privileged
from hook.core.asks import (
    CHECKPOINT,
    annotation_names,
    from_env,
    from_mounts,
    from_nodes,
    id_request,
    split_ids,
)
from hook.core.kpath import container_path
from hook.core.kubelet import SANDBOX, UNTRUSTED, Allocation, Kubelet
from hook.core.oci import LinuxDevice, OciConfig
from hook.core.record import replace
from hook.core.reqtypes import CAPS_ENV, VISIBLE_ENV, DeviceRequest, Kind, Requests
from hook.core.settings import Settings

__all__ = [
    "DRA",
    "gpu_resource",
    "from_checkpoint",
    "from_dra",
    "dra_claim_of",
    "dra_claim_label",
    "only_injected",
    "kubelet_cdi_names",
    "annotations_vouched",
    "mounts_vouched",
    "env_refusal",
    "sandbox_requests",
]

# a claim's CDI device, from the kubelet's DRA state (hook.sources.kubelet.dra); the contract's spelling
DRA = "dra-claim"
_SANDBOX_WHY = "a pod's sandbox (pause) container is never granted a device"


def _where(kubelet: Kubelet) -> str:
    pod = kubelet.pod
    return f"pod {pod.namespace or '?'}/{pod.name or pod.uid} container {pod.container}"


def gpu_resource(name: str, settings: Settings) -> bool:
    """A device-plugin resource that is a GPU of NVIDIA's env (``gpu_resources``): its device IDs
    are NVIDIA IDs (UUIDs, time-slicing replicas "<uuid>::<n>") and its allocation vouches for
    NVIDIA_VISIBLE_DEVICES; a NIC's or another vendor's entry does neither."""
    return any(fnmatch.fnmatchcase(name, p) for p in settings.gpu_resources)


def _mounted_ids(a: Allocation, root: str) -> list[str]:
    """Device IDs of a volume-mounts allocation: ``/dev/null`` mounted at ``<root>/<id>``."""
    out = []
    for cpath, _host in a.mounts:
        dest = container_path(cpath)
        if dest.startswith(root + "/"):
            out.append(dest[len(root) + 1 :])
    return out


def _allocated_cdi(a: Allocation, settings: Settings) -> list[str]:
    """The CDI names of one allocation: its CDI devices, then its CDI annotations' names."""
    cdi = [*a.cdi_devices]
    for key in sorted(a.annotations):
        if any(key.startswith(p) for p in settings.cdi_annotation_prefixes):
            cdi += [n.strip() for n in a.annotations[key].split(",") if "=" in n]
    return cdi


def from_checkpoint(
    allocs: Sequence[Allocation], config: OciConfig, settings: Settings
) -> list[DeviceRequest]:
    by_path: dict[str, LinuxDevice] = {}
    for d in config.devices:
        by_path.setdefault(d.path, d)  # the first entry at a path is the node runc creates
    root = container_path(settings.volume_mount_root)
    out: list[DeviceRequest] = []
    for a in allocs:
        src = f"{CHECKPOINT}:{a.resource}"
        cdi = _allocated_cdi(a, settings)
        out += [DeviceRequest(source=src, value=n, kind=Kind.CDI, from_plugin=True) for n in cdi]
        # NVIDIA's env names NVIDIA devices only in an NVIDIA GPU's allocation, never a NIC's
        gpu = gpu_resource(a.resource, settings)
        env_ids = split_ids(a.envs.get(VISIBLE_ENV, "")) if gpu else ()
        if env_ids and not env_ids[0].startswith("/"):
            out += [id_request(t, src, True) for t in env_ids]
        elif env_ids:
            out += [id_request(t, src, True) for t in _mounted_ids(a, root)]
        for cpath, hpath in a.device_paths:
            out.append(
                DeviceRequest(
                    source=src,
                    value=hpath or cpath,
                    kind=Kind.NODE,
                    from_plugin=True,
                    node=by_path.get(cpath),
                )
            )
        if not (cdi or env_ids or a.device_paths) and gpu:
            ids = dict.fromkeys(
                d.split("::")[0] for d in a.device_ids
            )  # time-slicing replicas: "<uuid>::<n>"
            out += [id_request(d, src, True) for d in ids]
    return out


def from_dra(kubelet: Kubelet | None, config: OciConfig) -> list[DeviceRequest]:
    """The CDI devices of the pod's DRA claims, for a privileged container only: an unprivileged
    one already has exactly what the engine injected (each node with its own allow rule)."""
    view = kubelet.dra_view if kubelet is not None else None
    if view is None or not view.claims or not is_privileged(config.resource_rules):
        return []
    return [
        DeviceRequest(source=f"{DRA}:{claim.uid}", value=cdi_id, kind=Kind.CDI, from_plugin=True)
        for claim in view.claims
        for device in claim.devices
        for cdi_id in device.cdi_ids
    ]


def dra_claim_of(req: DeviceRequest) -> str:
    """The UID of the claim a DRA request came from; "" for any other request."""
    head, sep, claim = req.source.partition(":")
    return claim if sep and head == DRA else ""


def dra_claim_label(kubelet: Kubelet | None, uid: str) -> str:
    """How a person finds the claim ``uid`` names (``namespace/name (uid)``): the request's source
    carries the UID alone (the interface's ``dra-claim:<claim UID>``)."""
    view = kubelet.dra_view if kubelet is not None else None
    claims = view.claims if view is not None else ()
    return next((c.label for c in claims if c.uid == uid), uid)


def only_injected(
    requests: Requests,
    accelerators: Mapping[DeviceRequest, frozenset[tuple[str, int, int]]],
    injected: frozenset[tuple[str, int, int]],
) -> Requests:
    """The pod's claim devices narrowed to this container's: the DRA state has no container names,
    so a claim device counts for this container when every accelerator node it resolves to was
    injected into it (a MIG device's GPU alone does not single it out; its GI/CI caps do). When
    none was, the container keeps the union of the pod's claims: never wider than the pod's."""
    claim_reqs = [r for r in requests.items if dra_claim_of(r)]
    chosen = {r for r in claim_reqs if accelerators.get(r) and accelerators[r] <= injected}
    if not chosen:
        return requests
    items = tuple(r for r in requests.items if not dra_claim_of(r) or r in chosen)
    return replace(requests, items=items)


def kubelet_cdi_names(kubelet: Kubelet, settings: Settings) -> frozenset[str]:
    """Every CDI name the kubelet's word carries for this container: its checkpoint allocations'
    CDI devices and CDI annotations, and the CDI devices of the pod's DRA claims."""
    names: set[str] = set()
    for a in kubelet.allocations:
        names.update(_allocated_cdi(a, settings))
        prefixed = (
            v for k, v in a.annotations.items() if k.startswith(tuple(settings.cdi_annotation_prefixes))
        )
        names.update(n for value in prefixed for n in value.split(","))  # also as written, untrimmed
    view = kubelet.dra_view
    if view is not None:
        names.update(cdi for claim in view.claims for device in claim.devices for cdi in device.cdi_ids)
    return frozenset(names)


def _annotation_refusal(kubelet: Kubelet) -> str:
    if kubelet.state == SANDBOX:
        return _SANDBOX_WHY
    if kubelet.state == UNTRUSTED:
        return f"no trusted pod identity ({kubelet.problem}): nothing is allocated"
    if kubelet.known:
        said = f"neither the kubelet's allocation to {_where(kubelet)} ({kubelet.checkpoint})"
    else:
        said = f"the kubelet's checkpoint {kubelet.checkpoint} is {kubelet.state}, and neither it"
    return f"{said} nor a DRA claim of the pod names it; any pod can write a CDI annotation"


def annotations_vouched(
    names: Sequence[tuple[str, str]],
    kubelet: Kubelet,
    settings: Settings,
    warnings: list[str],
    ignored: list[str],
) -> list[tuple[str, str]]:
    """A Kubernetes container's CDI annotation names that the kubelet's word carries; every other
    one is ignored, with a warning per key (its names unparsed: a name no one vouches for can
    fail nothing)."""
    word = kubelet_cdi_names(kubelet, settings)
    kept: list[tuple[str, str]] = []
    refused: dict[str, list[str]] = {}
    for key, name in names:
        if name in word:
            kept.append((key, name))
        else:
            refused.setdefault(key, []).append(name)
    for key, values in refused.items():
        warnings.append(f"annotation {key}={','.join(values)} ignored: {_annotation_refusal(kubelet)}")
        ignored.append(f"annotation {key}")
    return kept


def mounts_vouched(
    mounts: list[DeviceRequest], kubelet: Kubelet, bounded: bool, warnings: list[str], ignored: list[str]
) -> list[DeviceRequest]:
    """A Kubernetes container's ``/dev/null`` volume-mount requests, under ``env_requests: auto``.

    Any pod allowed a ``hostPath: /dev/null`` volume can write such a mount, so where the
    kubelet's checkpoint answers (``bounded``) one counts only when this container's allocation
    carries that very mount, as the env needs the allocation. Where it cannot answer (absent,
    unreadable, corrupt, or DRA claims it does not list) they count as before, and a warning says so.
    """
    if kubelet.state == UNTRUSTED:  # nothing can vouch for a pod that has no trusted identity
        for m in mounts:
            dest = m.source.removeprefix("mount:")
            warnings.append(f"{dest}: /dev/null volume mount ignored: no trusted pod identity")
            ignored.append(f"mount {dest}")
        return []
    where = _where(kubelet)
    if not bounded:
        state = "does not list the pod's DRA claims" if kubelet.known else f"is {kubelet.state}"
        names = ", ".join(m.source.removeprefix("mount:") for m in mounts)
        warnings.append(
            f"{names}: /dev/null volume mount(s) of {where} counted without the kubelet's word: "
            f"its checkpoint {kubelet.checkpoint} {state}"
        )
        return mounts
    carried = {container_path(c) for a in kubelet.allocations for c, _host in a.mounts if c}
    kept = []
    for m in mounts:
        dest = m.source.removeprefix("mount:")
        if dest in carried:
            kept.append(m)
            continue
        warnings.append(
            f"{dest}: /dev/null volume mount ignored: the kubelet's allocation to {where} "
            f"({kubelet.checkpoint}) carries no such mount; any pod allowed a hostPath /dev/null "
            "volume can write one"
        )
        ignored.append(f"mount {dest}")
    return kept


def env_refusal(kubelet: Kubelet, corroboration: str, value: str) -> str:
    """Why a Kubernetes container's visible-devices env is no request ('' when it counts)."""
    if kubelet.state == UNTRUSTED:  # a pod's own word is all there is: nothing vouches, not even siblings
        return f"{VISIBLE_ENV}={value} ignored: no trusted pod identity ({kubelet.problem})"
    where = _where(kubelet)
    if corroboration:  # plugin-only siblings (HAMi, MPS, gpustack) vouch, as outside Kubernetes
        return ""
    if kubelet.known:
        return (
            f"{VISIBLE_ENV}={value} ignored: the kubelet allocated no GPU to {where} "
            f"({kubelet.checkpoint}) and nothing a plugin sets corroborates it; an image's env is no request"
        )
    return (
        f"{VISIBLE_ENV}={value} ignored: the kubelet's checkpoint {kubelet.checkpoint} is {kubelet.state} "
        f"and nothing a plugin sets corroborates the env of {where} "
        "(setting kubelet_checkpoint; hook doctor finds the file)"
    )


def sandbox_requests(
    config: OciConfig, annotations: Mapping[str, str], settings: Settings, kubelet: Kubelet
) -> Requests:
    """A pod's sandbox (pause) container: no request, whatever it carries (the pod's annotations
    reach it too); each ask is named in a warning, and any accelerator it was given is an
    over-grant (``bounded``)."""
    asks = [
        f"annotation {key}"
        for key in dict.fromkeys(
            k for k, _ in annotation_names(annotations, settings.cdi_annotation_prefixes)
        )
    ]
    if from_env(config, settings, ""):
        asks.append(f"{VISIBLE_ENV}={config.env.get(VISIBLE_ENV, 'all (legacy CUDA image)')}")
    asks += [
        f"mount {m.source.removeprefix('mount:')}"
        for m in from_mounts(config, container_path(settings.volume_mount_root))
    ]
    asks += [f"linux.devices {r.value}" for r in from_nodes(config, settings.accelerator_nodes)]
    return Requests(
        items=(),
        evidence=(),
        warnings=tuple(f"{ask} ignored: {_SANDBOX_WHY}" for ask in asks),
        driver_capabilities=config.env.get(CAPS_ENV, ""),
        kubelet=kubelet,
        bounded=True,
        ignored_env=tuple(asks),
    )
