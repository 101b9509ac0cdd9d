"""The DRM nodes of GPUs, found through their PCI address in sysfs (NVIDIA's graphics discoverer).

Rule: a GPU's ``/dev/dri/card<N>`` and ``/dev/dri/renderD<N>`` are the entries named so under
``<driver_root>/sys/bus/pci/devices/<bus id>/drm/``; each is granted only if the host node
``<driver_root>/dev/dri/<name>`` is a character device (lstat, never followed), whose numbers
and mode it takes. A GPU without a ``drm`` directory (no DRM driver loaded) has none. Only for
the ``graphics`` and ``display`` driver capabilities; MIG devices get none (NVIDIA gives them
DRM nodes only for profiles with the ``gfx`` attribute, which the inventory does not record).
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

__all__ = ["GRAPHICS_CAPABILITIES", "dri_nodes"]

GRAPHICS_CAPABILITIES: Final = frozenset({"graphics", "display"})
_NAME: Final = re.compile(r"(?:card|renderD)[0-9]+")
_BUS: Final = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def dri_nodes(driver_root: Path, bus_ids: Iterable[str]) -> tuple[Node, ...]:
    """The DRM nodes of the GPUs at ``bus_ids`` (normalised ``0000:18:00.0`` form), sorted."""
    found: dict[str, Node] = {}
    for bus in bus_ids:
        if not _BUS.fullmatch(bus):
            continue
        try:
            names = os.listdir(driver_root / "sys/bus/pci/devices" / bus / "drm")
        except OSError:
            continue
        for name in sorted(n for n in names if _NAME.fullmatch(n)):
            try:
                st = os.lstat(driver_root / "dev/dri" / name)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found[name] = Node(path=f"/dev/dri/{name}", type="c", major=os.major(st.st_rdev),
                                   minor=os.minor(st.st_rdev), file_mode=stat.S_IMODE(st.st_mode))
    return tuple(sorted(found.values(), key=lambda n: (n.major, n.minor, n.path)))
