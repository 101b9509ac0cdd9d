"""Device IDs as NVIDIA_VISIBLE_DEVICES and ``--device`` name them, resolved against an Inventory.

Rule: accepted forms are ``all``, a GPU index, ``GPU-<uuid>``, ``MIG-<uuid>``,
``MIG-GPU-<uuid>/<gi>/<ci>``, ``<gpu index>:<mig index>`` and a PCI bus id (any domain width);
matching is case-insensitive. Every unknown ID is named in one ``InputError``. A ``G:M`` index is
NVML's MIG order under GPU G: a MIG device known only from /proc (no UUID) is numbered by GI/CI
id, which NVML does not promise, so such a match is refused with a clear line, never guessed.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hook.errors import InputError
from hook.nvidia.model import Gpu, Inventory, MigDevice

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = ["Device", "normalize_bus_id", "resolve", "resolve_one"]

Device = Gpu | MigDevice

_BUS_RE: Final = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")
_INDEX_RE: Final = re.compile(r"\d+")
_MIG_INDEX_RE: Final = re.compile(r"(\d+):(\d+)")
_OLD_MIG_RE: Final = re.compile(r"mig-(gpu-[0-9a-f-]+)/(\d+)/(\d+)")


def normalize_bus_id(text: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` / ``3b:00.0`` → ``0000:3b:00.0``; ValueError otherwise."""
    match = _BUS_RE.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a PCI bus id")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def _by_mig_index(inv: Inventory, token: str) -> tuple[Device, ...]:
    match = _MIG_INDEX_RE.fullmatch(token)
    if match is None:
        return ()
    gpu, mig = int(match[1]), int(match[2])
    found = tuple(m for m in inv.migs if m.parent_index == gpu and m.index == mig)
    if any(m.uuid is None for m in found):  # numbered from /proc by (gi, ci): not NVML's order, proven
        raise InputError("NVIDIA_VISIBLE_DEVICES", token, "a G:M index needs NVML (or a CDI spec) to know "
                         "NVML's GI/CI order, and NVML could not be asked; use the MIG UUID instead")
    return found


def _by_uuid(inv: Inventory, low: str) -> tuple[Device, ...]:
    if low.startswith("gpu-"):
        return tuple(g for g in inv.gpus if g.uuid.lower() == low)
    if match := _OLD_MIG_RE.fullmatch(low):
        parents = {g.minor for g in inv.gpus if g.uuid.lower() == match[1]}
        gi, ci = int(match[2]), int(match[3])
        return tuple(m for m in inv.migs if m.parent_minor in parents and (m.gi, m.ci) == (gi, ci))
    if low.startswith("mig-"):
        return tuple(m for m in inv.migs if m.uuid is not None and m.uuid.lower() == low)
    return ()


def _by_bus(inv: Inventory, token: str) -> tuple[Device, ...]:
    try:
        bus = normalize_bus_id(token)
    except ValueError:
        return ()
    return tuple(g for g in inv.gpus if g.pci_bus_id == bus)


def resolve_one(inv: Inventory, token: str) -> tuple[Device, ...]:
    """The devices one ID names (``all``: every GPU then every MIG device); ``()`` if unknown."""
    low = token.strip().lower()
    if low == "all":
        return (*inv.gpus, *inv.migs)
    if _INDEX_RE.fullmatch(low):
        return tuple(g for g in inv.gpus if g.index == int(low))
    return _by_mig_index(inv, low) or _by_uuid(inv, low) or _by_bus(inv, low)


def resolve(
    inv: Inventory, tokens: Iterable[str], *, source: str = "NVIDIA_VISIBLE_DEVICES"
) -> tuple[Device, ...]:
    """Resolve every token (empty ones skipped), de-duplicated in request order.

    Raises one ``InputError`` (file ``source``) naming every ID that matches nothing.
    """
    out: dict[Device, None] = {}
    unknown: list[str] = []
    for token in tokens:
        if not token.strip():
            continue
        found = resolve_one(inv, token)
        if not found:
            unknown.append(token.strip())
        out.update(dict.fromkeys(found))
    if unknown:
        hint = ""
        if any(t.lower().startswith("mig-") for t in unknown) and any(m.uuid is None for m in inv.migs):
            hint = " (MIG UUIDs are unknown: NVML could not be asked)"
        raise InputError(
            source, ", ".join(unknown), f"unknown device ID{'s' if len(unknown) > 1 else ''}{hint}"
        )
    return tuple(out)
