"""The thin client: a container that needs a decision is first offered to the node's decider.

Rule: this runs in the per-start process right after the fast path said "a decision is needed",
so it imports what the fast path imports plus ``_socket`` and ``hook.routes.wire`` (``os`` and
``_blake2``). It never decides and trusts nothing but the node's key: the request carries only
what the runtime handed the hook (the state and config.json's bytes, or the config and the
container id at spec level) and a fingerprint of the hook's settings and options, MACed with the
key; an answer counts only if its MAC binds it to this request. Anything else (no socket, no
key, a refused or silent socket, a decline, a listener that cannot prove the key) returns why,
and the caller decides in-process. The hook, never the decider, then acts on the decision.

The wire (one unix stream, ``hook.routes.wire`` frames): client → ``Q`` (NUL-separated: magic,
protocol, hook version, route, fingerprint, nonce), ``M`` (MAC of ``Q``), then ``S`` (state),
``C`` (config), ``F`` (facts), and ``M`` (MAC of everything before); decider → ``A`` (the decision,
JSON; for ``status``, the counters) or ``D`` (declined: why), then ``M`` (MAC over the request's
MAC, the kind and the payload). A request that fails its MAC gets no byte back.
"""

from __future__ import annotations

import os

from hook.routes import wire

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ANSWER_LIMITS", "DECIDE_TIMEOUT", "TIMEOUT_ENV", "ask", "decide_timeout", "status", "where"]

DECIDE_TIMEOUT = 0.4  # connect, send and the answer all within this (one deadline); else in-process
ANSWER_LIMITS = {wire.ANSWER: wire.MAX_ANSWER, wire.DECLINE: wire.MAX_DECLINE}  # else refused unread
PROOF_LIMITS = {wire.MAC: wire.MAX_PROOF}
TIMEOUT_ENV = "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS"  # the hook's environment may set 50..5000


def where() -> str:
    return os.path.join(wire.SOCKET_DIR, wire.SOCKET_NAME)


def decide_timeout() -> float:
    """``DECIDE_TIMEOUT``, or the hook's ``OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS`` within 50..5000 ms."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    if raw.isdigit():
        return min(max(int(raw), 50), 5000) / 1000
    return DECIDE_TIMEOUT


def _connect(timeout: float) -> object:
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(where())
    except BaseException:
        sock.close()
        raise
    return sock


def ask(
    route: bytes,
    fingerprint: bytes,
    parts: list[tuple[bytes, bytes]],
    timeout: float | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[str, bytes | str]:
    """``("answered", the decision's bytes)``, or ``(status, why)`` to decide in-process:
    ``""`` (no decider on this node: nothing to say), ``declined``, ``untrusted`` or ``fallback``.
    ``meanwhile`` runs once the request is sent, while the decider decides (on another core): the
    caller's imports that every answer needs. Its time counts against the one deadline."""
    import time

    limit = decide_timeout() if timeout is None else timeout
    deadline = time.monotonic() + limit
    try:
        sock = _connect(limit)
    except FileNotFoundError:
        return "", ""
    except (OSError, ValueError) as exc:
        return "fallback", _why(exc, limit)
    try:
        key = wire.read_key()
        if key is None:
            return (
                "untrusted",
                f"{where()}: no usable key at {wire.KEY_DIR}/{wire.KEY_NAME} to check its answer by",
            )
        from hook.core.version import VERSION

        nonce = os.urandom(16).hex().encode()
        head = wire.frame(
            wire.REQUEST,
            b"\0".join(
                (wire.MAGIC, wire.PROTOCOL, VERSION.encode(), route, fingerprint.hex().encode(), nonce)
            ),
        )
        body = head + wire.frame(wire.MAC, wire.mac(key, b"head", head))
        body += b"".join(wire.frame(kind, payload) for kind, payload in parts)
        tag = wire.mac(key, b"request", body)
        try:  # one deadline: the send (a whole sendall) and every read get only the time left
            wire.left_for(sock, deadline)
            sock.sendall(body + wire.frame(wire.MAC, tag))  # type: ignore[attr-defined]
            if meanwhile is not None:
                meanwhile()
            kind, payload = wire.read_frame(sock, ANSWER_LIMITS, deadline)
            mkind, proof = wire.read_frame(sock, PROOF_LIMITS, deadline)
        except (OSError, ValueError) as exc:
            return "fallback", _why(exc, limit)
        if mkind != wire.MAC or not wire.same(proof, wire.mac(key, b"answer", tag, kind, payload)):
            return "untrusted", f"{where()}: an answer without the node key's proof (an untrusted listener)"
        if kind == wire.DECLINE:
            return "declined", "declined: " + payload.decode("utf-8", "replace")
        if kind != wire.ANSWER:
            return "fallback", f"unexpected answer {kind!r}"
        return "answered", payload
    finally:
        sock.close()  # type: ignore[attr-defined]


def _why(exc: BaseException, limit: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {int(limit * 1000)} ms"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def status(timeout: float = 1.0) -> dict[str, object] | str:
    """The decider's own account (version, uptime, counters), or why there is none; needs the key."""
    got, body = ask(b"status", b"", [], timeout)
    if got == "":
        return f"no decider socket at {where()}"
    if got != "answered" or not isinstance(body, bytes):
        return str(body)
    from hook.routes.fastpath import loads

    try:
        doc = loads(body)
    except ValueError:
        return "malformed status"
    return doc if isinstance(doc, dict) else "malformed status"
