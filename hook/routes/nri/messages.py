"""The subset of ``nri.pkg.api.v1alpha1`` the daemon reads and writes, by field number.

Rule: decode into small frozen values (only the fields a decision or a check reads), encode the
few answers the daemon gives. Field numbers are those of NRI's ``pkg/api/api.proto``; proto3
ignores unknown fields both ways, so one subset serves every NRI version the runtimes speak.
A message that does not decode is a ``ValueError`` (the caller answers with an error status).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hook.core.plan import Node
from hook.core.protowire import Fields, decode, enc_bool, enc_int, enc_msg, enc_text
from hook.core.record import field, record
from hook.core.rules import Rule

__all__ = [
    "CREATE_CONTAINER",
    "REMOVE_CONTAINER",
    "START_CONTAINER",
    "STOP_CONTAINER",
    "CgroupRule",
    "Configure",
    "Container",
    "Device",
    "Event",
    "Pod",
    "Sync",
    "adjustment",
    "configured",
    "event",
    "events_mask",
    "parse_configure",
    "parse_sync",
    "register",
    "state_change",
    "synchronized",
]

# enum Event
CREATE_CONTAINER, START_CONTAINER, STOP_CONTAINER, REMOVE_CONTAINER = 4, 6, 10, 11


@record
class Pod:
    id: str = ""
    name: str = ""
    uid: str = ""
    namespace: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)


@record
class Device:
    path: str
    type: str
    major: int
    minor: int
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@record
class CgroupRule:
    allow: bool
    type: str
    major: int | None
    minor: int | None
    access: str


@record
class Mount:
    destination: str
    type: str
    source: str
    options: tuple[str, ...] = ()


@record
class Container:
    id: str = ""
    pod_sandbox_id: str = ""
    name: str = ""
    state: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
    rules: tuple[CgroupRule, ...] = ()
    cgroups_path: str = ""
    pid: int = 0
    cdi_devices: tuple[str, ...] = ()


@record
class Event:
    """A container event (Create/Start/Stop/RemoveContainer, or a StateChange)."""

    kind: int
    pod: Pod
    container: Container


@record
class Configure:
    config: str = ""
    runtime_name: str = ""
    runtime_version: str = ""
    nri_version: str = ""  # NRI_version: sent by newer runtimes only ("": unknown)
    request_timeout_ms: int = 0


@record
class Sync:
    pods: tuple[Pod, ...]
    containers: tuple[Container, ...]
    more: bool = False


def _pod(f: Fields | None) -> Pod:
    if f is None:
        return Pod()
    return Pod(id=f.text(1), name=f.text(2), uid=f.text(3), namespace=f.text(4), annotations=f.string_map(6))


def _device(f: Fields) -> Device:
    return Device(
        path=f.text(1),
        type=f.text(2),
        major=f.int64(3),
        minor=f.int64(4),
        file_mode=f.optional(5),
        uid=f.optional(6),
        gid=f.optional(7),
    )


_kept_devices: dict[bytes, Device] = {}
MAX_KEPT_DEVICES = 4096  # a 64 GPU + 224 MIG node's privileged container holds ~520


def _device_of(raw: bytes) -> Device:
    """The device a LinuxDevice message's bytes decode to. Kept by those bytes (a value of them
    alone, frozen): every privileged container of a node carries the same few hundred, and a
    container's decode is then one lookup per device. Bounded: cleared when full."""
    found = _kept_devices.get(raw)
    if found is None:
        found = _device(decode(raw))
        if len(_kept_devices) >= MAX_KEPT_DEVICES:
            _kept_devices.clear()
        _kept_devices[raw] = found
    return found


def _rule(f: Fields) -> CgroupRule:
    return CgroupRule(
        allow=f.flag(1), type=f.text(2), major=f.optional(3), minor=f.optional(4), access=f.text(5)
    )


def _container(f: Fields | None) -> Container:
    if f is None:
        return Container()
    linux = f.message(11)
    devices: tuple[Device, ...] = ()
    rules: tuple[CgroupRule, ...] = ()
    cgroups_path = ""
    if linux is not None:
        devices = tuple(map(_device_of, linux.raws(2)))
        resources = linux.message(3)
        if resources is not None:
            rules = tuple(_rule(r) for r in resources.messages(7))
        cgroups_path = linux.text(5)
    mounts = tuple(Mount(destination=m.text(1), type=m.text(2), source=m.text(3), options=tuple(m.texts(4)))
                   for m in f.messages(9))  # fmt: skip
    return Container(
        id=f.text(1),
        pod_sandbox_id=f.text(2),
        name=f.text(3),
        state=f.uint(4),
        annotations=f.string_map(6),
        args=tuple(f.texts(7)),
        env=tuple(f.texts(8)),
        mounts=mounts,
        devices=devices,
        rules=rules,
        cgroups_path=cgroups_path,
        pid=f.uint(12),
        cdi_devices=tuple(d.text(1) for d in f.messages(20)),
    )


def event(kind: int, payload: bytes) -> Event:
    """Create/Start/Stop/RemoveContainerRequest: pod=1, container=2."""
    f = decode(payload)
    return Event(kind=kind, pod=_pod(f.message(1)), container=_container(f.message(2)))


def state_change(payload: bytes) -> Event:
    """StateChangeEvent: event=1, pod=2, container=3."""
    f = decode(payload)
    return Event(kind=f.uint(1), pod=_pod(f.message(2)), container=_container(f.message(3)))


def parse_configure(payload: bytes) -> Configure:
    f = decode(payload)
    return Configure(
        config=f.text(1),
        runtime_name=f.text(2),
        runtime_version=f.text(3),
        request_timeout_ms=f.int64(5),
        nri_version=f.text(6),
    )


def parse_sync(payload: bytes) -> Sync:
    f = decode(payload)
    return Sync(
        pods=tuple(_pod(p) for p in f.messages(1)),
        containers=tuple(_container(c) for c in f.messages(2)),
        more=f.flag(3),
    )


def events_mask(events: Sequence[int]) -> int:
    """ConfigureResponse.events: bit ``event - 1`` per subscribed event."""
    mask = 0
    for e in events:
        mask |= 1 << (e - 1)
    return mask


def register(name: str, index: str) -> bytes:
    """RegisterPluginRequest{plugin_name=1, plugin_idx=2}."""
    return enc_text(1, name) + enc_text(2, index)


def configured(events: Sequence[int]) -> bytes:
    """ConfigureResponse{events=2}."""
    return enc_int(2, events_mask(events))


def synchronized(more: bool) -> bytes:
    """SynchronizeResponse{more=2}: no updates; ``more`` echoes the request's (we take every page)."""
    return enc_bool(2, more)


def _enc_device(n: Node) -> bytes:
    return (
        enc_text(1, n.path)
        + enc_text(2, n.type)
        + enc_int(3, n.major)
        + enc_int(4, n.minor)
        + enc_msg(5, enc_int(1, n.file_mode))
        + enc_msg(6, enc_int(1, n.uid))
        + enc_msg(7, enc_int(1, n.gid))
    )


def _enc_rule(r: Rule) -> bytes:
    body = enc_bool(1, r.allow) + enc_text(2, str(r.type))
    if r.major is not None:
        body += enc_msg(3, enc_int(1, r.major))
    if r.minor is not None:
        body += enc_msg(4, enc_int(1, r.minor))
    return body + enc_text(5, str(r.access))


def adjustment(create: Sequence[Node], rules: Sequence[Rule]) -> bytes:
    """CreateContainerResponse{adjust=1: ContainerAdjustment{linux=6: {devices=1, resources=2:
    LinuxResources{devices=7}}}}; empty when there is nothing to adjust."""
    linux = b"".join(enc_msg(1, _enc_device(n)) for n in create)
    if rules:
        linux += enc_msg(2, b"".join(enc_msg(7, _enc_rule(r)) for r in rules))
    return enc_msg(1, enc_msg(6, linux)) if linux else b""
