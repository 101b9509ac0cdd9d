"""CDI spec bytes as the reference library reads them: YAML 1.1 the go-yaml v2 way.

Rule: every spec file is YAML (JSON is YAML), whatever its name. Only the first document
counts. Plain scalars resolve as go-yaml v2 resolves them (``yes``/``on`` booleans, ``0x``/``0o``
/leading-zero octal ints, ``_`` separators, ``.inf``/``.nan``; *no* base-60, so ``1:0`` stays a
string); quoted scalars are strings. Timestamps become the RFC 3339 text Go's JSON would write.
Mapping keys become strings as sigs.k8s.io/yaml makes them. The caller (``schema.check``) then
turns numbers and booleans into strings where the target field is a string, as that library does
when it converts YAML to JSON against the Go type. A JSON document takes a fast path with the
same result. Duplicate keys raise ``DuplicateKey``; anything else unparsable raises ValueError.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from typing import Any, Final

__all__ = ["DuplicateKey", "load", "go_float32", "format_key"]

_PLAIN: Final = "tag:oci-device-hook,2026:plain"  # our marker: an untagged plain scalar
_STR: Final = "tag:yaml.org,2002:str"
_TAGS: Final = {f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool", "null", "timestamp")}
_BINARY: Final = "tag:yaml.org,2002:binary"
_MAX_NODES: Final = 200_000  # alias bombs: a spec is small
_MAX_DEPTH: Final = 100

_BOOLS: Final = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
}
_NULLS: Final = frozenset(("", "~", "null", "Null", "NULL"))
_FLOATS: Final = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_HINTED: Final = frozenset("+-0123456789yYnNtTfFoO~.")
_GO_INT: Final = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_YAML_FLOAT: Final = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT: Final = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_TIMESTAMP: Final = re.compile(
    r"(\d{4})-(\d\d?)-(\d\d?)"
    r"(?:(?:([Tt])(\d\d?):(\d\d?):(\d\d?)(\.\d+)?(Z|[+-]\d\d:\d\d))|(?: (\d\d?):(\d\d?):(\d\d?)(\.\d+)?))?")
_NOT_YAML_PRINTABLE: Final = re.compile("[\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


class DuplicateKey(ValueError):
    """A mapping key given twice (the reference's strict decoding refuses it)."""


# ---- scalars -------------------------------------------------------------------------------


def _go_int(text: str) -> int | None:
    match = _GO_INT.fullmatch(text)
    if match is None:
        return None
    sign, body = match.groups()
    if body[:2] in ("0x", "0X"):
        value = int(body[2:], 16)
    elif body[:2] in ("0o", "0O"):
        value = int(body[2:], 8)
    elif body[:2] in ("0b", "0B"):
        value = int(body[2:], 2)
    elif body.startswith("0") and len(body) > 1:
        value = int(body, 8)
    else:
        value = int(body)
    return -value if sign == "-" else value


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _timestamp(text: str) -> str | None:
    """go-yaml v2's timestamp forms, as Go's JSON writes a time (RFC 3339, nanoseconds trimmed)."""
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    g = match.groups()
    year, month, day = int(g[0]), int(g[1]), int(g[2])
    hms, frac, zone = ((g[4], g[5], g[6]), g[7], g[8]) if g[3] else ((g[9], g[10], g[11]), g[12], "Z")
    hour, minute, second = (int(x) for x in hms) if hms[0] is not None else (0, 0, 0)
    if not (1 <= month <= 12 and 1 <= day <= _days_in_month(year, month)):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    if zone != "Z" and (int(zone[1:3]) > 23 or int(zone[4:6]) > 59):
        return None
    nanos = (frac or ".")[1:10].ljust(9, "0").rstrip("0") if frac else ""
    if zone in ("+00:00", "-00:00"):
        zone = "Z"  # Go's RFC 3339 writes a zero offset as Z
    out = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return out + (f".{nanos}" if nanos else "") + zone


def resolve_plain(text: str) -> Any:
    """One untagged plain scalar as go-yaml v2 resolves it (``resolve``)."""
    if not text:
        return None
    if text[0] not in _HINTED:
        return text
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _NULLS:
        return None
    if text in _FLOATS:
        return _FLOATS[text]
    if text[0] == ".":
        return float(text) if _DOT_FLOAT.fullmatch(text) else text
    if text[0] not in "+-0123456789":
        return text
    stamp = _timestamp(text)
    if stamp is not None:
        return stamp
    plain = text.replace("_", "")
    value = _go_int(plain)
    if value is not None:
        return value
    if _YAML_FLOAT.fullmatch(plain):
        return float(plain)
    return text


def go_float32(value: float) -> str:
    """Go's ``strconv.FormatFloat(value, 'g', -1, 32)``: how the reference writes a float as a string."""
    if math.isnan(value):
        return "NaN"
    try:
        f32 = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        f32 = math.copysign(math.inf, value)
    if math.isinf(f32):
        return "+Inf" if f32 > 0 else "-Inf"
    if f32 == 0:
        return "-0" if math.copysign(1.0, f32) < 0 else "0"
    text = ""
    for digits in range(1, 10):
        text = f"{f32:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == f32:
            break
    mantissa, _, exp_text = text.partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits_str = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    exp = int(exp_text)
    if exp < -4 or exp >= 6:  # shortest %g: exponent form outside [1e-4, 1e6)
        body = digits_str[0] + ("." + digits_str[1:] if len(digits_str) > 1 else "")
        return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits_str}"
    whole = digits_str[: exp + 1].ljust(exp + 1, "0")
    frac = digits_str[exp + 1 :]
    return f"{sign}{whole}{'.' + frac if frac else ''}"


def format_key(key: Any) -> str:
    """A mapping key as sigs.k8s.io/yaml turns it into a JSON key."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, str):
        return key
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        text = go_float32(key)
        return {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}.get(text, text)
    raise ValueError(f"unsupported map key {key!r}")


# ---- documents -------------------------------------------------------------------------------


class _Builder:
    """Turns a composed PyYAML node graph into JSON-like data the go-yaml v2 way."""

    def __init__(self, yaml: Any) -> None:
        self.yaml = yaml
        self.budget = _MAX_NODES

    def value(self, node: Any, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0 or depth > _MAX_DEPTH:
            raise ValueError("document too deep or too large (aliases?)")
        yaml = self.yaml
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return [self.value(child, depth + 1) for child in node.value]
        return self.mapping(node, depth)

    def scalar(self, node: Any) -> Any:
        tag, text = node.tag, node.value
        if tag == _PLAIN:
            return resolve_plain(text)
        if tag == _STR:
            return text
        if tag == _BINARY:
            return base64.b64decode(text).decode("utf-8", "replace")
        if tag in _TAGS:
            value = resolve_plain(text) if text else None
            want = tag.rpartition(":")[2]
            got = ("null" if value is None else "bool" if isinstance(value, bool) else "int"
                   if isinstance(value, int) else "float" if isinstance(value, float) else "str")
            if want == "float" and got == "int":
                return float(value)  # type: ignore[arg-type]
            if got != want and not (want == "timestamp" and got == "str" and _timestamp(text)):
                raise ValueError(f"cannot decode !!{got} {text!r} as a !!{want}")
            return value
        return text  # an unknown tag: go-yaml keeps the text

    def mapping(self, node: Any, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        explicit: set[str] = set()
        for key_node, value_node in node.value:
            if (isinstance(key_node, self.yaml.ScalarNode) and key_node.value == "<<"
                    and key_node.tag in (_PLAIN, "tag:yaml.org,2002:merge")):
                self.merge(value_node, out, depth)
                continue
            if not isinstance(key_node, self.yaml.ScalarNode):
                raise ValueError(f"unsupported map key at line {key_node.start_mark.line + 1}")
            raw_key = self.scalar(key_node)
            if raw_key is None:
                raise ValueError(f"unsupported null map key at line {key_node.start_mark.line + 1}")
            key = format_key(raw_key)
            if key in explicit:
                raise DuplicateKey(f"{key} (line {key_node.start_mark.line + 1})")
            explicit.add(key)
            out[key] = self.value(value_node, depth + 1)
        return out

    def merge(self, node: Any, out: dict[str, Any], depth: int) -> None:
        items = node.value if isinstance(node, self.yaml.SequenceNode) else [node]
        for item in reversed(items):  # earlier maps take precedence
            if not isinstance(item, self.yaml.MappingNode):
                raise ValueError("map merge requires a map or a sequence of maps")
            out.update(self.mapping(item, depth + 1))


def _yaml(data: bytes) -> Any:
    import yaml  # lazily: a JSON spec never pays for it

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc,valid-type]
        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            if kind is yaml.ScalarNode:
                return _PLAIN if implicit[0] else _STR
            return super().resolve(kind, value, implicit)

    loader = Loader(data)
    try:
        if not loader.check_node():
            return None
        node = loader.get_node()  # the first document; later ones are never looked at
        return _Builder(yaml).value(node, 0)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from exc
    finally:
        loader.dispose()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def load(data: bytes) -> Any:
    """Spec bytes → JSON-like data (None for an empty document)."""
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        if text and not _NOT_YAML_PRINTABLE.search(text):
            try:
                return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
            except DuplicateKey:
                raise
            except ValueError:
                pass  # not plain JSON (YAML flow style, comments, ...): the YAML parser decides
    return _yaml(data)
