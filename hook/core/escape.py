"""Text from a container, made safe to print or log: escaped and length-capped.

Rule: env values, annotation keys and values, paths and ids come from whoever built the image
or the pod. Before any of them reaches a terminal (stderr, a report) or a log line, every
character that is not printable (C0/C1 controls, DEL, line and paragraph separators, lone
surrogates) becomes its Python escape (``\\x1b``, ``\\n``, ``\\u2028``) and a backslash is doubled,
so the output is one line, forges no log line and plays no terminal escape; anything over
``limit`` characters is cut and says how much was cut. Imports nothing.
"""

from __future__ import annotations

__all__ = ["LIMIT", "clean"]

LIMIT = 512
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if ch.isprintable():
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(value: object, limit: int = LIMIT) -> str:
    """``value`` as one printable line of at most ``limit`` characters (plus the cut marker)."""
    text = value if isinstance(value, str) else str(value)
    cut = ""
    if len(text) > limit:
        cut = f"...[{len(text) - limit} more chars]"
        text = text[:limit]
    if not (text.isprintable() and "\\" not in text):
        text = "".join(map(_char, text))
    return text + cut
