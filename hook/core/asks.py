"""What a container's own config asks for: CDI annotations, ``/dev/null`` volume mounts, the
visible-devices and IMEX envs, MIG management envs, and accelerator nodes with their own rule.

Rule: NVIDIA's reading of each channel (nvidia-container-toolkit
``cmd/nvidia-container-runtime-hook/container_config.go``, ``getDevices``: the volume-mount
list first, then the env; CDI annotations ahead of both in its CDI modifier). Nothing here knows
whether a channel may grant: ``hook.core.requests.collect`` weighs them, with the kubelet's word
(``hook.core.kubeasks``) in a Kubernetes container.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from hook.core.accel import is_accelerator
from hook.core.errors import InputError
from hook.core.kpath import container_path, host_source
from hook.core.oci import OciConfig
from hook.core.reqtypes import IMEX_ENV, MIG_ENVS, VISIBLE_ENV, DeviceRequest, Kind
from hook.core.rules import DeviceType
from hook.core.settings import Settings

__all__ = [
    "CHECKPOINT",
    "NOT_VOUCHED",
    "split_ids",
    "id_request",
    "annotation_names",
    "from_annotations",
    "from_mounts",
    "from_nodes",
    "corroborated",
    "is_legacy_image",
    "from_env",
    "imex_from_env",
    "mig_management",
]

CHECKPOINT = "kubelet-checkpoint"
NOT_VOUCHED = (
    "a Kubernetes container's env counts only with the kubelet's allocation of a GPU "
    "(or in a namespace listed in env_trusted_namespaces)"
)


def split_ids(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


def id_request(token: str, source: str, from_plugin: bool) -> DeviceRequest:
    kind = Kind.CDI if "=" in token and "/" in token else Kind.NVIDIA
    return DeviceRequest(source=source, value=token, kind=kind, from_plugin=from_plugin)


def annotation_names(annotations: Mapping[str, str], prefixes: Sequence[str]) -> list[tuple[str, str]]:
    """(key, name) of every CDI name the annotations hold, unparsed, keys sorted; values are split
    at commas and never trimmed (the reference refuses " v/c=d")."""
    return [
        (key, name)
        for key in sorted(annotations)
        if any(key.startswith(p) for p in prefixes)
        for name in annotations[key].split(",")
    ]


def from_annotations(names: Sequence[tuple[str, str]]) -> list[DeviceRequest]:
    """CDI requests of ``annotation_names``' pairs; a name that is not a qualified CDI name is an
    ``InputError`` naming its key."""
    out = []
    for key, name in names:
        from hook.core.cdinames import parse_qualified_name  # pure, and only for CDI annotations

        try:
            parse_qualified_name(name)
        except InputError as exc:
            raise InputError("annotations", key, f"{name!r}: {exc.reason}") from None
        out.append(DeviceRequest(source=f"annotation:{key}", value=name, kind=Kind.CDI, from_plugin=True))
    return out


def from_mounts(config: OciConfig, root: str) -> list[DeviceRequest]:
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
            out.append(id_request(ident, src, True))
    return out


def from_nodes(config: OciConfig, patterns: Mapping[str, tuple[str, ...]]) -> list[DeviceRequest]:
    """Accelerator nodes with their own exact allow rule: DeviceSpecs or CDI nodes an engine added."""
    specific = {(r.type, r.major, r.minor) for r in config.resource_rules if r.allow and r.minor is not None}
    return [
        DeviceRequest(source="linux.devices", value=d.path, kind=Kind.NODE, from_plugin=True, node=d)
        for d in config.devices
        if is_accelerator(d.path, patterns) and (DeviceType(d.type), d.major, d.minor) in specific
    ]


def corroborated(config: OciConfig, settings: Settings, gpu_allocated: bool) -> str:
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


def from_env(config: OciConfig, settings: Settings, corroboration: str) -> list[DeviceRequest]:
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
    return [id_request(t, src, bool(corroboration)) for t in tokens]


def imex_from_env(config: OciConfig, corroboration: str) -> list[DeviceRequest]:
    """``NVIDIA_IMEX_CHANNELS`` (the device plugin's env strategy): channel ids; ``all`` grants none."""
    tokens = split_ids(config.env.get(IMEX_ENV, ""))
    if not tokens or any(t.lower() in ("all", "none", "void") for t in tokens):
        return []
    src = f"env:{IMEX_ENV}"
    plugin = bool(corroboration)
    return [DeviceRequest(source=src, value=t, kind=Kind.IMEX, from_plugin=plugin) for t in tokens]


def mig_management(
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
            warnings.append(f"{env}={value} ignored: {NOT_VOUCHED}")
            ignored.append(f"{env}={value}")
            continue
        if any(t.lower() != "all" for t in tokens):
            raise InputError(config.source, f"process.env.{env}", f"only 'all' is supported, got {value!r}")
        out.append(DeviceRequest(source=f"env:{env}", value="all", kind=Kind(kind), from_plugin=False))
    return out
