"""What a device request is: its kind, where it came from, and the whole set of one container.

Rule: values only. ``from_plugin`` is evidence, not trust: the modules that build requests
(``hook.core.asks`` from the config, ``hook.core.kubeasks`` from the kubelet's word) decide it,
``hook.core.requests.collect`` weighs them.
"""

from __future__ import annotations

from enum import StrEnum

from hook.core.kubelet import Kubelet
from hook.core.oci import LinuxDevice
from hook.core.record import record

__all__ = ["Kind", "DeviceRequest", "Requests", "VISIBLE_ENV", "IMEX_ENV", "CAPS_ENV", "MIG_ENVS"]

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"
CAPS_ENV = "NVIDIA_DRIVER_CAPABILITIES"
MIG_ENVS = {"NVIDIA_MIG_CONFIG_DEVICES": "mig-config", "NVIDIA_MIG_MONITOR_DEVICES": "mig-monitor"}


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
    # is an over-grant, even when the allocation is empty. Also true where nothing can be
    # allocated: a pod's sandbox, a container with no trusted pod identity.
    bounded: bool = False
    ignored_env: tuple[str, ...] = ()  # "NAME=value" of envs that were no request, for the reason
    legacy_image: bool = False  # a legacy CUDA image with NVIDIA_DRIVER_CAPABILITIES unset: every capability

    @property
    def from_plugin(self) -> bool:
        return any(r.from_plugin for r in self.items)
