"""Device requests: what a container asked for, where the ask came from, and whether a plugin made it.

Rule: NVIDIA's precedence (nvidia-container-toolkit ``cmd/nvidia-container-runtime-hook/
container_config.go``, ``getDevices``: the volume-mount list first, then the env; CDI annotations
ahead of both in its CDI modifier) decides which channel *grants* devices: CDI annotations, else
the volume-mount list, else the visible-devices env. The kubelet checkpoint and specifically-allowed
nodes always count. In a Kubernetes container the kubelet's word decides what a pod's own asks are
worth (``hook.core.kubeasks``); the asks themselves are read in ``hook.core.asks``, what the engine
gave in ``hook.core.accel``, the values live in ``hook.core.reqtypes``. This module weighs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hook.core.accel import has_sys_admin, injected_keys, is_accelerator, is_privileged
from hook.core.asks import (
    annotation_names,
    corroborated,
    from_annotations,
    from_env,
    from_mounts,
    from_nodes,
    imex_from_env,
    is_legacy_image,
    mig_management,
    split_ids,
)
from hook.core.kpath import container_path
from hook.core.kubeasks import (
    annotations_vouched,
    dra_claim_label,
    dra_claim_of,
    env_refusal,
    from_checkpoint,
    from_dra,
    gpu_resource,
    mounts_vouched,
    only_injected,
    sandbox_requests,
)
from hook.core.kubelet import SANDBOX, UNTRUSTED, Kubelet
from hook.core.oci import OciConfig
from hook.core.reqtypes import CAPS_ENV, IMEX_ENV, MIG_ENVS, VISIBLE_ENV, DeviceRequest, Kind, Requests
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


def _dedupe(items: Iterable[DeviceRequest]) -> tuple[DeviceRequest, ...]:
    seen: dict[tuple[str, str, Kind], DeviceRequest] = {}
    for r in items:
        seen.setdefault((r.source, r.value, r.kind), r)
    return tuple(seen.values())


def collect(
    config: OciConfig, annotations: Mapping[str, str], settings: Settings, kubelet: Kubelet | None = None
) -> Requests:
    """Every request of one container, in evidence order (checkpoint first).

    ``kubelet`` is None outside Kubernetes. In a Kubernetes container a CDI annotation counts only
    where the kubelet's word carries it; under ``env_requests: auto`` its env needs the kubelet's
    word too (an allocation of a ``gpu_resources`` resource to this very container), or plugin-only
    siblings when the checkpoint cannot answer, or a trusted namespace. A pod's sandbox asks for
    nothing, and a container with no trusted pod identity is one the kubelet allocated nothing.
    """
    if kubelet is not None and kubelet.state == SANDBOX:
        return sandbox_requests(config, annotations, settings, kubelet)
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
    # nor when the DRA state exists but cannot be read (the pod may hold claims). No trusted
    # identity is an empty allocation: bounded whatever the mode.
    bounded = kubelet is not None and (
        kubelet.state == UNTRUSTED
        or (needs_kubelet and kubelet.known and not (kubelet.dra or kubelet.dra_unknown))
    )
    checkpoint = [*from_checkpoint(allocs, config, settings), *from_dra(kubelet, config)]
    names = annotation_names(annotations, settings.cdi_annotation_prefixes)
    if kubelet is not None and names:
        names = annotations_vouched(names, kubelet, settings, warnings, ignored)
    granting = from_annotations(names)
    mounts = from_mounts(config, container_path(settings.volume_mount_root))
    if needs_kubelet and kubelet is not None and mounts:
        mounts = mounts_vouched(mounts, kubelet, bounded, warnings, ignored)
    if not granting:
        granting = [m for m in mounts if m.kind is not Kind.IMEX]
    imex = [m for m in mounts if m.kind is Kind.IMEX]
    corroboration = corroborated(config, settings, bool(gpu_allocs))
    env = from_env(config, settings, corroboration)
    value = config.env.get(VISIBLE_ENV, "")
    shown = value if VISIBLE_ENV in config.env else "all (legacy CUDA image)"
    if env and (granting or checkpoint):
        origin = (checkpoint or granting)[0].source
        if not any(a.envs.get(VISIBLE_ENV) == value for a in gpu_allocs):
            warnings.append(f"{VISIBLE_ENV}={shown} ignored: the allocation came from {origin}")
        env = []
    elif env and needs_kubelet and kubelet is not None and not gpu_allocs:
        refusal = env_refusal(kubelet, corroboration, shown)
        if refusal:
            warnings.append(refusal)
            ignored.append(f"{VISIBLE_ENV}={shown}")
            env = []
    elif env and not privileged and not corroboration and mode is EnvRequests.NEVER:
        warnings.append(f"{VISIBLE_ENV} ignored in an unprivileged container (env_requests: never)")
        ignored.append(f"{VISIBLE_ENV}={shown}")
        env = []
    imex_env = [] if imex else imex_from_env(config, corroboration)
    if imex_env:  # channels count with a GPU request that counts, or when the kubelet's allocation set them
        vouched_imex = any(a.envs.get(IMEX_ENV) == config.env.get(IMEX_ENV) for a in gpu_allocs)
        if not (env or vouched_imex or (privileged and not needs_kubelet)):
            warnings.append(f"{IMEX_ENV} ignored: it counts only with a GPU request that counts")
            imex_env = []
    nodes = (
        []
        if is_privileged(config.resource_rules) or bounded
        else from_nodes(config, settings.accelerator_nodes)
    )
    vouched: dict[str, str] | None = None
    if needs_kubelet:
        vouched = {k: v for a in gpu_allocs for k, v in a.envs.items()}
    gpu = [*checkpoint, *granting, *env, *nodes]
    if gpu:
        mig = mig_management(config, vouched, warnings, ignored)
    else:  # NVIDIA's hook returns before looking at them when no GPU is requested
        mig = []
        warnings += [
            f"{name}={config.env[name].strip()} ignored: the container asks for no GPU"
            for name in MIG_ENVS
            if config.env.get(name, "").strip()
        ]
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
