"""A tiny NRI plugin for the test bed: registers, answers, records; nothing of the project's.

Rule: it proves the bed (tests/live/nribed.py) without the daemon under test: a real containerd
must accept its registration, call it at CreateContainer, apply its adjustment (an env entry) and
refuse a container when it answers an error. The wire, from the published framing: a multiplexer
of ``u32 BE conn id | u32 BE length`` frames over one unix socket (conn 1: the runtime calls the
plugin; conn 2: the plugin calls the runtime), ttrpc messages on each conn (``u32 length | u32
stream | u8 type | u8 flags``, type 1 request, 2 response), protobuf envelopes encoded with
tests/cri.py's helpers. The field numbers are NRI's ``pkg/api/api.proto``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.cri import _bytes, _int, _msg, _str, fields

PLUGIN, RUNTIME = 1, 2  # mux conn ids
CREATE_CONTAINER = 4  # NRI Event


def kv(key: str, value: str) -> bytes:
    return _str(1, key) + _str(2, value)


def env_adjustment(key: str, value: str) -> bytes:
    """``ContainerAdjustment{env: [KeyValue]}`` (field 4)."""
    return _bytes(4, kv(key, value))


@dataclass(frozen=True)
class Seen:
    """What the runtime sent at CreateContainer: the pod's and container's ids and names."""

    pod_uid: str
    container_id: str
    container_name: str
    env: tuple[str, ...]


def _text(buf: bytes, number: int) -> str:
    return next((v.decode() for n, v in fields(buf) if n == number and isinstance(v, bytes)), "")


def _sub(buf: bytes, number: int) -> bytes:
    return next((v for n, v in fields(buf) if n == number and isinstance(v, bytes)), b"")


# An answer to CreateContainer: adjustment bytes, or a str (an error status: the container is refused).
Answer = Callable[[Seen], "bytes | str"]


@dataclass
class Stub:
    """Connects to ``path``, registers as ``idx-name``, answers until ``close()``."""

    path: str
    name: str = "odh-stub"
    idx: str = "50"
    answer: Answer = field(default=lambda seen: b"")
    delay: float = 0.0  # seconds before each CreateContainer answer (a slow plugin)
    seen: list[Seen] = field(default_factory=list)
    configured: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Stub:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)
        self.lock = threading.Lock()
        self.streams: dict[int, bytearray] = {PLUGIN: bytearray(), RUNTIME: bytearray()}
        threading.Thread(target=self._read, daemon=True).start()
        request = _str(1, self.name) + _str(2, self.idx)
        envelope = _str(1, "nri.pkg.api.v1alpha1.Runtime") + _str(2, "RegisterPlugin") + _msg(3, request)
        self._send(RUNTIME, 1, 1, envelope)
        return self

    def close(self) -> None:
        self.closed.set()
        self.sock.close()

    def _send(self, conn: int, stream: int, kind: int, payload: bytes) -> None:
        message = struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
        with self.lock, contextlib.suppress(OSError):  # a dropped plugin answers into a closed socket
            self.sock.sendall(struct.pack(">II", conn, len(message)) + message)

    def _read(self) -> None:
        buf = bytearray()
        while not self.closed.is_set():
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 8:
                conn, size = struct.unpack(">II", buf[:8])
                if len(buf) < 8 + size:
                    break
                self.streams.setdefault(conn, bytearray()).extend(buf[8 : 8 + size])
                del buf[: 8 + size]
                self._messages(conn)
        self.closed.set()

    def _messages(self, conn: int) -> None:
        data = self.streams[conn]
        while len(data) >= 10:
            size, stream, kind, _flags = struct.unpack(">IIBB", data[:10])
            if len(data) < 10 + size:
                return
            payload = bytes(data[10 : 10 + size])
            del data[: 10 + size]
            if conn == PLUGIN and kind == 1:
                threading.Thread(target=self._serve, args=(stream, payload), daemon=True).start()

    def _serve(self, stream: int, envelope: bytes) -> None:
        method, request = _text(envelope, 2), _sub(envelope, 3)
        status, payload = b"", b""
        if method == "Configure":
            payload = _int(2, 1 << (CREATE_CONTAINER - 1))
            self.configured.set()
        elif method == "CreateContainer":
            pod, ctr = _sub(request, 1), _sub(request, 2)
            env = tuple(v.decode() for n, v in fields(ctr) if n == 8 and isinstance(v, bytes))
            seen = Seen(_text(pod, 3), _text(ctr, 1), _text(ctr, 3), env)
            self.seen.append(seen)
            time.sleep(self.delay)
            answer = self.answer(seen)
            if isinstance(answer, str):
                status = _int(1, 7) + _str(2, answer)  # google.rpc.Status, PERMISSION_DENIED
            else:
                payload = _msg(1, answer)
        self._send(PLUGIN, stream, 2, _msg(1, status) + _msg(2, payload, always=True))
