"""The decider's side of one request: check it, decide it with the decider's own settings, answer.

Rule: nothing comes from the requester but the container. A request counts only when its MACs
prove the node's key (``hook.routes.wire``): the header's MAC is checked before any large frame is
read, and one that fails gets no byte back (it is counted, nothing more). The decider decides
with the options it was started with and the settings file they name, and answers only a hook
whose fingerprint of its own settings and options is the same (else: declined, and the hook
decides in-process): no path, option or setting crosses the wire. It decides and never acts: no
cgroup, ``/dev``, config.json or log is written for a request (only the caches every hook keeps).
A decline names no pid and nothing else about the host.
"""

from __future__ import annotations

import threading

from hook.core.version import VERSION
from hook.routes import wire
from hook.routes.fastpath import MAX_CONFIG, MAX_STATE, Look, loads

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from hook.routes.decision import Live, Spec

__all__ = ["Answerer", "Counters"]

HEAD_LIMIT = {wire.REQUEST: 4096}  # the header (and its MAC) is read and checked first
LIMITS = {wire.STATE: 2 * MAX_STATE, wire.CONFIG: MAX_CONFIG, wire.FACTS: 1 << 16, wire.MAC: 64}
MAC_LIMIT = {wire.MAC: 64}
SEND_TIMEOUT = 5.0  # the answer's send, once the request is read (only a keyed hook gets one)


class Counters:
    """What ``hook doctor`` and the tests read back (``status``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = self.declined = self.unauthenticated = 0

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


class Answerer:
    """Answers requests for one node key, one set of options and the settings file they name."""

    def __init__(
        self,
        key: bytes,
        opts: dict[str, list[str]],
        settings_path: str,
        status: Callable[[], dict[str, object]],
    ) -> None:
        self.key, self.opts, self.settings_path, self.status = key, opts, settings_path, status
        self.counters = Counters()

    def handle(self, conn: socket.socket, deadline: float | None = None) -> None:
        """One connection: read, check, decide, answer (or, unauthenticated, nothing at all). The
        whole request is read by ``deadline`` (``time.monotonic()``): each read waits only for the
        time left, so a peer that trickles bytes holds a worker no longer than that."""
        got = self._request(conn, deadline)
        if got is None:
            self.counters.add("unauthenticated")
            return
        header, parts, tag = got
        kind, payload = self.answer(header, parts)
        self.counters.add("answered" if kind == wire.ANSWER else "declined")
        proof = wire.mac(self.key, b"answer", tag, kind, payload)
        conn.settimeout(SEND_TIMEOUT)
        conn.sendall(wire.frame(kind, payload) + wire.frame(wire.MAC, proof))

    def _request(
        self, conn: socket.socket, deadline: float | None = None
    ) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        """(header, frames by kind, the request's MAC) when both MACs prove the key, else None.
        The header's MAC is checked before any frame past 4 KiB is read."""
        try:
            kind, header = wire.read_frame(conn, HEAD_LIMIT, deadline)
            head = wire.frame(kind, header)
            kind, proof = wire.read_frame(conn, MAC_LIMIT, deadline)
            if not wire.same(proof, wire.mac(self.key, b"head", head)):
                return None
            body = head + wire.frame(kind, proof)
            parts: dict[bytes, bytes] = {}
            while True:
                kind, payload = wire.read_frame(conn, LIMITS, deadline)
                if kind == wire.MAC:
                    break
                if kind in parts:
                    return None
                parts[kind] = payload
                body += wire.frame(kind, payload)
        except ValueError:  # a frame of an unexpected kind or size, or the connection closed
            return None
        tag = wire.mac(self.key, b"request", body)
        return (header, parts, tag) if wire.same(payload, tag) else None

    def answer(self, header: bytes, parts: dict[bytes, bytes]) -> tuple[bytes, bytes]:
        """``(ANSWER, the decision)`` or ``(DECLINE, why)`` for an authenticated request."""
        fields = header.split(b"\0")
        if len(fields) != 6 or fields[0] != wire.MAGIC or fields[1] != wire.PROTOCOL:
            return wire.DECLINE, b"not a request of this protocol"
        _magic, _protocol, version, route, fingerprint, _nonce = fields
        if route == b"status":
            import json

            return wire.ANSWER, json.dumps(self.status()).encode()
        if version != VERSION.encode():
            return (
                wire.DECLINE,
                f"decider is version {VERSION}, the hook {version.decode('ascii', 'replace')[:40]}".encode(),
            )
        if fingerprint != wire.fingerprint(self.opts, self.settings_path).hex().encode():
            return wire.DECLINE, b"the hook's settings file or options are not the decider's"
        if self._off():
            return wire.DECLINE, b"decider: off in the settings"
        try:
            decision = self._decide(route, parts)
        except _Decline as exc:
            return wire.DECLINE, str(exc).encode()
        except Exception as exc:
            return wire.DECLINE, f"the decider failed ({type(exc).__name__}); decide in-process".encode()
        from hook.routes.decision import wire_of

        data = wire_of(decision)
        if len(data) > wire.MAX_ANSWER:  # the hook refuses it unread: say so at once instead
            return wire.DECLINE, f"an answer of {len(data)} bytes is past the cap; decide in-process".encode()
        return wire.ANSWER, data

    def _off(self) -> bool:
        from pathlib import Path

        from hook.core.errors import InputError
        from hook.sources.settingsfile import DeciderMode, load_settings

        try:
            return (
                load_settings(Path(self.settings_path), required="--config" in self.opts).decider
                is DeciderMode.OFF
            )
        except InputError:
            return False  # the decision reports the broken file, exactly as in-process

    def _decide(self, route: bytes, parts: dict[bytes, bytes]) -> Live | Spec:
        config = parts.get(wire.CONFIG)
        if config is None:
            raise _Decline("no config.json in the request")
        if route == b"live":
            from hook.routes.live import decide_live

            state = parts.get(wire.STATE)
            if state is None:
                raise _Decline("no state in the request")
            return decide_live(self.opts, _look(state, config))
        if route == b"precreate":
            from hook.routes.precreate import Facts, decide_spec

            facts = dict(f.partition(b"=")[::2] for f in parts.get(wire.FACTS, b"").split(b"\0") if f)
            text = {
                k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
                for k, v in facts.items()
            }
            return decide_spec(self.opts, config, Facts(text.get("id"), text.get("runtime")))
        raise _Decline(f"route {route[:20]!r} is not served")


class _Decline(Exception):
    pass


def _look(state: bytes, config: bytes) -> Look:
    """What a hook's fast path would have handed down, from the request's bytes alone."""
    look = Look(state)
    try:
        obj = loads(state)
        look.state = obj if isinstance(obj, dict) else None
    except Exception:
        look.state = None
    look.config_bytes = config
    return look
