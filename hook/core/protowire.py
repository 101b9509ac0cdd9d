"""Protocol buffers' wire format, written by hand from the format, for the messages we read and
write: NRI's, and the kubelet checkpoint's device-plugin responses.

Rule: decoding takes bytes and returns ``Fields`` (field number -> values in order); it never
trusts a length: every length is checked against what is left, a varint is at most 10 bytes,
groups (wire types 3 and 4) are refused. Unknown fields are kept and ignored by the callers, as
proto3 does, so one subset reads every NRI version. Encoding writes only what is not the
default (proto3: an empty string, 0 or false is absent). Errors are ``ValueError``.
"""

from __future__ import annotations

__all__ = ["Fields", "decode", "enc_bool", "enc_bytes", "enc_int", "enc_msg", "enc_text", "varint"]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


class Fields:
    """One message's fields: ``number -> [value, ...]`` (int for varints and fixed, bytes for
    length-delimited), read with the accessors below; absent fields read as proto3's defaults."""

    __slots__ = ("_by",)

    def __init__(self, by: dict[int, list[int | bytes]]) -> None:
        self._by = by

    def _all(self, number: int, kind: type) -> list[int | bytes]:
        values = self._by.get(number, [])
        for v in values:
            if not isinstance(v, kind):
                raise ValueError(f"field {number}: unexpected wire type")
        return values

    def text(self, number: int) -> str:
        """The last value (proto3: a repeated scalar's last wins), decoded as UTF-8."""
        values = self._all(number, bytes)
        return bytes(values[-1]).decode("utf-8", "surrogateescape") if values else ""

    def raw(self, number: int) -> bytes:
        """A ``bytes`` field (the last value), undecoded."""
        values = self._all(number, bytes)
        return bytes(values[-1]) if values else b""

    def raws(self, number: int) -> list[bytes]:
        """Every value of a repeated length-delimited field, undecoded."""
        return [bytes(v) for v in self._all(number, bytes)]

    def texts(self, number: int) -> list[str]:
        return [bytes(v).decode("utf-8", "surrogateescape") for v in self._all(number, bytes)]

    def uint(self, number: int) -> int:
        values = self._all(number, int)
        return int(values[-1]) if values else 0

    def int64(self, number: int) -> int:
        """A varint read as a two's-complement int64 (Go's int64 and int32 fields)."""
        value = self.uint(number) & 0xFFFF_FFFF_FFFF_FFFF
        return value - (1 << 64) if value >= 1 << 63 else value

    def flag(self, number: int) -> bool:
        return self.uint(number) != 0

    def optional(self, number: int) -> int | None:
        """An ``Optional*`` wrapper message's value (its field 1, as int64); None when absent."""
        values = self._all(number, bytes)
        if not values:
            return None
        raw = bytes(values[-1])
        if len(raw) == 2 and raw[0] == 0x08 and raw[1] < 0x80:  # {value: small}: the usual case
            return raw[1]
        return decode(raw).int64(1)

    def has(self, number: int) -> bool:
        return number in self._by

    def message(self, number: int) -> Fields | None:
        """The sub-message (protobuf merges repeated occurrences; NRI never sends them twice:
        the last wins here, which is what a merge gives for every scalar field)."""
        values = self._all(number, bytes)
        return decode(bytes(values[-1])) if values else None

    def messages(self, number: int) -> list[Fields]:
        return [decode(bytes(v)) for v in self._all(number, bytes)]

    def string_map(self, number: int) -> dict[str, str]:
        """A ``map<string, string>``: entries are messages with key=1, value=2."""
        out: dict[str, str] = {}
        for entry in self.messages(number):
            out[entry.text(1)] = entry.text(2)
        return out


def decode(buf: bytes) -> Fields:
    by: dict[int, list[int | bytes]] = {}
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:  # one-byte keys and values are nearly all of NRI's: read them inline
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        value: int | bytes
        if wire in (VARINT, LEN):
            if pos < end and buf[pos] < 0x80:
                n, pos = buf[pos], pos + 1
            else:
                n, pos = _varint(buf, pos)
            value = n
            if wire == LEN:
                if n > end - pos:
                    raise ValueError(f"field {number}: length {n} past the end")
                value, pos = buf[pos : pos + n], pos + n
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if width > end - pos:
                raise ValueError(f"field {number}: truncated fixed{width * 8}")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise ValueError(f"field {number}: wire type {wire} not supported")
        if number in by:
            by[number].append(value)
        else:
            by[number] = [value]
    return Fields(by)


def varint(value: int) -> bytes:
    """An unsigned varint; a negative int64 is written as its 10-byte two's complement."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def enc_int(number: int, value: int) -> bytes:
    return _key(number, VARINT) + varint(value) if value else b""


def enc_bool(number: int, value: bool) -> bytes:
    return _key(number, VARINT) + b"\x01" if value else b""


def enc_bytes(number: int, value: bytes) -> bytes:
    return _key(number, LEN) + varint(len(value)) + value if value else b""


def enc_text(number: int, value: str) -> bytes:
    return enc_bytes(number, value.encode("utf-8", "surrogateescape"))


def enc_msg(number: int, body: bytes) -> bytes:
    """A sub-message, written even when empty (its presence can mean something: an optional)."""
    return _key(number, LEN) + varint(len(body)) + body
