"""One NRI session's ends (issue 34 items 1, 5): whatever the peer or a bug does, the session ends
with its reason (the daemon then connects again) or goes on; the daemon's process never exits."""

from __future__ import annotations

import socket
import threading
import time

from hook.routes.nri import frames
from hook.routes.nri.session import PLUGIN_SERVICE, Session


class _Handler:
    def __init__(self, broken_work: int = 0) -> None:
        self.broken_work, self.calls = broken_work, 0

    def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        self.calls += 1
        if method == "Boom":
            raise RuntimeError("a bug")
        return 0, "", b""

    def work(self) -> bool:
        if self.broken_work:
            self.broken_work -= 1
            raise RuntimeError("a bug in deferred work")
        return False

    def registered(self) -> None:
        pass


def test_a_runtime_that_closes_before_the_registration_is_sent_ends_the_session() -> None:
    ours, runtime = socket.socketpair()
    runtime.close()
    try:
        why = Session(ours, _Handler(), b"").run()
    finally:
        ours.close()
    assert why.startswith("socket: "), why


def test_bugs_in_an_answer_or_in_deferred_work_are_logged_and_the_session_goes_on() -> None:
    ours, runtime = socket.socketpair()
    lines: list[str] = []
    handler = _Handler(broken_work=2)
    runtime.sendall(frames.mux(frames.RUNTIME_CONN, frames.response(1, b"")))  # registered
    ended: list[str] = []
    session = threading.Thread(
        target=lambda: ended.append(Session(ours, handler, b"", log=lines.append).run())
    )
    session.start()
    time.sleep(0.3)  # idle: the deferred work runs (and fails) now
    wire = frames.mux(frames.PLUGIN_CONN, frames.request(1, PLUGIN_SERVICE, "Boom", b""))
    wire += frames.mux(frames.PLUGIN_CONN, frames.request(3, PLUGIN_SERVICE, "Configure", b""))
    runtime.sendall(wire)
    runtime.shutdown(socket.SHUT_WR)
    try:
        session.join(10)
        (why,) = ended
        answers = runtime.recv(1 << 16)
    finally:
        ours.close()
        runtime.close()
    assert why == "the runtime closed the connection" and handler.calls == 2
    assert sum("internal error in deferred work" in line for line in lines) == 2
    assert any("internal error: RuntimeError: a bug" in line for line in lines)
    demux, stream = frames.Demux(), frames.Stream()
    replies = [
        frames.parse_response(m) for c, chunk in demux.feed(answers) if c == 1 for m in stream.feed(chunk)
    ]
    assert [r.code for r in replies] == [13, 0]  # the bug is the runtime's error status, then served on
