"""Device requests: what a container asked for, where the ask came from, and whether a plugin made it.

Rule: NVIDIA's precedence (nvidia-container-toolkit ``cmd/nvidia-container-runtime-hook/
container_config.go``, ``getDevices``: the volume-mount list first, then the env; CDI annotations
ahead of both in its CDI modifier) decides which channel *grants*
devices: CDI annotations, else the volume-mount list, else the visible-devices env. The kubelet
checkpoint and specifically-allowed nodes always count. ``from_plugin`` is evidence, not trust:
a visible-devices env counts as a plugin's only when something a pod cannot forge corroborates it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from hook.core.errors import InputError
from hook.core.kpath import container_path, host_source
from hook.core.kubelet import Allocation, Kubelet
from hook.core.oci import LinuxDevice, OciConfig
from hook.core.record import record, replace
from hook.core.rules import Access, DeviceType, Rule
from hook.core.settings import EnvRequests, Settings

__all__ = [
    "Kind",
    "DeviceRequest",
    "Requests",
    "collect",
    "is_privileged",
    "has_sys_admin",
    "is_accelerator",
    "split_ids",
    "is_legacy_image",
    "gpu_resource",
    "injected_keys",
    "only_injected",
    "dra_claim_label",
    "dra_claim_of",
]

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"
CAPS_ENV = "NVIDIA_DRIVER_CAPABILITIES"
MIG_ENVS = {"NVIDIA_MIG_CONFIG_DEVICES": "mig-config", "NVIDIA_MIG_MONITOR_DEVICES": "mig-monitor"}
CHECKPOINT = "kubelet-checkpoint"
# a claim's CDI device, from the kubelet's DRA state (hook.sources.kubelet.dra); the contract's spelling
DRA = "dra-claim"


class Kind(StrEnum):
    CDI = "cdi"  # a qualified CDI name
    NVIDIA = "nvidia"  # an NVIDIA device ID (index, UUID, G:M, bus id, "all")
    NODE = "node"  # a device node already in linux.devices (or a plugin DeviceSpec path)
    NO_GPU = "none"  # NVIDIA_VISIBLE_DEVICES=none: control nodes, no GPU
    MIG_CONFIG = "mig-config"
    MIG_MONITOR = "mig-monitor"
    IMEX = "imex"


@record
class DeviceRequest:
    source: str
    value: str
    kind: Kind
    from_plugin: bool
    node: LinuxDevice | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "value": self.value,
            "kind": str(self.kind),
            "from_plugin": self.from_plugin,
        }


@record
class Requests:
    items: tuple[DeviceRequest, ...]
    evidence: tuple[str, ...]
    warnings: tuple[str, ...]
    driver_capabilities: str
    kubelet: Kubelet | None = None  # None outside Kubernetes
    # The kubelet's allocation is known and bounds this container's accelerators: any other
    # accelerator it was given (privileged mode, a shim that honoured an image env, --device)
    # is an over-grant, even when the allocation is empty.
    bounded: bool = False
    ignored_env: tuple[str, ...] = ()  # "NAME=value" of envs that were no request, for the reason
    legacy_image: bool = False  # a legacy CUDA image with NVIDIA_DRIVER_CAPABILITIES unset: every capability

    @property
    def from_plugin(self) -> bool:
        return any(r.from_plugin for r in self.items)


def is_privileged(rules: Sequence[Rule]) -> bool:
    """The engine's privileged mode: an allow-all rule (containerd ``WithAllDevicesAllowed``, CRI-O);
    ``a`` with numbers allows everything too, as runc applies it (``oci.parse_rule``)."""
    return any(
        r.allow
        and r.type is DeviceType.ALL
        and Access.R | Access.W in r.access
        for r in rules
    )


def has_sys_admin(config: OciConfig) -> bool:
    return "CAP_SYS_ADMIN" in config.bounding


_MATCHERS: dict[tuple[str, ...], re.Pattern[str]] = {}
_LAST: list[tuple[Mapping[str, tuple[str, ...]], dict[str, tuple[str, ...]], re.Pattern[str]]] = []


def _matcher(patterns: Mapping[str, tuple[str, ...]]) -> re.Pattern[str]:
    """All vendors' globs as one compiled regex (one compile per process, not one per glob).

    Called once per node, so the mapping last asked about is remembered with a copy of its
    contents: the same, unchanged mapping is answered by one dict comparison.
    """
    if _LAST and _LAST[0][0] is patterns and _LAST[0][1] == patterns:
        return _LAST[0][2]
    key = tuple(p for pats in patterns.values() for p in pats)
    if key not in _MATCHERS:
        _MATCHERS[key] = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in key) or "(?!)")
    _LAST[:] = [(patterns, dict(patterns), _MATCHERS[key])]
    return _MATCHERS[key]


_SEEN: dict[tuple[re.Pattern[str], str], bool] = {}


def is_accelerator(path: str, patterns: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether ``path`` is a /dev node one of the globs names; remembered per (globs, path),
    since one start asks it several times for every node of the container and the host."""
    matcher = _matcher(patterns)
    known = _SEEN.get((matcher, path))
    if known is not None:
        return known
    clean = container_path(path)  # //dev/x and dev/x are /dev/x to runc and the kernel (hook.core.kpath)
    found = clean.startswith("/dev/") and matcher.match(clean[len("/dev/") :]) is not None
    if len(_SEEN) < 65536:
        _SEEN[(matcher, path)] = found
    return found


def split_ids(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


def _id_request(token: str, source: str, from_plugin: bool) -> DeviceRequest:
    kind = Kind.CDI if "=" in token and "/" in token else Kind.NVIDIA
    return DeviceRequest(source=source, value=token, kind=kind, from_plugin=from_plugin)


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


def _from_checkpoint(
    allocs: Sequence[Allocation], config: OciConfig, settings: Settings
) -> list[DeviceRequest]:
    by_path: dict[str, LinuxDevice] = {}
    for d in config.devices:
        by_path.setdefault(d.path, d)  # the first entry at a path is the node runc creates
    root = container_path(settings.volume_mount_root)
    out: list[DeviceRequest] = []
    for a in allocs:
        src = f"{CHECKPOINT}:{a.resource}"
        cdi = [*a.cdi_devices]
        for key in sorted(a.annotations):
            if any(key.startswith(p) for p in settings.cdi_annotation_prefixes):
                cdi += [n.strip() for n in a.annotations[key].split(",") if "=" in n]
        out += [DeviceRequest(source=src, value=n, kind=Kind.CDI, from_plugin=True) for n in cdi]
        # NVIDIA's env names NVIDIA devices only in an NVIDIA GPU's allocation, never a NIC's
        gpu = gpu_resource(a.resource, settings)
        env_ids = split_ids(a.envs.get(VISIBLE_ENV, "")) if gpu else ()
        if env_ids and not env_ids[0].startswith("/"):
            out += [_id_request(t, src, True) for t in env_ids]
        elif env_ids:
            out += [_id_request(t, src, True) for t in _mounted_ids(a, root)]
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
            out += [_id_request(d, src, True) for d in ids]
    return out


def _from_dra(kubelet: Kubelet | None, config: OciConfig) -> list[DeviceRequest]:
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


def injected_keys(rules: Sequence[Rule]) -> frozenset[tuple[str, int, int]]:
    """Exact allow rules after the (last) allow-all: in a privileged container the engine resets
    the rules to one allow-all, and CDI injection (containerd ``WithCDI``, CRI-O
    ``SpecInjectCDIDevices``) then appends one allow rule per injected node, so these are the
    devices injected into this very container (the CDI library's ``InjectDevices``, which both call,
    adds one allow rule per device node)."""
    last = max((i for i, r in enumerate(rules) if is_privileged((r,))), default=None)
    if last is None:
        return frozenset()
    return frozenset(
        (str(r.type), r.major, r.minor)
        for r in rules[last + 1 :]
        if r.allow and r.major is not None and r.minor is not None
    )


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


def _from_annotations(annotations: Mapping[str, str], prefixes: Sequence[str]) -> list[DeviceRequest]:
    out = []
    for key in sorted(annotations):
        if not any(key.startswith(p) for p in prefixes):
            continue
        from hook.core.cdinames import parse_qualified_name  # pure, and only for CDI annotations

        for name in annotations[key].split(","):  # never trimmed: the reference refuses " v/c=d"
            try:
                parse_qualified_name(name)
            except InputError as exc:
                raise InputError("annotations", key, f"{name!r}: {exc.reason}") from None
            out.append(DeviceRequest(source=f"annotation:{key}", value=name, kind=Kind.CDI, from_plugin=True))
    return out


def _from_mounts(config: OciConfig, root: str) -> list[DeviceRequest]:
    out, seen = [], set()
    for m in config.mounts:
        dest = container_path(m.destination)
        if (
            host_source(m.source or "/", config.bundle) != "/dev/null"
            or not dest.startswith(root + "/")
            or dest in seen
        ):
            continue
        seen.add(dest)
        ident = dest[len(root) :].strip("/")
        src = f"mount:{dest}"
        if ident.startswith("cdi/"):
            parts = ident[4:].split("/")
            name = "/".join(parts) if "=" in parts[-1] else "/".join(parts[:2]) + "=" + "/".join(parts[2:])
            out.append(DeviceRequest(source=src, value=name, kind=Kind.CDI, from_plugin=True))
        elif ident.startswith("imex/"):
            out.append(DeviceRequest(source=src, value=ident[5:], kind=Kind.IMEX, from_plugin=True))
        else:
            out.append(_id_request(ident, src, True))
    return out


def _from_nodes(config: OciConfig, patterns: Mapping[str, tuple[str, ...]]) -> list[DeviceRequest]:
    """Accelerator nodes with their own exact allow rule: DeviceSpecs or CDI nodes an engine added."""
    specific = {(r.type, r.major, r.minor) for r in config.resource_rules if r.allow and r.minor is not None}
    return [
        DeviceRequest(source="linux.devices", value=d.path, kind=Kind.NODE, from_plugin=True, node=d)
        for d in config.devices
        if is_accelerator(d.path, patterns) and (DeviceType(d.type), d.major, d.minor) in specific
    ]


def _corroborated(config: OciConfig, settings: Settings, gpu_allocated: bool) -> str:
    if gpu_allocated:
        return CHECKPOINT
    if config.env.get(VISIBLE_ENV, "") == settings.volume_mount_root:
        return f"env:{VISIBLE_ENV}={settings.volume_mount_root}"
    for name in config.env_order:
        if any(fnmatch.fnmatchcase(name, p) for p in settings.corroborating_env):
            return f"env:{name}"
    return ""


def is_legacy_image(env: Mapping[str, str]) -> bool:
    """NVIDIA's legacy CUDA image: ``CUDA_VERSION`` set and no ``NVIDIA_REQUIRE_CUDA`` (cuda_image.go)."""
    return "CUDA_VERSION" in env and "NVIDIA_REQUIRE_CUDA" not in env


def _from_env(config: OciConfig, settings: Settings, corroboration: str) -> list[DeviceRequest]:
    value = config.env.get(VISIBLE_ENV)
    if value is None and is_legacy_image(config.env):
        value = "all"  # a legacy CUDA image asks for every GPU: an ordinary env request from here on
    tokens = split_ids(value or "")  # empty items are skipped, as libnvidia-container does
    if value is None or not tokens or "void" in tokens or value == settings.volume_mount_root:
        return []
    src = f"env:{VISIBLE_ENV}"
    special = next((t.lower() for t in tokens if t.lower() in ("all", "none")), None)
    if special == "none":  # the first special value wins: "none,all" is none, "all,none" is all
        return [DeviceRequest(source=src, value="none", kind=Kind.NO_GPU, from_plugin=bool(corroboration))]
    if special == "all":
        tokens = ("all",)
    return [_id_request(t, src, bool(corroboration)) for t in tokens]


def _imex_from_env(config: OciConfig, corroboration: str) -> list[DeviceRequest]:
    """``NVIDIA_IMEX_CHANNELS`` (the device plugin's env strategy): channel ids; ``all`` grants none."""
    tokens = split_ids(config.env.get(IMEX_ENV, ""))
    if not tokens or any(t.lower() in ("all", "none", "void") for t in tokens):
        return []
    src = f"env:{IMEX_ENV}"
    plugin = bool(corroboration)
    return [DeviceRequest(source=src, value=t, kind=Kind.IMEX, from_plugin=plugin) for t in tokens]


def _mig_management(
    config: OciConfig, vouched: Mapping[str, str] | None, warnings: list[str], ignored: list[str]
) -> list[DeviceRequest]:
    """MIG management envs; with ``vouched`` (a Kubernetes container under ``env_requests: auto``)
    only those the kubelet's GPU allocation carries with the same value count."""
    out = []
    for env, kind in MIG_ENVS.items():
        value = config.env.get(env, "").strip()
        tokens = split_ids(value)  # empty items are skipped, as libnvidia-container does: ",all" is all
        if not tokens:
            continue
        if vouched is not None and vouched.get(env, "").strip() != value:
            warnings.append(f"{env}={value} ignored: {_NOT_VOUCHED}")
            ignored.append(f"{env}={value}")
            continue
        if any(t.lower() != "all" for t in tokens):
            raise InputError(config.source, f"process.env.{env}", f"only 'all' is supported, got {value!r}")
        out.append(DeviceRequest(source=f"env:{env}", value="all", kind=Kind(kind), from_plugin=False))
    return out


def _dedupe(items: Iterable[DeviceRequest]) -> tuple[DeviceRequest, ...]:
    seen: dict[tuple[str, str, Kind], DeviceRequest] = {}
    for r in items:
        seen.setdefault((r.source, r.value, r.kind), r)
    return tuple(seen.values())


_NOT_VOUCHED = (
    "a Kubernetes container's env counts only with the kubelet's allocation of a GPU "
    "(or in a namespace listed in env_trusted_namespaces)"
)


def _mounts_vouched(
    mounts: list[DeviceRequest], kubelet: Kubelet, bounded: bool, warnings: list[str], ignored: list[str]
) -> list[DeviceRequest]:
    """A Kubernetes container's ``/dev/null`` volume-mount requests, under ``env_requests: auto``.

    Any pod allowed a ``hostPath: /dev/null`` volume can write such a mount, so where the
    kubelet's checkpoint answers (``bounded``) one counts only when this container's allocation
    carries that very mount, as the env needs the allocation. Where it cannot answer (absent,
    unreadable, corrupt, or DRA claims it does not list) they count as before, and a warning says so.
    """
    if kubelet.state == "untrusted":  # nothing can vouch for a pod that has no trusted identity
        for m in mounts:
            dest = m.source.removeprefix("mount:")
            warnings.append(f"{dest}: /dev/null volume mount ignored: no trusted pod identity")
            ignored.append(f"mount {dest}")
        return []
    pod = kubelet.pod
    where = f"pod {pod.namespace or '?'}/{pod.name or pod.uid} container {pod.container}"
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


def _env_refusal(kubelet: Kubelet, corroboration: str, value: str) -> str:
    """Why a Kubernetes container's visible-devices env is no request ('' when it counts)."""
    if kubelet.state == "untrusted":  # a pod's own word is all there is: nothing vouches, not even siblings
        return f"{VISIBLE_ENV}={value} ignored: no trusted pod identity ({kubelet.problem})"
    pod = kubelet.pod
    where = f"pod {pod.namespace or '?'}/{pod.name or pod.uid} container {pod.container}"
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


def collect(
    config: OciConfig, annotations: Mapping[str, str], settings: Settings, kubelet: Kubelet | None = None
) -> Requests:
    """Every request of one container, in evidence order (checkpoint first).

    ``kubelet`` is None outside Kubernetes. Under ``env_requests: auto`` a Kubernetes container's
    env needs the kubelet's word (an allocation of a ``gpu_resources`` resource to this very
    container), or plugin-only siblings when the checkpoint cannot answer, or a trusted namespace.
    """
    privileged = is_privileged(config.resource_rules) or has_sys_admin(config)
    warnings: list[str] = []
    ignored: list[str] = []
    allocs = kubelet.allocations if kubelet is not None else ()
    gpu_allocs = [a for a in allocs if gpu_resource(a.resource, settings)]
    mode = settings.env_requests
    trusted = (
        kubelet is not None
        and bool(kubelet.pod.namespace)
        and kubelet.pod.namespace in settings.env_trusted_namespaces
    )
    needs_kubelet = kubelet is not None and mode is EnvRequests.AUTO and not trusted
    # DRA claims inject CDI devices the device-plugin checkpoint does not list: no bound then,
    # nor when the DRA state exists but cannot be read (the pod may hold claims)
    bounded = (
        needs_kubelet and kubelet is not None and kubelet.known and not (kubelet.dra or kubelet.dra_unknown)
    )
    checkpoint = [*_from_checkpoint(allocs, config, settings), *_from_dra(kubelet, config)]
    granting = _from_annotations(annotations, settings.cdi_annotation_prefixes)
    mounts = _from_mounts(config, container_path(settings.volume_mount_root))
    if needs_kubelet and kubelet is not None and mounts:
        mounts = _mounts_vouched(mounts, kubelet, bounded, warnings, ignored)
    if not granting:
        granting = [m for m in mounts if m.kind is not Kind.IMEX]
    imex = [m for m in mounts if m.kind is Kind.IMEX]
    corroboration = _corroborated(config, settings, bool(gpu_allocs))
    env = _from_env(config, settings, corroboration)
    value = config.env.get(VISIBLE_ENV, "")
    shown = value if VISIBLE_ENV in config.env else "all (legacy CUDA image)"
    if env and (granting or checkpoint):
        origin = (checkpoint or granting)[0].source
        if not any(a.envs.get(VISIBLE_ENV) == value for a in gpu_allocs):
            warnings.append(f"{VISIBLE_ENV}={shown} ignored: the allocation came from {origin}")
        env = []
    elif env and needs_kubelet and kubelet is not None and not gpu_allocs:
        refusal = _env_refusal(kubelet, corroboration, shown)
        if refusal:
            warnings.append(refusal)
            ignored.append(f"{VISIBLE_ENV}={shown}")
            env = []
    elif env and not privileged and not corroboration and mode is EnvRequests.NEVER:
        warnings.append(f"{VISIBLE_ENV} ignored in an unprivileged container (env_requests: never)")
        ignored.append(f"{VISIBLE_ENV}={shown}")
        env = []
    imex_env = [] if imex else _imex_from_env(config, corroboration)
    if imex_env:  # channels count with a GPU request that counts, or when the kubelet's allocation set them
        vouched_imex = any(a.envs.get(IMEX_ENV) == config.env.get(IMEX_ENV) for a in gpu_allocs)
        if not (env or vouched_imex or (privileged and not needs_kubelet)):
            warnings.append(f"{IMEX_ENV} ignored: it counts only with a GPU request that counts")
            imex_env = []
    nodes = (
        []
        if is_privileged(config.resource_rules) or bounded
        else _from_nodes(config, settings.accelerator_nodes)
    )
    vouched: dict[str, str] | None = None
    if needs_kubelet:
        vouched = {k: v for a in gpu_allocs for k, v in a.envs.items()}
    gpu = [*checkpoint, *granting, *env, *nodes]
    if gpu:
        mig = _mig_management(config, vouched, warnings, ignored)
    else:  # NVIDIA's hook returns before looking at them when no GPU is requested
        mig = []
        warnings += [f"{name}={config.env[name].strip()} ignored: the container asks for no GPU"
                     for name in MIG_ENVS if config.env.get(name, "").strip()]
    items = _dedupe([*checkpoint, *granting, *imex, *imex_env, *env, *nodes, *mig])
    evidence = [s for s in dict.fromkeys(r.source.split(":")[0] for r in items if r.from_plugin)]
    if corroboration and any(r.source.startswith("env:") and r.from_plugin for r in items):
        evidence.append(f"corroborated-by:{corroboration}")
    if trusted and kubelet is not None and any(r.source.startswith("env:") for r in items):
        evidence.append(f"trusted-namespace:{kubelet.pod.namespace}")
    caps = config.env.get(CAPS_ENV, "")
    return Requests(
        items=items,
        evidence=tuple(evidence),
        warnings=tuple(warnings),
        driver_capabilities=caps,
        kubelet=kubelet,
        bounded=bounded,
        ignored_env=tuple(ignored),
        legacy_image=is_legacy_image(config.env) and CAPS_ENV not in config.env,
    )
