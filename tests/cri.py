"""A small CRI client for the tests: what the kubelet sends a CRI runtime, and nothing more.

Rule: the ``runtime.v1.RuntimeService`` messages are encoded here by hand from the published
field numbers (k8s.io/cri-api ``pkg/apis/runtime/v1/api.proto``): protobuf's wire format is
varints and length-prefixed fields, and a ``map<string, string>`` is a repeated entry message
``{1: key, 2: value}``. grpcio carries the bytes (no serializer: a request is already bytes, an
answer stays bytes). Only the fields a test sets are written; an unset (zero) field is left out,
as protobuf does. The answers are read just as far as the tests need (ids, a container's state).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

SERVICE = "/runtime.v1.RuntimeService/"
# NamespaceMode: POD = 0, CONTAINER = 1, NODE = 2, TARGET = 3
POD, CONTAINER, NODE = 0, 1, 2
# ContainerState: CREATED = 0, RUNNING = 1, EXITED = 2, UNKNOWN = 3
CREATED, RUNNING, EXITED, UNKNOWN = 0, 1, 2, 3


# --- the wire format ----------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # a negative int64 is ten bytes of two's complement
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


def _str(number: int, value: str) -> bytes:
    return _bytes(number, value.encode()) if value else b""


def _strs(number: int, values: Iterable[str]) -> bytes:
    return b"".join(_bytes(number, v.encode()) for v in values)  # repeated: empty items too


def _int(number: int, value: int) -> bytes:
    return _tag(number, 0) + _varint(value) if value else b""


def _msg(number: int, payload: bytes, always: bool = False) -> bytes:
    return _bytes(number, payload) if payload or always else b""


def _map(number: int, values: Mapping[str, str]) -> bytes:
    return b"".join(_bytes(number, _str(1, k) + _str(2, v)) for k, v in sorted(values.items()))


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one message: a varint's int, a length-delimited field's bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(buf):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            size = varint()
            out.append((number, buf[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def _first(buf: bytes, number: int) -> int | bytes | None:
    return next((v for n, v in fields(buf) if n == number), None)


def _text(buf: bytes, number: int) -> str:
    value = _first(buf, number)
    return value.decode() if isinstance(value, bytes) else ""


# --- the messages the tests send ----------------------------------------------------------------


@dataclass(frozen=True)
class PodSpec:
    """``PodSandboxConfig`` as the kubelet fills it for a host-network pod."""

    name: str
    uid: str
    namespace: str
    log_directory: str
    cgroup_parent: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    privileged: bool = False

    def encode(self) -> bytes:
        metadata = _str(1, self.name) + _str(2, self.uid) + _str(3, self.namespace)
        namespaces = _int(1, NODE) + _int(2, CONTAINER) + _int(3, POD)  # network, pid, ipc
        security = _msg(1, namespaces, always=True) + _int(6, int(self.privileged))
        linux = _str(1, self.cgroup_parent) + _msg(2, security, always=True)
        labels = {
            "io.kubernetes.pod.name": self.name,
            "io.kubernetes.pod.namespace": self.namespace,
            "io.kubernetes.pod.uid": self.uid,
            **self.labels,
        }
        return (
            _msg(1, metadata)
            + _str(3, self.log_directory)
            + _map(6, labels)
            + _map(7, self.annotations)
            + _msg(8, linux)
        )


@dataclass(frozen=True)
class ContainerSpec:
    """``ContainerConfig``: what the kubelet sends for one container of a pod, the device plugin's
    answer included (``envs``, ``devices``, ``mounts``, ``annotations``, ``cdi_devices``)."""

    name: str
    image: str
    command: Sequence[str]
    log_path: str
    envs: Sequence[tuple[str, str]] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    devices: Sequence[tuple[str, str, str]] = ()  # (container path, host path, permissions)
    mounts: Sequence[tuple[str, str, bool]] = ()  # (container path, host path, read-only)
    cdi_devices: Sequence[str] = ()
    privileged: bool = False

    def encode(self) -> bytes:
        namespaces = _int(1, NODE) + _int(2, CONTAINER) + _int(3, POD)
        security = _int(2, int(self.privileged)) + _msg(3, namespaces, always=True)
        return (
            _msg(1, _str(1, self.name))
            + _msg(2, _str(1, self.image))
            + _strs(3, self.command)
            + b"".join(_bytes(6, _str(1, k) + _str(2, v)) for k, v in self.envs)
            + b"".join(_bytes(7, _str(1, c) + _str(2, h) + _int(3, int(ro))) for c, h, ro in self.mounts)
            + b"".join(_bytes(8, _str(1, c) + _str(2, h) + _str(3, p)) for c, h, p in self.devices)
            + _map(9, {"io.kubernetes.container.name": self.name})
            + _map(10, self.annotations)
            + _str(11, self.log_path)
            + _msg(15, _msg(2, security, always=True))
            + b"".join(_bytes(17, _str(1, n)) for n in self.cdi_devices)
        )


@dataclass(frozen=True)
class Status:
    state: int
    exit_code: int
    reason: str
    message: str


class Client:
    """The RuntimeService calls a kubelet makes to start and remove a pod, over ``socket``."""

    def __init__(self, socket: Path, timeout: float = 60) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def call(self, method: str, request: bytes) -> bytes:
        stub = self.channel.unary_unary(SERVICE + method)
        answer: bytes = stub(request, timeout=self.timeout)
        return answer

    def version(self) -> str:
        """The runtime's name and version (``VersionResponse`` fields 2 and 3)."""
        answer = self.call("Version", _str(1, "v1"))
        return f"{_text(answer, 2)} {_text(answer, 3)}"

    def run_pod(self, pod: PodSpec, handler: str = "") -> str:
        return _text(self.call("RunPodSandbox", _msg(1, pod.encode()) + _str(2, handler)), 1)

    def create(self, sandbox_id: str, container: ContainerSpec, pod: PodSpec) -> str:
        request = _str(1, sandbox_id) + _msg(2, container.encode()) + _msg(3, pod.encode())
        return _text(self.call("CreateContainer", request), 1)

    def start(self, container_id: str) -> None:
        self.call("StartContainer", _str(1, container_id))

    def status(self, container_id: str) -> Status:
        status = _first(self.call("ContainerStatus", _str(1, container_id)), 1)
        assert isinstance(status, bytes)
        state, code = _first(status, 3), _first(status, 7)
        return Status(
            state=state if isinstance(state, int) else CREATED,
            exit_code=code if isinstance(code, int) else 0,
            reason=_text(status, 10),
            message=_text(status, 11),
        )

    def stop(self, container_id: str, timeout: int = 0) -> None:
        self.call("StopContainer", _str(1, container_id) + _int(2, timeout))

    def remove(self, container_id: str) -> None:
        self.call("RemoveContainer", _str(1, container_id))

    def stop_pod(self, sandbox_id: str) -> None:
        self.call("StopPodSandbox", _str(1, sandbox_id))

    def remove_pod(self, sandbox_id: str) -> None:
        self.call("RemovePodSandbox", _str(1, sandbox_id))
