"""The DRM nodes of GPUs, found through their PCI address in sysfs (NVIDIA's graphics discoverer).

Rule: sysfs ties each DRM minor to its device: ``<driver_root>/sys/class/drm/<name>/dev`` holds
its numbers and the ``device`` link names its PCI address (read with ``readlink``, never
followed). A GPU's DRM nodes are the char nodes under ``<driver_root>/dev/dri`` (lstat, never
followed) whose numbers sysfs puts on that GPU's address, with the mode they have; the node's
name in ``/dev`` does not matter, its numbers do. A GPU without a DRM driver has none. Granted only
for the ``graphics`` and ``display`` driver capabilities; MIG devices get none (NVIDIA gives them
DRM nodes only for profiles with the ``gfx`` attribute, which the inventory does not record).
``hook.sources.nvidia.classes`` uses the same map to tell whose DRM node a host node is.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from hook.core.plan import Node

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "GRAPHICS_CAPABILITIES",
    "NVIDIA_PCI_VENDOR",
    "drm_devices",
    "drm_owners",
    "dri_nodes",
    "pci_vendor",
]

GRAPHICS_CAPABILITIES: Final = frozenset({"graphics", "display"})
NVIDIA_PCI_VENDOR: Final = "0x10de"
_BUS: Final = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_DEV: Final = re.compile(r"([0-9]+):([0-9]+)")
_VENDOR: Final = re.compile(r"0x[0-9a-f]{4}")
_MAX: Final = 64  # a ``dev`` file is "226:128\n"


def _dev_numbers(path: str) -> tuple[int, int] | None:
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        return None
    found = _DEV.fullmatch(text)
    return None if found is None else (int(found[1]), int(found[2]))


def drm_devices(driver_root: Path) -> dict[tuple[str, int, int], tuple[str, str]]:
    """Each DRM node's ``(type, major, minor)`` -> the PCI address sysfs puts it on, and its
    ``sys/class/drm`` entry's name (for ``pci_vendor``)."""
    base = os.path.join(driver_root, "sys/class/drm")
    out: dict[tuple[str, int, int], tuple[str, str]] = {}
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name, "device"))
        except (OSError, ValueError):
            continue  # a connector (card0-DP-1), "version": no device of its own
        bus = os.path.basename(target.rstrip("/")).lower()
        numbers = _dev_numbers(os.path.join(base, name, "dev")) if _BUS.fullmatch(bus) else None
        if numbers is not None:
            out[("c", *numbers)] = (bus, name)
    return out


def pci_vendor(driver_root: Path, name: str) -> str:
    """The PCI vendor id (``0x10de``) of the device behind ``sys/class/drm/<name>``; "" when unreadable."""
    return _vendor(os.path.join(driver_root, "sys/class/drm", name, "device", "vendor"))


def _vendor(path: str) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX).decode("ascii", "replace").strip().lower()
    except (OSError, ValueError):
        return ""
    return text if _VENDOR.fullmatch(text) else ""


def drm_owners(driver_root: Path) -> dict[tuple[str, int, int], str]:
    """Each DRM node's ``(type, major, minor)`` -> the PCI address sysfs puts it on."""
    return {key: bus for key, (bus, _name) in drm_devices(driver_root).items()}


def dri_nodes(driver_root: Path, bus_ids: Iterable[str]) -> tuple[Node, ...]:
    """The DRM nodes of the GPUs at ``bus_ids`` (normalised ``0000:18:00.0`` form), sorted."""
    wanted = {b for b in bus_ids if _BUS.fullmatch(b)}
    owners = drm_owners(driver_root) if wanted else {}
    if not any(bus in wanted for bus in owners.values()):
        return ()
    found: dict[str, Node] = {}
    base = os.path.join(driver_root, "dev/dri")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return ()
    for name in names:
        try:
            st = os.lstat(os.path.join(base, name))
        except OSError:
            continue
        key = ("c", os.major(st.st_rdev), os.minor(st.st_rdev))
        if stat.S_ISCHR(st.st_mode) and owners.get(key) in wanted:
            found[name] = Node(
                path=f"/dev/dri/{name}",
                type="c",
                major=key[1],
                minor=key[2],
                file_mode=stat.S_IMODE(st.st_mode),
            )
    return tuple(sorted(found.values(), key=lambda n: (n.major, n.minor, n.path)))
