"""Device IDs as NVIDIA_VISIBLE_DEVICES and ``--device`` name them, resolved against an Inventory.

Rule: accepted forms are ``all``, a GPU index, ``GPU-<uuid>``, ``MIG-<uuid>``,
``MIG-GPU-<uuid>/<gi>/<ci>``, ``<gpu index>:<mig index>`` and a PCI bus id (any domain width);
matching is case-insensitive. Every unknown ID is named in one ``InputError``. A ``G:M`` index is
NVML's MIG order under GPU G: a MIG device known only from /proc (no UUID) is numbered by GI/CI
id, which NVML does not promise, so such a match is refused with a clear line, never guessed.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from hook.core.errors import InputError
from hook.sources.nvidia.model import Gpu, Inventory, MigDevice

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = ["Device", "normalize_bus_id", "resolve", "resolve_one"]

Device = Gpu | MigDevice

# String methods, not regular expressions: compiling them cost ~0.4 ms at every start. Each
# parser below is proven equal to its pattern in tests/nvidia/test_ids_parsers.py:
#   bus id   (?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])
#   index    \d+            G:M index   (\d+):(\d+)
#   old MIG  mig-(gpu-[0-9a-f-]+)/(\d+)/(\d+)
_HEX: Final = frozenset("0123456789abcdef")
_HEX_DASH: Final = frozenset("0123456789abcdef-")


def _hex(text: str, most: int) -> bool:
    return 1 <= len(text) <= most and all(c in _HEX for c in text)


def parse_bus_id(low: str) -> tuple[str, str, str, str] | None:
    """(domain or "", bus, device, function) of a lower-case PCI bus id, or None."""
    head, dot, fn = low.rpartition(".")
    parts = head.split(":")
    if not dot or len(fn) != 1 or fn not in "01234567" or len(parts) not in (2, 3):
        return None
    domain = parts[0] if len(parts) == 3 else ""
    if (len(parts) == 3 and not _hex(domain, 8)) or not (_hex(parts[-2], 2) and _hex(parts[-1], 2)):
        return None
    return domain, parts[-2], parts[-1], fn


def parse_mig_index(token: str) -> tuple[int, int] | None:
    gpu, sep, mig = token.partition(":")
    return (int(gpu), int(mig)) if sep and gpu.isdecimal() and mig.isdecimal() else None


def parse_old_mig(low: str) -> tuple[str, int, int] | None:
    """``mig-gpu-<uuid>/<gi>/<ci>`` → (``gpu-<uuid>``, gi, ci), or None."""
    if not low.startswith("mig-gpu-"):
        return None
    parts = low[4:].split("/")
    if len(parts) != 3 or len(parts[0]) < 5 or not all(c in _HEX_DASH for c in parts[0][4:]):
        return None
    return (parts[0], int(parts[1]), int(parts[2])) if parts[1].isdecimal() and parts[2].isdecimal() else None


def normalize_bus_id(text: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` / ``3b:00.0`` → ``0000:3b:00.0``; ValueError otherwise."""
    parsed = parse_bus_id(text.strip().lower())
    if parsed is None:
        raise ValueError(f"{text!r} is not a PCI bus id")
    domain, bus, dev, fn = parsed
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


class _Index:
    """One inventory's devices by every name an ID can give, each list in inventory order: a token
    costs a lookup, not a pass over every device (a request naming each GPU of a 254-GPU node by
    UUID would otherwise cost 254 passes)."""

    __slots__ = ("by_bus", "by_index", "by_mig_index", "by_mig_uuid", "by_parent_gi_ci", "by_uuid", "migs")

    def __init__(self, inv: Inventory) -> None:
        self.by_index: dict[int, list[Gpu]] = {}
        self.by_uuid: dict[str, list[Gpu]] = {}
        self.by_bus: dict[str, list[Gpu]] = {}
        for g in inv.gpus:
            self.by_index.setdefault(g.index, []).append(g)
            self.by_uuid.setdefault(g.uuid.lower(), []).append(g)
            self.by_bus.setdefault(g.pci_bus_id, []).append(g)
        self.by_mig_index: dict[tuple[int, int], list[MigDevice]] = {}
        self.by_mig_uuid: dict[str, list[MigDevice]] = {}
        self.by_parent_gi_ci: dict[tuple[int, int, int], list[tuple[int, MigDevice]]] = {}
        for at, m in enumerate(inv.migs):
            self.by_mig_index.setdefault((m.parent_index, m.index), []).append(m)
            if m.uuid is not None:
                self.by_mig_uuid.setdefault(m.uuid.lower(), []).append(m)
            self.by_parent_gi_ci.setdefault((m.parent_minor, m.gi, m.ci), []).append((at, m))


_last: tuple[Inventory, _Index] | None = None  # the inventory of the decision at hand, and its index


def _index(inv: Inventory) -> _Index:
    global _last
    held = _last
    if held is not None and held[0] is inv:  # held, so its id cannot be another's
        return held[1]
    index = _Index(inv)
    _last = (inv, index)
    return index


def _by_mig_index(index: _Index, token: str) -> tuple[Device, ...]:
    parsed = parse_mig_index(token)
    if parsed is None:
        return ()
    found = tuple(index.by_mig_index.get(parsed, ()))
    if any(m.uuid is None for m in found):  # numbered from /proc by (gi, ci): not NVML's order, proven
        raise InputError("NVIDIA_VISIBLE_DEVICES", token, "a G:M index needs NVML (or a CDI spec) to know "
                         "NVML's GI/CI order, and NVML could not be asked; use the MIG UUID instead")
    return found


def _by_uuid(index: _Index, low: str) -> tuple[Device, ...]:
    if low.startswith("gpu-"):
        return tuple(index.by_uuid.get(low, ()))
    if old := parse_old_mig(low):
        parent, gi, ci = old
        parents = {g.minor for g in index.by_uuid.get(parent, ())}
        hits = [hit for minor in parents for hit in index.by_parent_gi_ci.get((minor, gi, ci), ())]
        return tuple(m for _, m in sorted(hits, key=lambda hit: hit[0]))  # inventory order
    if low.startswith("mig-"):
        return tuple(index.by_mig_uuid.get(low, ()))
    return ()


def _by_bus(index: _Index, token: str) -> tuple[Device, ...]:
    try:
        bus = normalize_bus_id(token)
    except ValueError:
        return ()
    return tuple(index.by_bus.get(bus, ()))


def resolve_one(inv: Inventory, token: str) -> tuple[Device, ...]:
    """The devices one ID names (``all``: every GPU then every MIG device); ``()`` if unknown."""
    low = token.strip().lower()
    if low == "all":
        return (*inv.gpus, *inv.migs)
    index = _index(inv)
    if low.isdecimal():  # \d+
        return tuple(index.by_index.get(int(low), ()))
    return _by_mig_index(index, low) or _by_uuid(index, low) or _by_bus(index, low)


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
