"""CDI spec versions: which versions exist and which fields need which minimum version.

Rule: ``cdiVersion`` (one leading ``v`` allowed) must be one of ``KNOWN_VERSIONS`` and at least
``EARLIEST``; a spec that uses a field newer than its declared version is rejected, naming the
first field that needs the newer version. ``VERSION_GATES`` is the reference's table
(CDI specs-go/version.go ``requiresVxxx``), newest first; 0.8.0 and 1.0.0 gate nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = ["KNOWN_VERSIONS", "EARLIEST", "VERSION_GATES", "normalize", "version_key", "required_version"]

KNOWN_VERSIONS: Final = (
    "1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0",
)
EARLIEST: Final = "0.3.0"

Raw = dict[str, Any]


def normalize(version: str) -> str | None:
    """``v1.1.0``/``1.1.0`` → ``1.1.0``; None for anything not in KNOWN_VERSIONS."""
    text = version[1:] if version.startswith("v") else version
    return text if text in KNOWN_VERSIONS else None


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _edit_sets(spec: Raw) -> Iterator[tuple[str, Raw]]:
    """(field prefix, containerEdits) for the spec and every device."""
    yield "containerEdits", spec.get("containerEdits") or {}
    for i, dev in enumerate(spec.get("devices") or ()):
        yield f"devices[{i}].containerEdits", dev.get("containerEdits") or {}


def _v110(spec: Raw) -> str | None:
    for prefix, edits in _edit_sets(spec):
        if edits.get("netDevices"):
            return f"{prefix}.netDevices"
        rdt = edits.get("intelRdt") or {}
        if "schemata" in rdt:
            return f"{prefix}.intelRdt.schemata"
        if rdt.get("enableMonitoring"):
            return f"{prefix}.intelRdt.enableMonitoring"
    return None


def _v070(spec: Raw) -> str | None:
    for prefix, edits in _edit_sets(spec):
        if "intelRdt" in edits:
            return f"{prefix}.intelRdt"
        if edits.get("additionalGids"):
            return f"{prefix}.additionalGids"
    return None


def _v060(spec: Raw) -> str | None:
    if spec.get("annotations"):
        return "annotations"
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        return "kind"
    for i, dev in enumerate(spec.get("devices") or ()):
        if dev.get("annotations"):
            return f"devices[{i}].annotations"
    return None


def _v050(spec: Raw) -> str | None:
    for i, dev in enumerate(spec.get("devices") or ()):
        if str(dev.get("name", ""))[:1] in "0123456789" and dev.get("name"):
            return f"devices[{i}].name"
    for prefix, edits in _edit_sets(spec):
        for j, node in enumerate(edits.get("deviceNodes") or ()):
            if node.get("hostPath"):
                return f"{prefix}.deviceNodes[{j}].hostPath"
    return None


def _v040(spec: Raw) -> str | None:
    for prefix, edits in _edit_sets(spec):
        for j, mount in enumerate(edits.get("mounts") or ()):
            if mount.get("type"):
                return f"{prefix}.mounts[{j}].type"
    return None


# (version, what it added, predicate → first field that needs it), newest first.
VERSION_GATES: Final[tuple[tuple[str, str, Callable[[Raw], str | None]], ...]] = (
    ("1.1.0", "netDevices; intelRdt.schemata and enableMonitoring", _v110),
    ("0.7.0", "intelRdt; additionalGids", _v070),
    ("0.6.0", "annotations; '.' in the class of kind", _v060),
    ("0.5.0", "deviceNodes[].hostPath; device names starting with a digit", _v050),
    ("0.4.0", "mounts[].type", _v040),
)


def required_version(spec: Raw) -> tuple[str, str | None]:
    """The minimum version ``spec`` needs and the first field that needs it (None: baseline)."""
    for version, _added, needs in VERSION_GATES:
        field = needs(spec)
        if field is not None:
            return version, field
    return EARLIEST, None
