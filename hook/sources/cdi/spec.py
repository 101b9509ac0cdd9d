"""One CDI spec file: strict decoding, validation at load, and the frozen result.

Rule: a spec is decoded as the reference decodes it (YAML whatever the extension, first document
only, go-yaml v2 scalars; unknown and duplicate keys rejected at every level, keys matched
case-insensitively like Go's JSON), checked against the schema table, then validated (version
gates, kind, device names, edits) *once*; anything wrong rejects the whole file with the file
and the field named. Parsers take bytes, never paths: ``source`` only labels errors. A plain
JSON document never imports YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hook.core import cdinames as names
from hook.core.errors import InputError
from hook.core.record import record
from hook.sources.cdi import schema, version, yamlv2
from hook.sources.cdi.edits import HOOK_STAGES, ContainerEdits

__all__ = ["SpecError", "Spec", "Device", "decode", "validate_raw", "parse_spec", "spec_problems",
           "document_problems", "spec_from_raw",
           "device_from_raw"]


class SpecError(InputError):
    """An invalid spec; ``rule`` names the rule it breaks (for ``hook cdi validate``)."""

    def __init__(self, file: str, field: str, reason: str, rule: str = "spec") -> None:
        super().__init__(file, field, reason)
        self.rule = rule


@record
class Device:
    """A CDI device bound to its spec (spec edits are kept for the once-per-spec merge)."""

    name: str
    kind: str
    source: str
    priority: int
    annotations: Mapping[str, str]
    edits: ContainerEdits
    spec_edits: ContainerEdits

    @property
    def qualified_name(self) -> str:
        return f"{self.kind}={self.name}"


@record
class Spec:
    source: str
    priority: int
    version: str
    kind: str
    annotations: Mapping[str, str]
    edits: ContainerEdits
    devices: tuple[Device, ...]

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def class_(self) -> str:
        return self.kind.partition("/")[2]


# ---- decoding --------------------------------------------------------------------------------


def decode(data: bytes, source: str) -> Any:
    """Bytes → JSON-like data. Every spec is YAML whatever its name (JSON is YAML), as in the reference."""
    try:
        return yamlv2.load(data)
    except yamlv2.DuplicateKey as exc:
        raise SpecError(source, "", f"duplicate key {exc}", "duplicate-key") from exc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SpecError(source, "", f"cannot parse: {exc}", "syntax") from exc


# ---- validation ------------------------------------------------------------------------------


def _env_problems(env: list[str], field: str) -> list[schema.Problem]:
    return [(f"{field}[{i}]", f"invalid environment variable {e!r}: expected NAME=VALUE", "env")
            for i, e in enumerate(env) if e.find("=") <= 0]


def _node_problems(node: dict[str, Any], field: str) -> list[schema.Problem]:
    """The reference's DeviceNode.Validate: a path (any, even relative), a known type, sane numbers."""
    out: list[schema.Problem] = []
    if node.get("path", "") == "":
        out.append((f"{field}.path", "device path must not be empty", "device-path"))
    if node.get("type", "") not in ("", "b", "c", "u", "p"):
        out.append((f"{field}.type", f"invalid type {node['type']!r}: expected b, c, u or p", "device-type"))
    for attr in ("major", "minor"):
        if node.get(attr, 0) < 0:  # -1 is a cgroup wildcard: never from a spec
            out.append((f"{field}.{attr}", f"negative device number {node[attr]}", "device-number"))
    perms = node.get("permissions", "")
    if perms != "none" and perms.strip("rwm"):
        out.append((f"{field}.permissions", f"invalid permissions {perms!r}: only r, w, m or 'none'",
                    "permissions"))
    return out


def _hook_problems(hook: dict[str, Any], field: str) -> list[schema.Problem]:
    out: list[schema.Problem] = []
    if hook.get("hookName") not in HOOK_STAGES:
        out.append((f"{field}.hookName", f"unknown hook name {hook.get('hookName')!r}: expected one of "
                    + ", ".join(HOOK_STAGES), "hook-name"))
    if hook.get("path", "") == "":
        out.append((f"{field}.path", "hook path must not be empty", "hook-path"))
    return out + _env_problems(hook.get("env", []), f"{field}.env")


def _rdt_problems(rdt: dict[str, Any], field: str) -> list[schema.Problem]:
    clos = rdt.get("closID", "")
    if clos in ("", "/"):
        return []
    if clos in (".", "..") or "/" in clos or "\n" in clos or len(clos) >= 4096:
        reason = f"invalid closID {clos!r}: must be '/' or a plain file name"
        return [(f"{field}.closID", reason, "rdt-closid")]
    return []


def _net_problems(nets: list[dict[str, Any]], field: str) -> list[schema.Problem]:
    out: list[schema.Problem] = []
    for attr in ("hostInterfaceName", "name"):
        seen: set[str] = set()
        for i, net in enumerate(nets):
            value = net.get(attr, "")
            if value == "":
                out.append((f"{field}[{i}].{attr}", "must not be empty", "netdev"))
            elif value in seen:
                out.append((f"{field}[{i}].{attr}", f"duplicate {attr} {value!r}", "netdev"))
            seen.add(value)
    return out


def _edits_problems(edits: dict[str, Any], field: str) -> list[schema.Problem]:
    out = _env_problems(edits.get("env", []), f"{field}.env")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        out += _node_problems(node, f"{field}.deviceNodes[{i}]")
    for i, mount in enumerate(edits.get("mounts", [])):
        for attr in ("hostPath", "containerPath"):
            if mount.get(attr) == "":
                out.append((f"{field}.mounts[{i}].{attr}", "must not be empty", "mount"))
    for i, hook in enumerate(edits.get("hooks", [])):
        out += _hook_problems(hook, f"{field}.hooks[{i}]")
    if "intelRdt" in edits:
        out += _rdt_problems(edits["intelRdt"], f"{field}.intelRdt")
    return out + _net_problems(edits.get("netDevices", []), f"{field}.netDevices")


def _version_problems(raw: dict[str, Any]) -> list[schema.Problem]:
    declared = raw.get("cdiVersion")
    if declared is None:
        return []
    current = version.normalize(declared)
    if current is None:
        return [("cdiVersion", f"invalid version {declared!r}: expected one of "
                 + ", ".join(version.KNOWN_VERSIONS[:-2]), "version")]
    if version.version_key(current) < version.version_key(version.EARLIEST):
        return [("cdiVersion", f"version {declared!r} is too old: at least {version.EARLIEST}", "version")]
    needed, field = version.required_version(raw)
    if version.version_key(current) < version.version_key(needed):
        reason = f"needs cdiVersion >= {needed}, spec declares {declared}"
        return [(field or "cdiVersion", reason, "min-version")]
    return []


def _raw_edits_empty(edits: dict[str, Any]) -> bool:
    """The reference's "empty edits": no env, nodes, hooks, mounts, gids, net devices, intelRdt."""
    return "intelRdt" not in edits and not any(
        edits.get(k) for k in ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices"))


def _device_problems(raw: dict[str, Any]) -> list[schema.Problem]:
    out: list[schema.Problem] = []
    devices = raw.get("devices")
    if devices is not None and not devices:
        out.append(("devices", "a spec needs at least one device", "no-devices"))
    seen: dict[str, int] = {}
    for i, dev in enumerate(devices or ()):
        name = dev.get("name")
        if name is not None:
            problem = names.device_name_problem(name)
            if problem:
                out.append((f"devices[{i}].name", problem, "device-name"))
            elif name in seen:
                out.append((f"devices[{i}].name", f"duplicate device {name!r} (also devices[{seen[name]}])",
                            "unique-name"))
            seen.setdefault(name, i)
        if "containerEdits" in dev:
            field = f"devices[{i}].containerEdits"
            if _raw_edits_empty(dev["containerEdits"]):
                out.append((field, "a device needs non-empty containerEdits", "empty-edits"))
            out += _edits_problems(dev["containerEdits"], field)
    return out


def spec_problems(data: bytes, source: str) -> tuple[dict[str, Any] | None, list[SpecError]]:
    """Decode and validate; return the checked raw spec (None on any problem) and every problem."""
    try:
        document = decode(data, source)
    except SpecError as exc:
        return None, [exc]
    return document_problems(document, source)


def document_problems(document: Any, source: str) -> tuple[dict[str, Any] | None, list[SpecError]]:
    """Validate already decoded data (a fresh file or a cached body): checked raw spec or problems."""
    if document is None:
        return None, [SpecError(source, "", "empty document: no spec data", "empty")]
    found: list[schema.Problem] = []
    raw = schema.check(document, schema.SPEC, "", found)
    if not schema.is_missing(raw):
        kind = raw.get("kind")
        if kind is not None:
            try:
                names.parse_kind(kind)
            except InputError as exc:
                found.append(("kind", exc.reason, "kind"))
        found += _version_problems(raw)
        found += _edits_problems(raw.get("containerEdits", {}), "containerEdits")
        found += _device_problems(raw)
    errors = [SpecError(source, f, reason, rule) for f, reason, rule in found]
    return (None if errors else raw), errors


def validate_raw(data: bytes, source: str) -> dict[str, Any]:
    """The checked raw spec; raises the first SpecError (with the count of others as a note)."""
    raw, errors = spec_problems(data, source)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} more problem(s) in {source}")
        raise first
    assert raw is not None
    return raw


def spec_from_raw(raw: dict[str, Any], source: str, priority: int) -> Spec:
    """Build the frozen Spec from an already checked raw spec (from ``validate_raw`` or the cache)."""
    kind = raw["kind"]
    spec_edits = schema.edits_from_raw(raw.get("containerEdits"), source, "containerEdits")
    devices = tuple(device_from_raw(raw, i, source, priority, spec_edits) for i in range(len(raw["devices"])))
    return Spec(source=source, priority=priority, version=raw["cdiVersion"], kind=kind,
                annotations=dict(raw.get("annotations", {})), edits=spec_edits, devices=devices)


def device_from_raw(raw: dict[str, Any], index: int, source: str, priority: int,
                    spec_edits: ContainerEdits) -> Device:
    """Build one Device of a checked raw spec (the registry builds only the devices asked for)."""
    d = raw["devices"][index]
    edits = schema.edits_from_raw(d["containerEdits"], source, f"devices[{index}].containerEdits")
    return Device(name=d["name"], kind=raw["kind"], source=source, priority=priority,
                  annotations=dict(d.get("annotations", {})), spec_edits=spec_edits, edits=edits)


def parse_spec(data: bytes, source: str, priority: int) -> Spec:
    """Strictly parse and validate one spec file's bytes (``source`` labels errors)."""
    return spec_from_raw(validate_raw(data, source), source, priority)
