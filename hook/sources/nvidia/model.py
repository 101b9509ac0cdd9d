"""The NVIDIA inventory values: what a host has, as frozen data every other module shares.

Rule: these are plain values built by parsers (``procfs``, ``nvml``, ``snapshot.inventory_from_json``);
nothing here reads the host. ``gpuN`` in capability keys is always the GPU *device minor*, never
its NVML index.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hook.core.record import field, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NVIDIA_MAJOR", "CapNode", "CapTable", "Gpu", "Inventory", "Majors", "MigDevice"]

NVIDIA_MAJOR = 195  # fixed by the driver (LNC NV_DEVICE_MAJOR)


@record
class Majors:
    """Character-device majors from ``/proc/devices``; ``None`` where the module is not loaded."""

    nvidia: int = NVIDIA_MAJOR
    uvm: int | None = None
    caps: int | None = None
    imex: int | None = None


@record
class CapNode:
    """One ``/dev/nvidia-caps/nvidia-cap<minor>`` node; mode/uid/gid from its capability file."""

    minor: int
    mode: int = 0o444
    uid: int = 0
    gid: int = 0


def _frozen(mapping: Mapping[Any, CapNode] | None) -> Mapping[Any, CapNode]:
    return MappingProxyType(dict(sorted((mapping or {}).items())))


@record
class CapTable:
    """The MIG capabilities that exist on the host (keys: GPU minor, GI id[, CI id])."""

    config: CapNode | None = None
    monitor: CapNode | None = None
    gi: Mapping[tuple[int, int], CapNode] = field(default_factory=dict)
    ci: Mapping[tuple[int, int, int], CapNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gi", _frozen(self.gi))
        object.__setattr__(self, "ci", _frozen(self.ci))

    def instances(self) -> tuple[tuple[int, int, int], ...]:
        """Every (gpu_minor, gi, ci) whose GI and CI caps both exist: one MIG device each."""
        return tuple(key for key in self.ci if key[:2] in self.gi)


@record
class Gpu:
    index: int
    minor: int
    uuid: str
    pci_bus_id: str  # normalized: 0000:3b:00.0
    name: str = ""
    mig_enabled: bool = False


@record
class MigDevice:
    """A MIG device; ``uuid`` is ``None`` when only /proc was read (NVML gives UUIDs)."""

    uuid: str | None
    parent_minor: int
    parent_index: int
    gi: int
    ci: int
    profile: str = ""
    index: int = 0  # position under the parent, the M of ``G:M``


@record
class Inventory:
    driver_version: str
    majors: Majors = field(default_factory=Majors)
    gpus: tuple[Gpu, ...] = ()
    migs: tuple[MigDevice, ...] = ()
    caps: CapTable = field(default_factory=CapTable)
    source: str = "proc"  # proc | proc+nvml | nvml | cache | file
    warnings: tuple[str, ...] = ()

    def gpu_by_minor(self, minor: int) -> Gpu | None:
        return next((g for g in self.gpus if g.minor == minor), None)
