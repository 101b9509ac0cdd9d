"""NRI's two framings, byte streams in and whole messages out: the multiplexer and ttrpc.

Rule: pure and bounded. The runtime's socket carries multiplexer frames (``u32 BE conn id | u32
BE length | payload``); each connection is a byte stream whose frames need not align with the
messages on it. On each stream runs ttrpc: ``u32 BE length | u32 BE stream id | u8 type | u8
flags | payload``, the payload a protobuf envelope (request: service=1, method=2, payload=3,
timeout_nano=4, metadata=5; response: status=1 as ``google.rpc.Status`` code=1 message=2,
payload=2). A length past ``MAX_MESSAGE`` (ttrpc's own 4 MiB) or a frame for a connection
NRI does not use is a ``ProtocolError``: the session ends and the daemon connects again, so a
peer that sends garbage costs a reconnect, never memory or a crash.
"""

from __future__ import annotations

import struct

from hook.core.protowire import decode, enc_bytes, enc_int, enc_msg, enc_text
from hook.core.record import record

__all__ = [
    "MAX_MESSAGE",
    "PLUGIN_CONN",
    "RUNTIME_CONN",
    "Demux",
    "Message",
    "ProtocolError",
    "Request",
    "Response",
    "Stream",
    "mux",
    "parse_request",
    "parse_response",
    "request",
    "response",
]

PLUGIN_CONN = 1  # the plugin's service: the runtime calls us
RUNTIME_CONN = 2  # the runtime's service: we call RegisterPlugin
MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax
MAX_FRAME = MAX_MESSAGE + 10
REQUEST, RESPONSE = 1, 2
_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")
_CHUNK = 1 << 16  # frames we write are at most this long (the reader reassembles the stream)


class ProtocolError(ValueError):
    """The peer broke the framing: the session ends (the daemon connects again)."""


@record
class Message:
    """One ttrpc message: its stream id, type (1 request, 2 response), flags and payload."""

    stream: int
    type: int
    flags: int
    payload: bytes


@record
class Request:
    service: str
    method: str
    payload: bytes
    timeout_ns: int = 0


@record
class Response:
    code: int  # google.rpc.Code: 0 is OK
    message: str
    payload: bytes


class Demux:
    """Multiplexer frames from the socket's byte stream, each ``(conn, bytes)``."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= _MUX.size:
            conn, size = _MUX.unpack_from(self._buf)
            if conn not in (PLUGIN_CONN, RUNTIME_CONN):
                raise ProtocolError(f"multiplexer frame for connection {conn}: NRI uses 1 and 2")
            if size > self._max:
                raise ProtocolError(f"multiplexer frame of {size} bytes (at most {self._max})")
            if len(self._buf) < _MUX.size + size:
                break
            out.append((conn, bytes(self._buf[_MUX.size : _MUX.size + size])))
            del self._buf[: _MUX.size + size]
        return out


class Stream:
    """ttrpc messages from one connection's byte stream."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= _TTRPC.size:
            size, stream, kind, flags = _TTRPC.unpack_from(self._buf)
            if size > self._max:
                raise ProtocolError(f"ttrpc message of {size} bytes (at most {self._max})")
            if len(self._buf) < _TTRPC.size + size:
                break
            payload = bytes(self._buf[_TTRPC.size : _TTRPC.size + size])
            del self._buf[: _TTRPC.size + size]
            out.append(Message(stream=stream, type=kind, flags=flags, payload=payload))
        if len(self._buf) > self._max + _TTRPC.size:
            raise ProtocolError("ttrpc stream past its bound")
        return out


def mux(conn: int, data: bytes) -> bytes:
    """``data`` on connection ``conn`` as multiplexer frames."""
    parts = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
    return b"".join(_MUX.pack(conn, len(p)) + p for p in parts)


def _ttrpc(stream: int, kind: int, payload: bytes) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(payload)} bytes (at most {MAX_MESSAGE})")
    return _TTRPC.pack(len(payload), stream, kind, 0) + payload


def request(stream: int, service: str, method: str, payload: bytes, timeout_ns: int = 0) -> bytes:
    """A ttrpc request message (the envelope and its header)."""
    body = enc_text(1, service) + enc_text(2, method) + enc_bytes(3, payload) + enc_int(4, timeout_ns)
    return _ttrpc(stream, REQUEST, body)


def response(stream: int, payload: bytes, code: int = 0, message: str = "") -> bytes:
    """A ttrpc response: ``code`` 0 carries the payload, any other an error status and none."""
    if code:
        return _ttrpc(stream, RESPONSE, enc_msg(1, enc_int(1, code) + enc_text(2, message)))
    return _ttrpc(stream, RESPONSE, enc_msg(2, payload) if payload else b"")


def parse_request(msg: Message) -> Request:
    try:
        f = decode(msg.payload)
        return Request(service=f.text(1), method=f.text(2), payload=f.raw(3), timeout_ns=f.int64(4))
    except ValueError as exc:
        raise ProtocolError(f"ttrpc request: {exc}") from None


def parse_response(msg: Message) -> Response:
    try:
        f = decode(msg.payload)
        status = f.message(1)
        code, text = (status.uint(1), status.text(2)) if status is not None else (0, "")
        return Response(code=code, message=text, payload=f.raw(2))
    except ValueError as exc:
        raise ProtocolError(f"ttrpc response: {exc}") from None
