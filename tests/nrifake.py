"""A fake NRI runtime for tests: listens at a socket path, speaks the multiplexer, ttrpc and
NRI's messages (hand-encoded here, independently of the daemon's decoders where it matters: the
request side is written from the field numbers again), and drives a daemon like a runtime, or
like an impersonator of one."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hook.core.protowire import decode, enc_bool, enc_int, enc_msg, enc_text  # re-exported for tests
from hook.routes.nri import frames

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"


def _map(number: int, items: Mapping[str, str]) -> bytes:
    return b"".join(enc_msg(number, enc_text(1, k) + enc_text(2, v)) for k, v in items.items())


def pod(
    id: str = "p" * 64, name: str = "gpu-pod", uid: str = "uid-1", namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
) -> bytes:  # fmt: skip
    return (
        enc_text(1, id)
        + enc_text(2, name)
        + enc_text(3, uid)
        + enc_text(4, namespace)
        + _map(6, annotations or {})
    )


def device(path: str, type_: str, major: int, minor: int, mode: int | None = 0o666) -> bytes:
    body = enc_text(1, path) + enc_text(2, type_) + enc_int(3, major) + enc_int(4, minor)
    if mode is not None:
        body += enc_msg(5, enc_int(1, mode))
    return body


def rule(
    allow: bool, type_: str = "", major: int | None = None, minor: int | None = None, access: str = "rwm"
) -> bytes:
    body = enc_bool(1, allow) + enc_text(2, type_)
    if major is not None:
        body += enc_msg(3, enc_int(1, major))
    if minor is not None:
        body += enc_msg(4, enc_int(1, minor))
    return body + enc_text(5, access)


def container(
    id: str = "c" * 64,
    *,
    sandbox: str = "p" * 64,
    name: str = "main",
    state: int = 1,
    annotations: Mapping[str, str] | None = None,
    env: Iterable[str] = (),
    devices: Iterable[bytes] = (),
    rules: Iterable[bytes] = (),
    cgroups_path: str | None = None,
    pid: int = 0,
    cdi: Iterable[str] = (),
) -> bytes:
    cg = f"/kubepods/pod-uid-1/{id}" if cgroups_path is None else cgroups_path
    resources = b"".join(enc_msg(7, r) for r in rules)
    linux = b"".join(enc_msg(2, d) for d in devices) + enc_msg(3, resources) + enc_text(5, cg)
    body = enc_text(1, id) + enc_text(2, sandbox) + enc_text(3, name) + enc_int(4, state)
    body += _map(6, annotations or {}) + b"".join(enc_text(8, e) for e in env)
    body += enc_msg(11, linux) + enc_int(12, pid) + b"".join(enc_msg(20, enc_text(1, n)) for n in cdi)
    return body


def event(pod_: bytes, container_: bytes) -> bytes:
    return enc_msg(1, pod_) + enc_msg(2, container_)


def configure(runtime: str = "containerd", version: str = "v2.1.9", nri: str = "") -> bytes:
    return enc_text(2, runtime) + enc_text(3, version) + enc_int(5, 2000) + enc_text(6, nri)


def synchronize(pods: Iterable[bytes], containers: Iterable[bytes], more: bool = False) -> bytes:
    return (
        b"".join(enc_msg(1, p) for p in pods)
        + b"".join(enc_msg(2, c) for c in containers)
        + enc_bool(3, more)
    )


class FakeRuntime:
    """The runtime's end of one socket: ``accept`` waits for the daemon and its RegisterPlugin."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        os.chmod(path, 0o600)
        self.server.listen(4)
        self.server.settimeout(20)
        self.conn: socket.socket | None = None
        self._demux = frames.Demux()
        self._streams = {1: frames.Stream(), 2: frames.Stream()}
        self._inbox: list[tuple[int, frames.Message]] = []
        self._next = 1
        self.registration: Any = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()

    def accept(self) -> Any:
        self.conn, _ = self.server.accept()
        self.conn.settimeout(20)
        _, msg = self._read(lambda c, m: c == 2 and m.type == 1)
        self.registration = frames.parse_request(msg)
        return self.registration

    def send_raw(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def _read(self, want: Any) -> tuple[int, frames.Message]:
        assert self.conn is not None
        while True:
            for i, (c, m) in enumerate(self._inbox):
                if want(c, m):
                    return self._inbox.pop(i)
            data = self.conn.recv(1 << 16)
            if not data:
                raise EOFError("the daemon closed the connection")
            for c, chunk in self._demux.feed(data):
                self._inbox.extend((c, m) for m in self._streams[c].feed(chunk))

    def reply_register(self, code: int = 0, message: str = "") -> None:
        self.send_raw(frames.mux(2, frames.response(1, b"", code, message)))

    def call(self, method: str, payload: bytes, split: int = 0) -> frames.Response:
        """Call the daemon's Plugin service; ``split``: write the bytes this many at a time."""
        stream = self._next
        self._next += 2
        data = frames.mux(1, frames.request(stream, PLUGIN, method, payload))
        if split:
            for i in range(0, len(data), split):
                self.send_raw(data[i : i + split])
        else:
            self.send_raw(data)
        _, msg = self._read(lambda c, m: c == 1 and m.type == 2 and m.stream == stream)
        return frames.parse_response(msg)

    def handshake(self, **configure_kw: str) -> frames.Response:
        """Register as a runtime does, Configure before the RegisterPlugin reply."""
        self.accept()
        answer = self.call("Configure", configure(**configure_kw))
        self.reply_register()
        return answer


def adjust_of(payload: bytes) -> dict[str, Any]:
    """A CreateContainerResponse read back: added devices and rules."""
    out: dict[str, Any] = {"devices": [], "rules": []}
    adjust = decode(payload).message(1)
    linux = adjust.message(6) if adjust is not None else None
    if linux is None:
        return out
    for d in linux.messages(1):
        out["devices"].append((d.text(1), d.text(2), d.int64(3), d.int64(4)))
    res = linux.message(2)
    for r in res.messages(7) if res is not None else []:
        major, minor = r.message(3), r.message(4)
        out["rules"].append(
            (r.flag(1), r.text(2), major and major.int64(1), minor and minor.int64(1), r.text(5))
        )
    return out


def start_daemon(sock: Path, config: Path | None, **kw: Any) -> threading.Thread:
    """``hook nri``'s loop in a thread of this (private-namespace) test process."""
    from hook.routes.nri.daemon import run
    from hook.routes.options import Options

    opts = Options(settings_file=config, driver_root=kw.pop("driver_root", None))
    t = threading.Thread(target=run, args=(str(sock), opts, "oci-device-hook", "90"), kwargs=kw, daemon=True)
    t.start()
    return t


__all__ = [
    "FakeRuntime",
    "adjust_of",
    "configure",
    "container",
    "device",
    "event",
    "pod",
    "rule",
    "start_daemon",
    "synchronize",
]
