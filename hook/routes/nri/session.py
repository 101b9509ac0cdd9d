"""One registration with the runtime: the socket read, framed, dispatched and answered.

Rule: one thread and one socket. We call ``RegisterPlugin`` on the runtime's connection and serve
the plugin's connection at the same time (the runtime may call ``Configure`` before it answers).
Requests are served in order, each answered before the next is read; work the plugin defers (late
narrowings after ``Synchronize``) runs one item at a time, only while nothing waits on the socket,
so a queued ``CreateContainer`` never waits behind it past the runtime's timeout. The session ends
(returning why) when the runtime closes the socket, refuses the registration or breaks the
framing; nothing the peer sends can make it allocate past ``frames.MAX_FRAME`` per connection.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from typing import Protocol

from hook.routes.nri import frames
from hook.routes.nri.frames import PLUGIN_CONN, RUNTIME_CONN, ProtocolError

__all__ = ["Handler", "Session", "RUNTIME_SERVICE", "PLUGIN_SERVICE"]

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
UNIMPLEMENTED, INTERNAL = 12, 13


class Handler(Protocol):
    def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        """(google.rpc.Code, message, response payload) for one request of the Plugin service."""

    def work(self) -> bool:
        """Run one deferred item; False when there is none."""

    def registered(self) -> None: ...


class Session:
    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        register: bytes,
        *,
        register_timeout: float = 5.0,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.sock, self.handler, self.log = sock, handler, log
        self._register, self._register_timeout = register, register_timeout
        self._demux = frames.Demux()
        self._streams = {PLUGIN_CONN: frames.Stream(), RUNTIME_CONN: frames.Stream()}
        self.is_registered = False

    def _send(self, conn: int, data: bytes) -> None:
        self.sock.sendall(frames.mux(conn, data))

    def run(self) -> str:
        """Register and serve until the session ends; why it ended."""
        try:
            self._send(RUNTIME_CONN, frames.request(1, RUNTIME_SERVICE, "RegisterPlugin", self._register))
        except OSError as exc:  # the runtime closed the socket it had just accepted
            return f"socket: {exc.strerror or exc}"
        deadline = time.monotonic() + self._register_timeout
        while True:
            if self.is_registered and not self._ready_now() and self._work():
                continue
            timeout = None if self.is_registered else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return "no answer to RegisterPlugin in time"
            self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                return "no answer to RegisterPlugin in time"
            except OSError as exc:
                return f"socket: {exc.strerror or exc}"
            if not data:
                return "the runtime closed the connection"
            try:
                why = self._feed(data)
            except ProtocolError as exc:
                return f"protocol error: {exc}"
            except OSError as exc:  # an answer sent into a socket the runtime closed (it timed us out)
                return f"socket: {exc.strerror or exc}"
            if why:
                return why

    def _work(self) -> bool:
        """One deferred item; a bug in one is logged and the item dropped, never the session."""
        try:
            return self.handler.work()
        except Exception as exc:
            self.log(f"oci-device-hook: internal error in deferred work: {type(exc).__name__}: {exc}")
            return True

    def _ready_now(self) -> bool:
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def _feed(self, data: bytes) -> str:
        for conn, chunk in self._demux.feed(data):
            for msg in self._streams[conn].feed(chunk):
                if conn == PLUGIN_CONN and msg.type == frames.REQUEST:
                    self._serve(msg)
                elif conn == RUNTIME_CONN and msg.type == frames.RESPONSE and msg.stream == 1:
                    reply = frames.parse_response(msg)
                    if reply.code:
                        return f"RegisterPlugin refused: {reply.message[:200]!r} (code {reply.code})"
                    self.is_registered = True
                    self.handler.registered()
        return ""

    def _serve(self, msg: frames.Message) -> None:
        req = frames.parse_request(msg)
        if req.service != PLUGIN_SERVICE:
            code, text, payload = UNIMPLEMENTED, f"no service {req.service[:100]!r}", b""
        else:
            try:
                code, text, payload = self.handler.call(req.method, req.payload)
            except (
                Exception
            ) as exc:  # a bug in one answer must not end the session: the runtime sees an error
                code, text, payload = (
                    INTERNAL,
                    f"oci-device-hook: internal error: {type(exc).__name__}: {exc}",
                    b"",
                )
                self.log(text)
        self._send(PLUGIN_CONN, frames.response(msg.stream, payload, code, text))
