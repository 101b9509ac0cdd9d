"""OCI inputs: the runtime state (stdin) and the bundle's config.json, parsed once into values.

Rule: parsers take bytes and a ``source`` label, never paths, and either return a frozen value
or raise ``InputError`` naming the file and the JSON field. Nothing downstream sees a raw dict,
except ``OciConfig.raw`` which only ``--output-config`` uses to write the config back.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping

from hook.core.errors import InputError
from hook.core.record import field, record
from hook.core.rules import Access, DeviceType, Rule, rule_number

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_STATE_BYTES",
    "MAX_CONFIG_BYTES",
    "OciState",
    "Mount",
    "LinuxDevice",
    "OciConfig",
    "parse_state", "parse_state_object",
    "parse_config",
    "parse_config_object",
    "load_json_object",
    "parse_rule",
    "rule_number",
    "RULE_NUMBER_LIMIT",
]

MAX_STATE_BYTES = 1 << 20
MAX_CONFIG_BYTES = 16 << 20


@record
class OciState:
    oci_version: str
    id: str
    status: str
    pid: int | None
    bundle: str
    annotations: Mapping[str, str]


@record
class Mount:
    destination: str
    source: str
    type: str
    options: tuple[str, ...]


@record
class LinuxDevice:
    path: str
    type: str
    major: int
    minor: int
    file_mode: int | None
    uid: int | None
    gid: int | None


@record
class OciConfig:
    source: str
    oci_version: str
    env: Mapping[str, str]
    env_order: tuple[str, ...]
    bounding: frozenset[str]
    root_path: str
    mounts: tuple[Mount, ...]
    devices: tuple[LinuxDevice, ...]
    resource_rules: tuple[Rule, ...]
    annotations: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    cgroups_path: str = ""  # linux.cgroupsPath as written: /abs, rel/ative or slice:prefix:name
    bundle: str = ""  # where runc resolves relative bind sources; "" when unknown (precreate)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


MAX_DEPTH = 10_000  # Go's encoding/json (runc, crun's parsers are laxer still) stops here


def load_json_object(data: bytes, source: str, limit: int) -> dict[str, Any]:
    """Decode one JSON object, refusing oversize input before parsing it.

    Whatever runc accepts must decode here too, or a container that asks for nothing would be
    refused: invalid UTF-8 (Go substitutes U+FFFD), an integer past Python's 4,300-digit limit
    (kept as a float: only a field the hook reads can then be wrong, and it says which), nesting
    deeper than Python's recursion limit (decoded on a thread with room for ``MAX_DEPTH``).
    """
    if len(data) > limit:
        raise InputError(source, "", f"larger than {limit} bytes")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        obj = _lenient(data, source, exc)
    if not isinstance(obj, dict):
        raise InputError(source, "", "expected a JSON object")
    return obj


def _big_int(digits: str) -> int | float:
    try:
        return int(digits)
    except ValueError:  # past sys.get_int_max_str_digits(): what Go's interface{} would hold
        return float(digits)


def _lenient(data: bytes, source: str, first: BaseException) -> Any:
    """The second, Go-like attempt; the first error is the one reported if this fails too."""
    text = data.decode("utf-8", "replace")
    try:
        return json.loads(text, parse_int=_big_int)
    except RecursionError:
        pass
    except ValueError:
        raise InputError(source, "", f"not valid JSON ({_short(first)})") from None
    result: list[Any] = []

    def run() -> None:
        import sys

        old = sys.getrecursionlimit()
        sys.setrecursionlimit(old + 2 * MAX_DEPTH + 100)
        try:
            result.append(json.loads(text, parse_int=_big_int))
        except (ValueError, RecursionError) as exc:
            result.append(exc)
        finally:
            sys.setrecursionlimit(old)

    import threading

    size = threading.stack_size(256 << 20)
    try:
        worker = threading.Thread(target=run, name="deep-json")
        worker.start()
        worker.join()
    finally:
        threading.stack_size(size)
    if not result or isinstance(result[0], BaseException):
        raise InputError(source, "", f"not valid JSON (nested deeper than {MAX_DEPTH} levels)")
    return result[0]


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


def _str(obj: Mapping[str, Any], key: str, source: str, prefix: str = "", default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        what = "missing" if value is None else f"expected string, got {type(value).__name__}"
        raise InputError(source, prefix + key, what)
    return value


def _str_map(value: Any, source: str, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(source, name, "expected an object of strings")
    for k, v in value.items():
        if not isinstance(v, str):
            raise InputError(source, f"{name}.{k}", "expected string")
    return dict(value)


def parse_state(data: bytes, source: str) -> OciState:
    """Parse the state a runtime writes to a hook's stdin (tolerating ``bundlePath`` and crun's ``root``)."""
    return parse_state_object(load_json_object(data, source, MAX_STATE_BYTES), source)


def parse_state_object(obj: dict[str, Any], source: str) -> OciState:
    """``parse_state`` on an already decoded object (the one the fast path decoded)."""
    bundle = obj.get("bundle", obj.get("bundlePath"))
    if not isinstance(bundle, str) or not bundle:
        raise InputError(source, "bundle", "missing" if bundle is None else "expected a non-empty string")
    if "\x00" in bundle:
        raise InputError(source, "bundle", "contains a NUL byte")
    pid = obj.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid < 0):
        raise InputError(source, "pid", "expected a non-negative integer")
    return OciState(
        oci_version=_str(obj, "ociVersion", source, default=""),
        id=_str(obj, "id", source, default=""),
        status=_str(obj, "status", source, default=""),
        pid=pid or None,
        bundle=bundle,
        annotations=_str_map(obj.get("annotations"), source, "annotations"),
    )


def _parse_env(items: Any, source: str) -> tuple[dict[str, str], tuple[str, ...], list[str]]:
    if items is None:
        return {}, (), []
    if not isinstance(items, list):
        raise InputError(source, "process.env", "expected a list of strings")
    env: dict[str, str] = {}
    order: list[str] = []
    warnings: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(source, f"process.env[{i}]", "expected string")
        key, sep, value = item.partition("=")
        if not sep:
            warnings.append(f"{source}: process.env[{i}]: {item!r} has no '=', ignored")
            continue
        if key in env:
            order.remove(key)
        env[key] = value
        order.append(key)
    return env, tuple(order), warnings


def _parse_bounding(caps: Any, source: str) -> frozenset[str]:
    if caps is None:
        return frozenset()
    if isinstance(caps, list):  # pre-rc5 specs: a flat list means the bounding set too
        names, name = caps, "process.capabilities"
    elif isinstance(caps, dict):
        names, name = caps.get("bounding") or [], "process.capabilities.bounding"
    else:
        raise InputError(source, "process.capabilities", "expected an object or a list")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError(source, name, "expected a list of strings")
    return frozenset(names)


def _opt_int(obj: Mapping[str, Any], key: str, source: str, name: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(source, f"{name}.{key}", "expected integer")
    return value


def _parse_mounts(items: Any, source: str) -> tuple[Mount, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InputError(source, "mounts", "expected a list")
    out = []
    for i, m in enumerate(items):
        name = f"mounts[{i}]"
        if not isinstance(m, dict):
            raise InputError(source, name, "expected an object")
        options = m.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise InputError(source, f"{name}.options", "expected a list of strings")
        out.append(
            Mount(
                destination=_str(m, "destination", source, name + "."),
                source=_str(m, "source", source, name + ".", default=""),
                type=_str(m, "type", source, name + ".", default=""),
                options=tuple(options),
            )
        )
    return tuple(out)


def _parse_devices(items: Any, source: str) -> tuple[LinuxDevice, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InputError(source, "linux.devices", "expected a list")
    out = []
    for i, d in enumerate(items):
        name = f"linux.devices[{i}]"
        if not isinstance(d, dict):
            raise InputError(source, name, "expected an object")
        dtype = _str(d, "type", source, name + ".")
        if dtype not in ("c", "b", "u", "p"):
            raise InputError(source, f"{name}.type", f"unknown device type {dtype!r}")
        major = _opt_int(d, "major", source, name)
        minor = _opt_int(d, "minor", source, name)
        if dtype != "p" and (major is None or minor is None):
            raise InputError(source, f"{name}.{'major' if major is None else 'minor'}", "missing")
        for key, number in (("major", major), ("minor", minor)):
            if number is not None and not 0 <= number < 1 << 32:  # runc: no mkdev of -1 ("wildcards")
                raise InputError(source, f"{name}.{key}", f"{number} is not a device number")
        out.append(
            LinuxDevice(
                path=_str(d, "path", source, name + "."),
                type="c" if dtype == "u" else dtype,
                major=major or 0,
                minor=minor or 0,
                file_mode=_opt_int(d, "fileMode", source, name),
                uid=_opt_int(d, "uid", source, name),
                gid=_opt_int(d, "gid", source, name),
            )
        )
    return tuple(out)


RULE_NUMBER_LIMIT = 1 << 31  # past it runc refuses or never matches, crun wraps to another int


def _rule_int(obj: Mapping[str, Any], key: str, source: str, name: str) -> tuple[int | None, bool]:
    """(the number as the runtime matches it, whether runtimes read it alike)."""
    value = _opt_int(obj, key, source, name)
    return rule_number(value), value is None or -RULE_NUMBER_LIMIT <= value < RULE_NUMBER_LIMIT


def parse_rule(d: Any, source: str, name: str) -> Rule:
    """One ``linux.resources.devices`` entry, read the way the runtime applies it.

    Type absent or empty means ``a`` and a negative number means ``*`` (``rule_number``). Where
    runtimes differ, the reading that grants more is taken for an allow and the one that denies
    less for a deny, so the hook never believes a device is closed that a runtime leaves open:
    ``a`` with numbers allows every device in runc (its emulator and the kernel's v1 parser ignore
    the numbers; crun's eBPF keeps them); an empty access is refused by runc (``device access …
    cannot be empty``) and matches nothing in crun's filter; a number outside ``±2^31`` is an
    error or never matches in runc and becomes another 32-bit number in crun (``int major``), so
    it is ``*`` in an allow and the deny is taken to deny nothing.
    """
    if not isinstance(d, dict):
        raise InputError(source, name, "expected an object")
    allow = d.get("allow")
    if not isinstance(allow, bool):
        raise InputError(source, f"{name}.allow", "expected boolean")
    dtype = d.get("type") or "a"
    try:
        kind = DeviceType(dtype)
    except ValueError:
        raise InputError(source, f"{name}.type", f"unknown device type {dtype!r}") from None
    access_text = d.get("access", "")
    if not isinstance(access_text, str):
        raise InputError(source, f"{name}.access", "expected string")
    try:
        access = Access.parse(access_text) if access_text else Access.RWM if allow else Access.NONE
    except ValueError as exc:
        raise InputError(source, f"{name}.access", str(exc)) from None
    major, major_alike = _rule_int(d, "major", source, name)
    minor, minor_alike = _rule_int(d, "minor", source, name)
    if not (major_alike and minor_alike):  # runc: an error or no match; crun: another 32-bit number
        if not allow:
            access = Access.NONE
        major = major if major_alike else None
        minor = minor if minor_alike else None
    if kind is DeviceType.ALL and allow:
        major = minor = None
    return Rule(allow=allow, type=kind, major=major, minor=minor, access=access)



def _section(obj: Mapping[str, Any], key: str, source: str, prefix: str = "") -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(source, prefix + key, "expected an object")
    return value


def parse_config(data: bytes, source: str, bundle: str) -> OciConfig:
    """Parse config.json; ``root.path`` is resolved against the bundle, never the cwd."""
    return parse_config_object(load_json_object(data, source, MAX_CONFIG_BYTES), source, bundle)


def parse_config_object(obj: dict[str, Any], source: str, bundle: str) -> OciConfig:
    """``parse_config`` on an already decoded object (a config the spec writer just built)."""
    process = _section(obj, "process", source)
    linux = _section(obj, "linux", source)
    resources = _section(linux, "resources", source, "linux.")
    env, order, warnings = _parse_env(process.get("env"), source)
    rules_raw = resources.get("devices") or []
    if not isinstance(rules_raw, list):
        raise InputError(source, "linux.resources.devices", "expected a list")
    root = _section(obj, "root", source)
    root_path = _str(root, "path", source, "root.", default="rootfs")
    return OciConfig(
        source=source,
        oci_version=_str(obj, "ociVersion", source, default=""),
        env=env,
        env_order=order,
        bounding=_parse_bounding(process.get("capabilities"), source),
        root_path=posixpath.normpath(posixpath.join(bundle, root_path)),
        mounts=_parse_mounts(obj.get("mounts"), source),
        devices=_parse_devices(linux.get("devices"), source),
        resource_rules=tuple(
            parse_rule(r, source, f"linux.resources.devices[{i}]") for i, r in enumerate(rules_raw)
        ),
        annotations=_str_map(obj.get("annotations"), source, "annotations"),
        warnings=tuple(warnings),
        cgroups_path=_str(linux, "cgroupsPath", source, "linux.", default=""),
        bundle=bundle,
        raw=obj,
    )
