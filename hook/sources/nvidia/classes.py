"""Read the host's NVIDIA device classes under a driver root (``hook.core.devclasses`` decides with them).

Rule: everything comes from the driver root: ``proc/devices`` (class majors), ``sys/class/drm/*``
(each DRM node's ``dev`` numbers and the PCI address its ``device`` link names: read with
``readlink``, never followed), ``proc/driver/nvidia/gpus/<pci>/information`` (which PCI addresses
are NVIDIA GPUs, and their minors: every GPU the driver lists, node or not, unless an inventory
already holds them), ``proc/driver/nvidia-caps/{nvlink,sys}-minors`` (the fabric
capabilities), ``proc/driver/nvidia/params`` (the IMEX channel count, for a container given a
channel) and the char nodes of ``dev/`` and its class directories (lstat). Anything unreadable
is simply not found: an unattributed DRM node is then left to the ``accelerator_nodes`` globs
(denied by default), so a gap narrows, never frees. Read only for a container that may be
narrowed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from hook.core.devclasses import ClassNode, HostClasses, Key, class_majors
from hook.core.plan import Node
from hook.core.record import replace
from hook.sources.nvidia.dri import NVIDIA_PCI_VENDOR, drm_devices, pci_vendor

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

    from hook.sources.nvidia.model import Inventory

__all__ = ["host_classes", "imex_count", "read_classes"]

_FABRIC_FILES: Final = ("proc/driver/nvidia-caps/nvlink-minors", "proc/driver/nvidia-caps/sys-minors")
_MAX: Final = 1 << 16  # these files are a few lines; more is not the driver's
_NODE_DIRS: Final = ("", "dri", "nvidia-caps", "nvidia-caps-imex-channels")
_MAX_GPUS: Final = 256  # the nvidia region's minors: more entries are not the driver's


def _read(root: Path, rel: str) -> str:
    try:
        with open(os.path.join(root, rel), "rb") as f:
            return f.read(_MAX).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def _gpu_minor(root: Path, bus: str) -> int | None:
    """The device minor of the GPU the driver lists at PCI address ``bus``; None when it lists none."""
    text = _read(root, f"proc/driver/nvidia/gpus/{bus}/information")
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return None


def _driver_gpus(root: Path) -> dict[str, int | None]:
    """PCI address -> device minor of every GPU the driver lists (``proc/driver/nvidia/gpus``):
    a GPU whose ``/dev`` node the host has not made yet is one a privileged container could make."""
    try:
        buses = sorted(os.listdir(os.path.join(root, "proc/driver/nvidia/gpus")))[:_MAX_GPUS]
    except OSError:
        return {}
    return {bus: _gpu_minor(root, bus) for bus in buses}


def _fabric(root: Path) -> frozenset[int]:
    minors: set[int] = set()
    for rel in _FABRIC_FILES:
        for line in _read(root, rel).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("fabric-") and parts[1].isdigit():
                minors.add(int(parts[1]))
    return frozenset(minors)


def _class_nodes(root: Path, shell: HostClasses, skip: frozenset[str]) -> list[ClassNode]:
    """The class nodes where the driver, nvidia-modprobe and udev make them: ``dev/`` itself and
    the ``dri``, ``nvidia-caps`` and ``nvidia-caps-imex-channels`` directories; a link is never
    followed. Paths in ``skip`` (the host scan's accelerators) are not looked at again, and only a
    class node becomes a value (a host's ``/dev`` holds hundreds of others)."""
    found: list[ClassNode] = []
    base = os.path.join(root, "dev")
    for sub in _NODE_DIRS:
        prefix = f"/dev/{sub}/" if sub else "/dev/"
        try:
            entries = list(os.scandir(os.path.join(base, sub) if sub else base))
        except OSError:
            continue
        for e in entries:
            path = prefix + e.name
            if path in skip:
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISCHR(st.st_mode):
                continue
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            got = shell.classify(("c", major, minor))
            if got is not None:
                node = Node(path=path, type="c", major=major, minor=minor, file_mode=stat.S_IMODE(st.st_mode))
                found.append(ClassNode(node=node, kind=got[0], gpu=got[1]))
    return found


def read_classes(
    root: Path, gpus: Mapping[str, int] | None = None, skip: frozenset[str] = frozenset()
) -> HostClasses:
    """The host's NVIDIA classes, and the class nodes under ``dev/`` not in ``skip`` (paths the
    caller's host scan already holds); empty where the NVIDIA driver is not loaded. ``gpus`` (PCI
    address -> device minor, from an inventory) spares reading the driver's ``information`` files;
    without it only the addresses sysfs gives a DRM node are read."""
    majors = class_majors(_read(root, "proc/devices"))
    drm_major = majors.pop("drm", None)
    if not majors:
        return HostClasses()
    drm: dict[Key, int] = {}
    foreign: set[Key] = set()
    minors: dict[str, int | None] = dict(gpus) if gpus is not None else _driver_gpus(root)
    for key, (bus, name) in drm_devices(root).items():
        if bus not in minors:
            minors[bus] = None if gpus is not None else _gpu_minor(root, bus)
        gpu = minors[bus]
        if gpu is not None:
            drm[key] = gpu
        elif (vendor := pci_vendor(root, name)) and vendor != NVIDIA_PCI_VENDOR:
            foreign.add(key)  # another vendor's device, by its own PCI id
    shell = HostClasses(
        majors=majors,
        drm=drm,
        fabric=_fabric(root),
        drm_major=drm_major,
        foreign=frozenset(foreign),
        gpu_minors=frozenset(m for m in minors.values() if m is not None),
    )
    nodes = _class_nodes(root, shell, skip)
    nodes.sort(key=lambda n: (n.node.major, n.node.minor, n.node.path))
    return replace(shell, nodes=tuple(nodes))


def _cap_minors(root: Path, inventory: Inventory | None, mig: bool) -> frozenset[int]:
    """Minors of every MIG capability that exists: the inventory's table, or for a container
    granted a MIG instance (``mig``: it keeps the caps major) the driver's own; a table that
    cannot be read leaves these to the host's nodes, as before."""
    table = inventory.caps if inventory is not None else None
    if table is None and mig:
        from hook.core.errors import InputError
        from hook.sources.nvidia.procfs import read_cap_table

        try:
            table = read_cap_table(root)[0]
        except (InputError, OSError, ValueError):
            return frozenset()
    if table is None:
        return frozenset()
    found = [c.minor for c in (table.config, table.monitor) if c is not None]
    return frozenset([*found, *(c.minor for c in table.gi.values()), *(c.minor for c in table.ci.values())])


def imex_count(root: Path) -> int | None:
    """The driver's IMEX channel count, as it shows it: ``ImexChannelCount: <n>`` in
    ``proc/driver/nvidia/params`` (open-gpu-kernel-modules prints every ``nv_parms`` entry there,
    ``NVreg_ImexChannelCount`` among them, since the driver has IMEX channels); None where the
    file is unreadable or does not say, and the decision falls back to the documented default."""
    for line in _read(root, "proc/driver/nvidia/params").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "ImexChannelCount" and value.strip().isdigit():
            return int(value.strip())
    return None


def host_classes(
    root: Path,
    inventory: Inventory | None = None,
    skip: frozenset[str] = frozenset(),
    mig: bool = False,
    imex: bool = False,
) -> HostClasses:
    """``read_classes``; where the driver root has no ``/proc/devices`` names (a simulation from an
    ``--inventory`` snapshot), the snapshot's majors name the classes it knows. ``mig``: the
    container was granted a MIG capability node, so every existing capability's minor is read.
    ``imex``: it was granted an IMEX channel, so the driver's channel count is read."""
    gpus = {g.pci_bus_id: g.minor for g in inventory.gpus} if inventory is not None else None
    found = read_classes(root, gpus or None, skip)
    if found.majors and "nvidia-caps" in found.majors:
        found = replace(found, cap_minors=_cap_minors(root, inventory, mig))
    if imex:
        found = replace(found, imex_count=imex_count(root))
    if found.majors or inventory is None:
        return found
    m = inventory.majors
    named = {
        "nvidia": m.nvidia,
        "nvidia-uvm": m.uvm,
        "nvidia-caps": m.caps,
        "nvidia-caps-imex-channels": m.imex,
    }
    return HostClasses(majors={k: v for k, v in named.items() if v is not None})
