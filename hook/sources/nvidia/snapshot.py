"""The inventory snapshot JSON (``hook inventory``, ``--inventory FILE``, the cache payload).

Rule: ``to_json`` emits plain data whose lists are sorted, so ``json.dumps(..., sort_keys=True)``
is byte-stable; ``from_json`` validates every field and raises ``InputError`` naming the source
and the JSON path of the first bad field. Pure: the caller reads and writes the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hook.core.errors import InputError
from hook.sources.nvidia.model import CapNode, CapTable, Gpu, Inventory, Majors, MigDevice

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any, Final

__all__ = ["SNAPSHOT_VERSION", "inventory_to_json", "inventory_from_json"]

SNAPSHOT_VERSION: Final = 1


def _cap_json(cap: CapNode | None) -> dict[str, int] | None:
    if cap is None:
        return None
    return {"minor": cap.minor, "mode": cap.mode, "uid": cap.uid, "gid": cap.gid}


def inventory_to_json(inv: Inventory) -> dict[str, Any]:
    caps = inv.caps
    return {
        "version": SNAPSHOT_VERSION,
        "driver_version": inv.driver_version,
        "source": inv.source,
        "majors": {
            "nvidia": inv.majors.nvidia,
            "uvm": inv.majors.uvm,
            "caps": inv.majors.caps,
            "imex": inv.majors.imex,
        },
        "gpus": [
            {
                "index": g.index,
                "minor": g.minor,
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "name": g.name,
                "mig_enabled": g.mig_enabled,
            }
            for g in sorted(inv.gpus, key=lambda g: g.index)
        ],
        "migs": [
            {
                "uuid": m.uuid,
                "parent_minor": m.parent_minor,
                "parent_index": m.parent_index,
                "gi": m.gi,
                "ci": m.ci,
                "profile": m.profile,
                "index": m.index,
            }
            for m in sorted(inv.migs, key=lambda m: (m.parent_index, m.index, m.gi, m.ci))
        ],
        "caps": {
            "config": _cap_json(caps.config),
            "monitor": _cap_json(caps.monitor),
            "gi": [{"gpu": k[0], "gi": k[1], **_cap_json(v)} for k, v in sorted(caps.gi.items())],  # type: ignore[dict-item]
            "ci": [
                {"gpu": k[0], "gi": k[1], "ci": k[2], **_cap_json(v)}  # type: ignore[dict-item]
                for k, v in sorted(caps.ci.items())
            ],
        },
        "warnings": list(inv.warnings),
    }


class _Reader:
    """Typed field access that raises ``InputError(source, json.path, reason)``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, reason: str) -> InputError:
        return InputError(self.source, path, reason)

    def get(
        self, obj: Any, key: str, path: str, kind: type | tuple[type, ...], *, optional: bool = False
    ) -> Any:
        if not isinstance(obj, Mapping):
            raise self.fail(path, "expected an object")
        if key not in obj or (optional and obj[key] is None):
            if optional:
                return None
            raise self.fail(f"{path}.{key}".lstrip("."), "missing")
        value = obj[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise self.fail(
                f"{path}.{key}".lstrip("."), f"expected {_kind_name(kind)}, got {type(value).__name__}"
            )
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise self.fail(f"{path}.{key}".lstrip("."), "must not be negative")
        return value

    def items(self, obj: Any, key: str, path: str) -> list[tuple[str, Any]]:
        values = self.get(obj, key, path, list)
        return [(f"{path}.{key}[{i}]".lstrip("."), v) for i, v in enumerate(values)]

    def cap(self, obj: Any, path: str) -> CapNode:
        return CapNode(
            minor=self.get(obj, "minor", path, int),
            mode=self.get(obj, "mode", path, int) & 0o777,
            uid=self.get(obj, "uid", path, int),
            gid=self.get(obj, "gid", path, int),
        )


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "integer", str: "string", bool: "boolean", list: "array", dict: "object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _gpus(r: _Reader, data: Any) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=r.get(g, "index", p, int),
            minor=r.get(g, "minor", p, int),
            uuid=r.get(g, "uuid", p, str),
            pci_bus_id=r.get(g, "pci_bus_id", p, str),
            name=r.get(g, "name", p, str),
            mig_enabled=r.get(g, "mig_enabled", p, bool),
        )
        for p, g in r.items(data, "gpus", "")
    )


def _migs(r: _Reader, data: Any) -> tuple[MigDevice, ...]:
    return tuple(
        MigDevice(
            uuid=r.get(m, "uuid", p, str, optional=True),
            parent_minor=r.get(m, "parent_minor", p, int),
            parent_index=r.get(m, "parent_index", p, int),
            gi=r.get(m, "gi", p, int),
            ci=r.get(m, "ci", p, int),
            profile=r.get(m, "profile", p, str),
            index=r.get(m, "index", p, int),
        )
        for p, m in r.items(data, "migs", "")
    )


def _caps(r: _Reader, data: Any) -> CapTable:
    caps = r.get(data, "caps", "", dict)
    config = r.get(caps, "config", "caps", dict, optional=True)
    monitor = r.get(caps, "monitor", "caps", dict, optional=True)
    return CapTable(
        config=None if config is None else r.cap(config, "caps.config"),
        monitor=None if monitor is None else r.cap(monitor, "caps.monitor"),
        gi={
            (r.get(c, "gpu", p, int), r.get(c, "gi", p, int)): r.cap(c, p)
            for p, c in r.items(caps, "gi", "caps")
        },
        ci={
            (r.get(c, "gpu", p, int), r.get(c, "gi", p, int), r.get(c, "ci", p, int)): r.cap(c, p)
            for p, c in r.items(caps, "ci", "caps")
        },
    )


def _warnings(r: _Reader, data: Any) -> tuple[str, ...]:
    values = r.get(data, "warnings", "", list, optional=True) or []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise r.fail(f"warnings[{i}]", "expected string")
    return tuple(values)


def inventory_from_json(data: str | bytes | Mapping[str, Any], source: str) -> Inventory:
    """Parse and validate a snapshot; ``source`` labels errors (the file name)."""
    r = _Reader(source)
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(source, "", f"not valid JSON: {exc}") from None
    version = r.get(data, "version", "", int)
    if version != SNAPSHOT_VERSION:
        raise r.fail("version", f"unsupported snapshot version {version} (expected {SNAPSHOT_VERSION})")
    majors = r.get(data, "majors", "", dict)
    return Inventory(
        driver_version=r.get(data, "driver_version", "", str),
        majors=Majors(
            nvidia=r.get(majors, "nvidia", "majors", int),
            uvm=r.get(majors, "uvm", "majors", int, optional=True),
            caps=r.get(majors, "caps", "majors", int, optional=True),
            imex=r.get(majors, "imex", "majors", int, optional=True),
        ),
        gpus=_gpus(r, data),
        migs=_migs(r, data),
        caps=_caps(r, data),
        source=r.get(data, "source", "", str, optional=True) or "file",
        warnings=_warnings(r, data),
    )
