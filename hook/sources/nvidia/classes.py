"""Read the host's NVIDIA device classes under a driver root (``hook.core.devclasses`` decides with them).

Rule: everything comes from the driver root: ``proc/devices`` (class majors), ``sys/class/drm/*``
(each DRM node's ``dev`` numbers and the PCI address its ``device`` link names: read with
``readlink``, never followed), ``proc/driver/nvidia/gpus/<pci>/information`` (which PCI addresses
are NVIDIA GPUs, and their minors), ``proc/driver/nvidia-caps/{nvlink,sys}-minors`` (the fabric
capabilities) and the char nodes two levels under ``dev/`` (lstat). Anything unreadable is simply
not found: an unattributed DRM node is then left to the ``accelerator_nodes`` globs (denied by
default), so a gap narrows, never frees. Read only for a container that may be narrowed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.devclasses import ClassNode, HostClasses, Key, class_majors
from hook.core.plan import Node
from hook.core.record import replace
from hook.sources.nvidia.dri import NVIDIA_PCI_VENDOR, drm_devices

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

    from hook.sources.nvidia.model import Inventory

__all__ = ["host_classes", "read_classes"]

_FABRIC_FILES: Final = ("proc/driver/nvidia-caps/nvlink-minors", "proc/driver/nvidia-caps/sys-minors")
_MAX: Final = 1 << 16  # these files are a few lines; more is not the driver's


def _read(root: Path, rel: str) -> str:
    try:
        with open(os.path.join(root, rel), "rb") as f:
            return f.read(_MAX).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def _gpu_minors(root: Path) -> dict[str, int]:
    """PCI address -> device minor of every GPU the driver lists (``gpus/<pci>/information``)."""
    out: dict[str, int] = {}
    try:
        buses = [e.name for e in os.scandir(os.path.join(root, "proc/driver/nvidia/gpus"))]
    except OSError:
        return out
    for bus in buses:
        text = _read(root, f"proc/driver/nvidia/gpus/{bus}/information")
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "Device Minor" and value.strip().isdigit():
                out[bus.lower()] = int(value.strip())
    return out


def _fabric(root: Path) -> frozenset[int]:
    minors: set[int] = set()
    for rel in _FABRIC_FILES:
        for line in _read(root, rel).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("fabric-") and parts[1].isdigit():
                minors.add(int(parts[1]))
    return frozenset(minors)


def _char_nodes(root: Path) -> list[Node]:
    """Every char node two levels under ``dev/`` (``dri/``, ``nvidia-caps/``...), never a link."""
    found: list[Node] = []

    def walk(directory: str, rel: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 2:
                walk(e.path, f"{rel}{e.name}/", depth + 1)
            elif stat.S_ISCHR(st.st_mode):
                found.append(
                    Node(
                        path=f"/dev/{rel}{e.name}",
                        type="c",
                        major=os.major(st.st_rdev),
                        minor=os.minor(st.st_rdev),
                        file_mode=stat.S_IMODE(st.st_mode),
                    )
                )

    walk(os.path.join(root, "dev"), "", 0)
    return found


def read_classes(root: Path) -> HostClasses:
    """The host's NVIDIA classes and their nodes; empty where the NVIDIA driver is not loaded."""
    majors = class_majors(_read(root, "proc/devices"))
    drm_major = majors.pop("drm", None)
    if not majors:
        return HostClasses()
    gpus = _gpu_minors(root)
    drm: dict[Key, int] = {}
    foreign: set[Key] = set()
    for key, (bus, vendor) in drm_devices(root).items():
        if bus in gpus:
            drm[key] = gpus[bus]
        elif vendor and vendor != NVIDIA_PCI_VENDOR:  # another vendor's, by its own PCI id
            foreign.add(key)
    shell = HostClasses(
        majors=majors, drm=drm, fabric=_fabric(root), drm_major=drm_major, foreign=frozenset(foreign)
    )
    nodes = []
    for node in _char_nodes(root):
        found = shell.classify((node.type, node.major, node.minor))
        if found is not None:
            nodes.append(ClassNode(node=node, kind=found[0], gpu=found[1]))
    nodes.sort(key=lambda n: (n.node.major, n.node.minor, n.node.path))
    return replace(shell, nodes=tuple(nodes))


def host_classes(root: Path, inventory: Inventory | None = None) -> HostClasses:
    """``read_classes``; where the driver root has no ``/proc/devices`` names (a simulation from an
    ``--inventory`` snapshot), the snapshot's majors name the classes it knows."""
    found = read_classes(root)
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
