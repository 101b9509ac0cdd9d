"""The kubelet's DRA state (``dra_manager_state``): which resource claims a pod holds, with the CDI
devices each claim's driver prepared.

Rule: since Kubernetes 1.31 the kubelet passes DRA devices to the engine only as CDI names in the
CRI request, so nothing in config.json says where the injected nodes came from; this file is the
one node-local record of it. It is evidence like the device-plugin checkpoint: a missing file
means no DRA on this node, and a file that cannot be read or trusted (truncated, oversized, a
checksum that does not match) is reported and nothing is decided from it. Parsing takes bytes.

Formats (kubernetes ``pkg/kubelet/cm/dra/state``, the kubelet's DRA checkpoint): 1.31 and later
write ``{"Data": "<JSON text>", "Checksum": <uint32>}``, the checksum being CRC-32 (IEEE) of the
``Data`` text, the claims under ``Entries``
(newer kubelets: ``ClaimInfoStateList``). 1.27-1.30 wrote ``{"version": "v1", "entries": [...],
"checksum": N}`` whose checksum hashes Go's own dump of the structs: it is read but cannot be
verified here, so such a state is ``unverified``.
"""

from __future__ import annotations

import json

from hook.core.claims import FILE_NAME, Claim, DraDevice, DraState, DraView, default_path
from hook.core.errors import InputError

__all__ = [
    "FILE_NAME",
    "MAX_BYTES",
    "DraDevice",
    "Claim",
    "DraState",
    "DraView",
    "default_path",
    "parse_state",
    "claims_of",
]

MAX_BYTES = 64 << 20
KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"
LIST_KEYS = ("Entries", "ClaimInfoStateList")  # 1.31-1.33; the newest kubelets

def _strs(value: object, source: str, field: str) -> tuple[str, ...]:
    """A JSON list of strings; null (Go's nil slice) is empty."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(source, field, "expected a list of strings")
    return tuple(value)


def _str(obj: dict[str, object], key: str, source: str, field: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(source, f"{field}.{key}", "expected a string")
    return value


def _pod_uids(value: object, source: str, field: str) -> tuple[str, ...]:
    """Go's ``sets.Set[string]``: a JSON object of uid to ``{}``."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError(source, field, "expected a set of pod UIDs (an object)")
    return tuple(sorted(str(k) for k in value))


def _devices(value: object, source: str, field: str) -> tuple[DraDevice, ...]:
    """``DriverState``: driver name to ``{"Devices": [...]}``."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError(source, field, "expected a map of driver to its state")
    out: list[DraDevice] = []
    for driver in sorted(value):
        state = value[driver]
        where = f"{field}[{driver}]"
        if state is None:
            continue
        if not isinstance(state, dict):
            raise InputError(source, where, "expected an object")
        devices = state.get("Devices")
        if devices is None:
            continue
        if not isinstance(devices, list):
            raise InputError(source, f"{where}.Devices", "expected a list")
        for i, d in enumerate(devices):
            at = f"{where}.Devices[{i}]"
            if not isinstance(d, dict):
                raise InputError(source, at, "expected an object")
            out.append(
                DraDevice(
                    driver=str(driver),
                    pool=_str(d, "PoolName", source, at),
                    device=_str(d, "DeviceName", source, at),
                    requests=_strs(d.get("RequestNames"), source, f"{at}.RequestNames"),
                    cdi_ids=_strs(d.get("CDIDeviceIDs"), source, f"{at}.CDIDeviceIDs"),
                )
            )
    return tuple(out)


def _legacy_devices(value: object, source: str, field: str) -> tuple[DraDevice, ...]:
    """1.30's ``CDIDevices``: driver name to its CDI names (no pool or device names then)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InputError(source, field, "expected a map of driver to CDI names")
    return tuple(
        DraDevice(
            driver=str(drv),
            pool="",
            device="",
            requests=(),
            cdi_ids=_strs(value[drv], source, f"{field}[{drv}]"),
        )
        for drv in sorted(value)
    )


def _claim(e: object, source: str, field: str, legacy: bool) -> Claim:
    if not isinstance(e, dict):
        raise InputError(source, field, "expected an object")
    devices = (
        _legacy_devices(e.get("CDIDevices"), source, f"{field}.CDIDevices")
        if legacy
        else _devices(e.get("DriverState"), source, f"{field}.DriverState")
    )
    return Claim(
        uid=_str(e, "ClaimUID", source, field),
        name=_str(e, "ClaimName", source, field),
        namespace=_str(e, "Namespace", source, field),
        pod_uids=_pod_uids(e.get("PodUIDs"), source, f"{field}.PodUIDs"),
        devices=devices,
    )


def _mine(e: object, pod_uid: str | None) -> bool:
    """Whether a raw entry is to be decoded: every entry without ``pod_uid``; else the pod's own
    and any malformed one (decoded, so reported): other pods' claims cost no records."""
    if pod_uid is None or not isinstance(e, dict):
        return True
    uids = e.get("PodUIDs")
    return not isinstance(uids, dict) or pod_uid in uids


def _current(outer: dict[str, object], source: str, pod_uid: str | None) -> DraState:
    data, checksum = outer.get("Data"), outer.get("Checksum")
    if not isinstance(data, str):
        raise InputError(source, "Data", "expected the checkpoint's JSON text")
    if not isinstance(checksum, int) or isinstance(checksum, bool):
        raise InputError(source, "Checksum", "expected an unsigned 32-bit integer")
    try:
        raw = data.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(source, "Data", "not UTF-8 text") from None
    import zlib  # only pods on a DRA node pay for it

    actual = zlib.crc32(raw) & 0xFFFFFFFF
    if actual != checksum:
        raise InputError(source, "Checksum", f"checksum mismatch ({checksum}, the data's CRC-32 is {actual})")
    try:
        inner = json.loads(data)
    except ValueError as exc:
        raise InputError(source, "Data", f"not valid JSON ({exc})") from None
    if not isinstance(inner, dict):
        raise InputError(source, "Data", "expected an object")
    for key, want in (("kind", KIND), ("apiVersion", API_VERSION)):
        if inner.get(key, want) != want:
            raise InputError(source, f"Data.{key}", f"expected {want!r}, got {inner.get(key)!r}")
    present = [k for k in LIST_KEYS if inner.get(k) is not None]
    if len(present) > 1:
        raise InputError(source, "Data", f"both {' and '.join(present)}: cannot tell which the kubelet reads")
    key = present[0] if present else LIST_KEYS[0]
    entries = inner.get(key) or []
    if not isinstance(entries, list):
        raise InputError(source, f"Data.{key}", "expected a list")
    claims = tuple(
        _claim(e, source, f"Data.{key}[{i}]", False) for i, e in enumerate(entries) if _mine(e, pod_uid)
    )
    return DraState(claims=claims, verified=True)


def _legacy(outer: dict[str, object], source: str, pod_uid: str | None) -> DraState:
    if outer.get("version") != "v1":
        raise InputError(source, "version", f"expected 'v1', got {outer.get('version')!r}")
    entries = outer.get("entries") or []
    if not isinstance(entries, list):
        raise InputError(source, "entries", "expected a list")
    claims = tuple(
        _claim(e, source, f"entries[{i}]", True) for i, e in enumerate(entries) if _mine(e, pod_uid)
    )
    return DraState(claims=claims, verified=False)


def parse_state(data: bytes, source: str, pod_uid: str | None = None) -> DraState:
    """Every claim in the file (with ``pod_uid``: that pod's only, the checksum still covering the
    whole file), or an ``InputError`` naming the field; the 1.30 format is ``verified=False`` (its
    checksum hashes Go's dump of the structs)."""
    try:
        outer = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(source, "", f"not valid JSON ({exc})") from None
    if not isinstance(outer, dict):
        raise InputError(source, "", "expected an object")
    if "Data" in outer or "Checksum" in outer:
        return _current(outer, source, pod_uid)
    if "version" in outer or "entries" in outer:
        return _legacy(outer, source, pod_uid)
    raise InputError(
        source, "", "neither the 1.31+ format (Data, Checksum) nor the 1.30 one (version, entries)"
    )


def claims_of(state: DraState, pod_uid: str) -> tuple[Claim, ...]:
    """The claims whose ``PodUIDs`` hold this pod, in file order."""
    if not pod_uid:
        return ()
    return tuple(c for c in state.claims if pod_uid in c.pod_uids)
