"""The thin client: a container that needs a decision is handed to the warm decider (``hook serve``).

Rule: this runs in the per-start process right after the fast path said "a decision is needed",
so it imports what the fast path imports plus ``_socket`` (no ``socket``, ``json`` or
``struct``). It talks only to a root-owned socket in a root-only directory and checks the peer
is uid 0 (``SO_PEERCRED``); the container goes over as a pidfd (``SCM_RIGHTS``), which a
recycled pid cannot fake. It never answers for the decider: any failure before the decider asks
"may I apply?" returns a reason, and the caller decides in-process exactly as without a
decider. Once this client has said "go", the decider owns the container: a decider that then
dies or falls silent refuses it (the runtime tears it down), never a second, in-process apply.

The wire (one unix stream, frames of ``kind`` byte + 4-byte big-endian length + payload):
client → ``Q`` (NUL-separated: magic, hook version, protocol, ``stage``, then ``--opt=value``
for each live option; the pidfd rides along) and ``S`` (the OCI state as the runtime gave it);
decider → ``D`` (declined: a reason; decide in-process), ``R`` (decided, about to apply or log),
client → ``G`` (go), decider → ``A`` (``rc`` NUL stderr text). ``T`` asks for the decider's
status (``hook doctor``) and gets ``A`` with a JSON object.
"""

from __future__ import annotations

import os
import sys

SOCKET_DIR = "/run/oci-device-hook"
SOCKET_NAME = "decider.sock"
MAGIC = b"oci-device-hook"
PROTOCOL = b"1"
DECIDE_TIMEOUT = 0.4  # connect, send and "ready" (or an answer) all within this; else in-process
TIMEOUT_ENV = "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS"  # the hook's environment may set 50..5000
APPLY_TIMEOUT = 20.0  # after "go": the decider applies; silence this long refuses the container
MAX_FRAME = 4 << 20
REQUEST, STATE, DECLINE, READY, GO, ANSWER, STATUS = b"Q", b"S", b"D", b"R", b"G", b"A", b"T"


class Refused(Exception):
    """The decider took the container ("go") and then ended without an answer: refuse it."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def read_frame(sock: object, limit: int = MAX_FRAME) -> tuple[bytes, bytes]:
    """One frame from ``sock`` (a ``_socket.socket``); ``ValueError`` on EOF or a malformed frame."""
    head = _exactly(sock, 5)
    size = int.from_bytes(head[1:], "big")
    if size > limit:
        raise ValueError(f"frame of {size} bytes")
    return head[:1], _exactly(sock, size)


def _exactly(sock: object, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))  # type: ignore[attr-defined]
        if not chunk:
            raise ValueError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def encode_opts(stage: str, opts: dict[str, list[str]]) -> bytes:
    from hook.core.version import VERSION

    fields = [MAGIC, VERSION.encode(), PROTOCOL, stage.encode()]
    fields += [f"{name}={value}".encode() for name, values in opts.items() for value in values]
    return b"\0".join(fields)


def _connect(timeout: float) -> object:
    """A connected socket to a root decider, or an OSError/ValueError saying why not."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(os.path.join(SOCKET_DIR, SOCKET_NAME))
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        uid = int.from_bytes(cred[4:8], sys.byteorder)  # struct ucred {pid, uid, gid}, native order
        if uid != 0:
            raise ValueError(f"the socket's peer is uid {uid}, not root")
    except BaseException:
        sock.close()
        raise
    return sock


def ask(stage: str, opts: dict[str, list[str]], stdin: bytes, pid: int | None) -> tuple[int, bytes] | str:
    """The decider's ``(exit status, stderr bytes)`` for this container, or why to decide in-process.

    Raises ``Refused`` only after "go": from then on the decider alone may apply.
    """
    import _socket
    import time

    limit = decide_timeout()
    deadline = time.monotonic() + limit
    pidfd = -1
    sock: object = None
    try:
        try:
            if pid is not None:
                pidfd = os.pidfd_open(pid)
            sock = _connect(limit)
        except FileNotFoundError:
            return ""  # no decider on this node: not a failure, nothing to warn about
        except ProcessLookupError:
            return "the state's pid is not a running process"
        except (OSError, ValueError) as exc:
            return _why(exc)
        payload = frame(REQUEST, encode_opts(stage, opts)) + frame(STATE, stdin)
        fds = []
        if pidfd >= 0:
            fds.append((_socket.SOL_SOCKET, _socket.SCM_RIGHTS, pidfd.to_bytes(4, sys.byteorder)))
        try:
            sent = sock.sendmsg([payload], fds)  # type: ignore[attr-defined]
            if sent < len(payload):
                sock.sendall(payload[sent:])  # type: ignore[attr-defined]
            while True:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))  # type: ignore[attr-defined]
                kind, body = read_frame(sock)
                if kind == DECLINE:
                    return "declined: " + body.decode("utf-8", "replace")
                if kind == ANSWER:
                    return _answer(body)
                if kind != READY:
                    return f"unexpected answer {kind!r}"
                if time.monotonic() >= deadline:
                    return "timed out"
                sock.sendall(frame(GO, b""))  # type: ignore[attr-defined]
                break
        except TimeoutError:
            return f"no answer within {int(limit * 1000)} ms"
        except (OSError, ValueError) as exc:
            return _why(exc)
        try:  # committed: the decider applies; only its answer (or a refusal) ends this container
            sock.settimeout(APPLY_TIMEOUT)  # type: ignore[attr-defined]
            kind, body = read_frame(sock)
            got = _answer(body) if kind == ANSWER else f"unexpected answer {kind!r}"
        except (OSError, ValueError) as exc:
            raise Refused(_why(exc)) from None
        if isinstance(got, str):
            raise Refused(got)
        return got
    finally:
        if sock is not None:
            sock.close()  # type: ignore[attr-defined]
        if pidfd >= 0:
            os.close(pidfd)


def decide_timeout() -> float:
    """``DECIDE_TIMEOUT``, or the hook's ``OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS`` within 50..5000 ms."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    if raw.isdigit():
        return min(max(int(raw), 50), 5000) / 1000
    return DECIDE_TIMEOUT


def _answer(body: bytes) -> tuple[int, bytes] | str:
    rc, sep, err = body.partition(b"\0")
    if not sep or not rc.isdigit() or len(rc) > 3:
        return "malformed answer"
    return int(rc), err


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {int(decide_timeout() * 1000)} ms"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text


def status(timeout: float = 1.0) -> dict[str, object] | str:
    """The decider's own account (version, uptime, requests), or why there is none."""
    try:
        sock = _connect(timeout)
    except FileNotFoundError:
        return f"no decider socket at {os.path.join(SOCKET_DIR, SOCKET_NAME)}"
    except (OSError, ValueError) as exc:
        return _why(exc)
    try:
        sock.sendall(frame(STATUS, b""))  # type: ignore[attr-defined]
        kind, body = read_frame(sock)
        if kind != ANSWER:
            return f"unexpected answer {kind!r}"
        from hook.routes.fastpath import loads

        doc = loads(body)
        return doc if isinstance(doc, dict) else "malformed status"
    except (OSError, ValueError) as exc:
        return _why(exc)
    finally:
        sock.close()  # type: ignore[attr-defined]
