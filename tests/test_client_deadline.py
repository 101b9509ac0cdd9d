"""Issue 36 item 3: the thin client keeps one deadline for the whole exchange with the decider.

A listener at ``decider.sock`` (anyone with the host's ``/run`` can bind one) that announces a
large frame and then sends one byte every 100 ms must not hold a start past its decider timeout:
the time left is checked before every read, and the hook decides in-process. An answer is capped
per kind (what a decision, a decline or a proof can be) before a byte of its body is read.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hook.routes import client, wire
from tests.bundles import EXAMPLES, NODE_INVENTORY, PRIVATE_RUN, settings_file


@pytest.fixture
def sockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(wire, "SOCKET_DIR", str(d))
    monkeypatch.setattr(wire, "KEY_DIR", str(tmp_path / "keys"))
    wire.make_key()
    return d


@pytest.fixture
def listener(sockdir: Path) -> Iterator[Callable[[Callable[[socket.socket], None]], None]]:
    """Start a listener that reads the request and then does ``behave`` with the connection."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sockdir / wire.SOCKET_NAME))
    server.listen(4)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(behave: Callable[[socket.socket], None]) -> None:
        def run() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1 << 16)
                with contextlib.suppress(OSError):  # the client hung up: what it should do
                    behave(conn)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)

    yield start
    stop.set()
    server.close()
    for t in threads:
        t.join(25)


def trickle(head: bytes, seconds: float = 20.0) -> Callable[[socket.socket], None]:
    def behave(conn: socket.socket) -> None:
        conn.sendall(head)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(b"x")
            time.sleep(0.1)

    return behave


def test_a_trickling_answer_does_not_outlive_the_deadline(listener: Callable[..., None]) -> None:
    """Announce a 1 MiB answer, then a byte every 100 ms: without a deadline per read every byte
    restarts the timeout and the client waits as long as the listener likes (20 s here)."""
    listener(trickle(wire.ANSWER + (1 << 20).to_bytes(4, "big")))
    start = time.monotonic()
    got = client.ask(b"live", b"", [(wire.CONFIG, b"{}")], 0.4)
    took = time.monotonic() - start
    assert got == ("fallback", "no answer within 400 ms")
    assert took < 0.9, took


def test_a_trickling_proof_does_not_outlive_the_deadline(listener: Callable[..., None]) -> None:
    """The deadline covers the answer and its proof: a quick answer and a trickled MAC frame."""
    listener(trickle(wire.frame(wire.ANSWER, b"{}") + wire.MAC + (32).to_bytes(4, "big")))
    start = time.monotonic()
    got = client.ask(b"live", b"", [(wire.CONFIG, b"{}")], 0.4)
    assert got == ("fallback", "no answer within 400 ms")
    assert time.monotonic() - start < 0.9


@pytest.mark.parametrize(
    ("kind", "size"),
    [(wire.ANSWER, wire.MAX_ANSWER + 1), (wire.DECLINE, wire.MAX_DECLINE + 1), (b"Z", 16)],
    ids=["answer", "decline", "unknown-kind"],
)
def test_an_oversized_frame_is_refused_before_its_body_is_read(kind: bytes, size: int) -> None:
    """The length is checked against the kind's cap before any recv of the body."""

    class Sock:
        def __init__(self) -> None:
            self.data = kind + size.to_bytes(4, "big") + b"x" * min(size, 1 << 16)
            self.asked = 0

        def settimeout(self, value: float) -> None:
            pass

        def recv(self, n: int) -> bytes:
            self.asked += n
            chunk, self.data = self.data[:n], self.data[n:]
            return chunk

    sock = Sock()
    with pytest.raises(ValueError, match="frame of"):
        wire.read_frame(sock, client.ANSWER_LIMITS, deadline=time.monotonic() + 5)
    assert sock.asked == 5  # the header alone


def test_an_oversized_decline_is_a_fallback(listener: Callable[..., None]) -> None:
    """A decline is a short line: a listener announcing 1 MiB of it is not read (the client used to
    read up to 24 MiB of any kind)."""
    listener(lambda conn: conn.sendall(wire.DECLINE + (1 << 20).to_bytes(4, "big") + b"x" * (1 << 16)))
    status, why = client.ask(b"live", b"", [(wire.CONFIG, b"{}")], 2.0)
    assert (status, why) == ("fallback", f"frame of {1 << 20} bytes")


def test_the_decider_declines_an_answer_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decider never sends what the client would refuse: it declines instead (in-process)."""
    from hook.routes import answer

    monkeypatch.setattr(wire, "MAX_ANSWER", 10)
    monkeypatch.setattr(answer.Answerer, "_decide", lambda self, route, parts: None)
    monkeypatch.setattr(answer.Answerer, "_off", lambda self: False)
    monkeypatch.setattr("hook.routes.decision.to_wire", lambda d: b"x" * 11)
    a = answer.Answerer(bytes(32), {}, "/nonexistent", dict)
    fp = wire.fingerprint({}, "/nonexistent").hex().encode()
    from hook.core.version import VERSION

    header = b"\0".join((wire.MAGIC, wire.PROTOCOL, VERSION.encode(), b"live", fp, b"n"))
    kind, payload = a.answer(header, {})
    assert kind == wire.DECLINE and payload == b"an answer of 11 bytes is past the cap; decide in-process"


@pytest.mark.skipif(not PRIVATE_RUN, reason="needs root and unshare (a private /run)")
def test_a_trickling_listener_does_not_hold_hook_precreate(tmp_path: Path) -> None:
    """End to end, as the attacker plays it: a listener bound at /run/oci-device-hook/decider.sock
    (a private /run here) announces a large frame and sends a byte every 100 ms for 20 s. The
    console script ``hook precreate`` (decider timeout 400 ms) decides in-process well within 2 s,
    the log record saying ``decider: fallback``."""
    settings = settings_file(tmp_path)
    config = EXAMPLES / "slice-privileged" / "config.json"
    attacker = (
        "import os, socket, sys, threading, time, subprocess\n"
        "from hook.routes import wire\n"
        "wire.make_key()\n"
        "os.makedirs(wire.SOCKET_DIR, mode=0o700, exist_ok=True)\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(wire.SOCKET_DIR + '/' + wire.SOCKET_NAME); s.listen(4)\n"
        "def serve():\n"
        "    c, _ = s.accept(); c.recv(1 << 20)\n"
        "    c.sendall(b'A' + (1 << 20).to_bytes(4, 'big'))\n"
        "    end = time.monotonic() + 20\n"
        "    while time.monotonic() < end:\n"
        "        try: c.sendall(b'x')\n"
        "        except OSError: return\n"
        "        time.sleep(0.1)\n"
        "threading.Thread(target=serve, daemon=True).start()\n"
        "start = time.monotonic()\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    p = subprocess.run(sys.argv[2:], stdin=f, capture_output=True)\n"
        "took = time.monotonic() - start\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(p.returncode, took)\n"
    )
    hook = [sys.executable, "-I", "-m", "hook", "precreate", "--config", str(settings)]
    hook += ["--inventory", str(NODE_INVENTORY)]
    proc = subprocess.run(
        [*PRIVATE_RUN, sys.executable, "-I", "-c", attacker, str(config), *hook],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rc, took = proc.stdout.split()
    assert rc == "0", proc.stderr
    assert float(took) < 2.0, took
    record = json.loads((tmp_path / "hook.log").read_text().splitlines()[-1])
    assert record["decider"] == "fallback"
    assert "decider: no answer within 400 ms; decided in-process" in record["warnings"]


def test_the_decider_drops_a_trickling_request_at_its_deadline(
    tmp_path: Path, sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rule on the decider's side: anyone who can reach the socket (a container with the
    host's /run) could hold every worker by sending a header a byte at a time (each byte restarted
    the read timeout), and every start on the node would then decide in-process. The whole request
    is read within ``READ_TIMEOUT``, every read waiting only for the time left."""
    from hook.routes import serve

    monkeypatch.setattr(serve, "READ_TIMEOUT", 0.5)
    settings = settings_file(tmp_path)
    d = serve.Decider(str(sockdir), key=wire.make_key(), opts={"--config": [str(settings)]},
                      settings_path=str(settings))  # fmt: skip
    d.listen()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sockdir / wire.SOCKET_NAME))
        head = wire.REQUEST + (4000).to_bytes(4, "big")
        start = time.monotonic()
        dropped = None
        for byte in head + b"x" * 60:  # 6.5 s of trickle at most
            try:
                conn.sendall(bytes([byte]))
                conn.settimeout(0.1)
                if conn.recv(1) == b"":
                    dropped = time.monotonic() - start
                    break
            except TimeoutError:
                continue
            except OSError:
                dropped = time.monotonic() - start
                break
        conn.close()
    finally:
        d.close()
        t.join(5)
    assert dropped is not None and dropped < 1.5, dropped


def test_the_callers_meanwhile_runs_after_the_send_and_counts_against_the_deadline(
    listener: Callable[..., None],
) -> None:
    """``meanwhile`` (the answer's imports, while the decider decides) runs once the request is
    on the wire, and the deadline is one: a meanwhile that outlasts it leaves no time to read."""
    seen: list[str] = []

    def behave(conn: socket.socket) -> None:  # the request was read before this: say so, answer late
        seen.append("request read")
        time.sleep(0.3)
        conn.sendall(wire.frame(wire.ANSWER, b"{}"))

    listener(behave)
    start = time.monotonic()

    def meanwhile() -> None:
        time.sleep(0.1)  # the listener reads the request meanwhile: it was sent whole first
        seen.append("meanwhile")
        time.sleep(0.2)

    got = client.ask(b"live", b"", [], timeout=0.25, meanwhile=meanwhile)
    assert seen == ["request read", "meanwhile"]
    assert got == ("fallback", "no answer within 250 ms")
    assert time.monotonic() - start < 0.45
