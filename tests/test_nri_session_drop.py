"""A runtime that drops ``hook nri`` while it answers (containerd closes a plugin whose request
timed out) ends that session, and the daemon connects again: the answer's failed send is the
session's end, never the daemon's (seen on containerd 1.7.24: a daemon stopped past the 2 s
request timeout exited 1 on its next answer, tests/live/test_nri_containerd.py)."""

from __future__ import annotations

import socket

from hook.routes.nri import frames
from hook.routes.nri.session import PLUGIN_SERVICE, Session


class _Closing:
    """Answers after the runtime has closed its end (it timed the request out)."""

    def __init__(self, peer: socket.socket) -> None:
        self.peer = peer

    def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        self.peer.close()
        return 0, "", b""

    def work(self) -> bool:
        return False

    def registered(self) -> None:
        pass


def test_an_answer_into_a_closed_socket_ends_the_session_with_why() -> None:
    ours, runtime = socket.socketpair()
    runtime.sendall(frames.mux(frames.PLUGIN_CONN, frames.request(1, PLUGIN_SERVICE, "CreateContainer", b"")))
    try:
        why = Session(ours, _Closing(runtime), b"").run()
    finally:
        ours.close()
    assert why.startswith("socket: "), why
