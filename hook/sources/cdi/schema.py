"""The CDI spec schema as data: exact keys, JSON types, required fields; raw dicts → values.

Rule: every object in a spec is checked against one table below; an unknown key, a missing
required key or a wrong type is a problem at a dotted field path (``devices[2].name``).
``null`` for an optional key means "absent", as Go's zero value does. Values are converted as
the reference's YAML-to-JSON step does against the Go types: a number or boolean where a string
is wanted becomes its Go text (``0`` → ``"0"``, ``1.0`` → ``"1"``), an integral float fills an
integer field, and keys match fields case-insensitively (``CDIVersion``). The checked document is
plain JSON data again, so the parsed-spec cache can store it; ``edits_from_raw`` trusts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits, Hook, IntelRdt, Mount, NetDevice
from hook.sources.cdi.yamlv2 import go_float32

__all__ = ["Problem", "check", "SPEC", "edits_from_raw"]

Problem = tuple[str, str, str]  # (field, reason, rule)

INT64: Final = (-(2**63), 2**63 - 1)
UINT32: Final = (0, 2**32 - 1)


_INT_RANGE: Final = (-(2**63), 2**64 - 1)  # what go-yaml v2 yields as an int (larger: big.Int)


def _str(v: Any) -> tuple[Any, str | None]:
    """A string field: numbers and booleans become their Go text (sigs.k8s.io/yaml's conversion)."""
    if isinstance(v, str):
        return v, None
    if isinstance(v, bool):
        return ("true" if v else "false"), None
    if isinstance(v, int) and _INT_RANGE[0] <= v <= _INT_RANGE[1]:
        return str(v), None
    if isinstance(v, float):
        return go_float32(v), None
    return v, "expected a string"


def _int(bounds: tuple[int, int]) -> Callable[[Any], tuple[Any, str | None]]:
    def checker(v: Any) -> tuple[Any, str | None]:
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
            v = int(v)  # Go's JSON writes 5.0 as 5, which an integer field takes
        if isinstance(v, bool) or not isinstance(v, int):
            return v, "expected an integer"
        if not bounds[0] <= v <= bounds[1]:
            return v, f"{v} is out of range {bounds[0]}..{bounds[1]}"
        return v, None
    return checker


def _bool(v: Any) -> tuple[Any, str | None]:
    return v, None if isinstance(v, bool) else "expected true or false"


# A schema node is a scalar checker, ("list", item), ("map", value-checker) or ("obj", keys, required).
Schema = Any
_S: Final = _str
_I64: Final = _int(INT64)
_U32: Final = _int(UINT32)
STRLIST: Final = ("list", _S)
STRMAP: Final = ("map", _S)

DEVICE_NODE: Final = ("obj", {"path": _S, "hostPath": _S, "type": _S, "major": _I64, "minor": _I64,
                              "fileMode": _U32, "permissions": _S, "uid": _U32, "gid": _U32}, ("path",))
MOUNT: Final = ("obj", {"hostPath": _S, "containerPath": _S, "options": STRLIST, "type": _S},
                ("hostPath", "containerPath"))
HOOK: Final = ("obj", {"hookName": _S, "path": _S, "args": STRLIST, "env": STRLIST, "timeout": _U32},
               ("hookName", "path"))
NET_DEVICE: Final = ("obj", {"hostInterfaceName": _S, "name": _S}, ("hostInterfaceName", "name"))
INTEL_RDT: Final = ("obj", {"closID": _S, "l3CacheSchema": _S, "memBwSchema": _S, "schemata": STRLIST,
                            "enableMonitoring": _bool}, ())
EDITS: Final = ("obj", {"env": STRLIST, "deviceNodes": ("list", DEVICE_NODE),
                        "netDevices": ("list", NET_DEVICE),
                        "hooks": ("list", HOOK), "mounts": ("list", MOUNT), "intelRdt": INTEL_RDT,
                        "additionalGids": ("list", _U32)}, ())
DEVICE: Final = ("obj", {"name": _S, "annotations": STRMAP, "containerEdits": EDITS},
                 ("name", "containerEdits"))
SPEC: Final = ("obj", {"cdiVersion": _S, "kind": _S, "annotations": STRMAP, "devices": ("list", DEVICE),
                       "containerEdits": EDITS}, ("cdiVersion", "kind", "devices"))

_MISSING = object()


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def check(value: Any, schema: Schema, field: str, problems: list[Problem]) -> Any:
    """Check ``value`` against ``schema``; return the cleaned value (nulls dropped) or _MISSING."""
    if callable(schema):
        value, reason = schema(value)
        if reason:
            problems.append((field, reason, "type"))
            return _MISSING
        return value
    tag = schema[0]
    if tag == "list":
        if not isinstance(value, list):
            problems.append((field, "expected a list", "type"))
            return _MISSING
        items = [check(v, schema[1], f"{field}[{i}]", problems) for i, v in enumerate(value)]
        return [v for v in items if v is not _MISSING]
    if tag == "map":
        if not isinstance(value, dict):
            problems.append((field, "expected a mapping", "type"))
            return _MISSING
        out = {str(k): check(v, schema[1], f"{field}[{str(k)!r}]", problems) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _MISSING}
    return _check_object(value, schema, field, problems)


def _fold(key: str) -> str:
    """Go's JSON field matching folds case (and the Kelvin sign and long s, as Unicode does)."""
    return key.replace("\u212a", "k").replace("\u017f", "s").lower()


def _field_for(key: str, keys: dict[str, Any]) -> str | None:
    if key in keys:
        return key
    folded = _fold(key)
    return next((k for k in keys if k.lower() == folded), None)


def _check_object(value: Any, schema: Schema, field: str, problems: list[Problem]) -> Any:
    """An object as Go's JSON decoding fills a struct: keys in sorted order, matched exactly or
    case-insensitively (the last of two spellings wins), unknown keys refused, null = absent."""
    _, keys, required = schema
    if not isinstance(value, dict):
        problems.append((field, "expected a mapping", "type"))
        return _MISSING
    out: dict[str, Any] = {}
    present: set[str] = set()
    exact = keys.keys() >= value.keys()  # the usual case: no other spellings, order cannot matter
    for key in (value if exact else sorted(value)):
        item = value[key]
        name = key if exact else _field_for(key, keys)
        if name is None:
            problems.append((_join(field, str(key)), f"unknown field {key!r}", "strict-keys"))
            continue
        if item is None:
            continue
        present.add(name)
        checked = check(item, keys[name], _join(field, name), problems)
        if checked is not _MISSING:
            out[name] = checked
    for key in required:
        if key not in present:
            problems.append((_join(field, key), "required field is missing", "required"))
    return out


def is_missing(value: Any) -> bool:
    return value is _MISSING


def _node(raw: dict[str, Any], source: str, field: str) -> CdiDeviceNode:
    return CdiDeviceNode(
        path=raw["path"], host_path=raw.get("hostPath", ""), type=raw.get("type") or None,
        major=raw.get("major"), minor=raw.get("minor"), permissions=raw.get("permissions", ""),
        file_mode=raw.get("fileMode"), uid=raw.get("uid"), gid=raw.get("gid"), source=source, field=field)


def edits_from_raw(raw: dict[str, Any] | None, source: str = "", field: str = "") -> ContainerEdits:
    """Build ContainerEdits from a *checked* raw ``containerEdits`` object (no validation here)."""
    if not raw:
        return ContainerEdits()
    rdt = raw.get("intelRdt")
    return ContainerEdits(
        env=tuple(raw.get("env", ())),
        device_nodes=tuple(_node(n, source, f"{field}.deviceNodes[{i}]")
                           for i, n in enumerate(raw.get("deviceNodes", ()))),
        net_devices=tuple(NetDevice(host_interface_name=n["hostInterfaceName"], name=n["name"])
                          for n in raw.get("netDevices", ())),
        mounts=tuple(Mount(host_path=m["hostPath"], container_path=m["containerPath"],
                           options=tuple(m.get("options", ())), type=m.get("type", ""))
                     for m in raw.get("mounts", ())),
        hooks=tuple(Hook(hook_name=h["hookName"], path=h["path"], args=tuple(h.get("args", ())),
                         env=tuple(h.get("env", ())), timeout=h.get("timeout"))
                    for h in raw.get("hooks", ())),
        intel_rdt=None if rdt is None else IntelRdt(
            clos_id=rdt.get("closID", ""), l3_cache_schema=rdt.get("l3CacheSchema", ""),
            mem_bw_schema=rdt.get("memBwSchema", ""), schemata=tuple(rdt.get("schemata", ())),
            enable_monitoring=rdt.get("enableMonitoring", False)),
        additional_gids=tuple(raw.get("additionalGids", ())),
    )
