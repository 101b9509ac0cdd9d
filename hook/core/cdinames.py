"""CDI qualified device names and the annotations that request them.

Rule: a CDI name is ``vendor/class=name``, split at the first ``=`` and then at the first ``/``;
vendor and class start with a letter, a device name with a letter or digit, and all three end
with a letter or digit. This module is pure: it imports only ``re`` (and the error type).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hook.core.errors import InputError

__all__ = [
    "DEFAULT_ANNOTATION_PREFIXES",
    "vendor_problem",
    "class_problem",
    "device_name_problem",
    "parse_kind",
    "parse_qualified_name",
    "is_qualified_name",
    "qualified_name",
    "parse_annotations",
    "env_id_to_name",
]

DEFAULT_ANNOTATION_PREFIXES: tuple[str, ...] = ("cdi.k8s.io/",)

# One pattern per segment kind; fullmatch only (``$`` would accept a trailing newline).
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def _segment_problem(what: str, value: str, pattern: re.Pattern[str], first: str, middle: str) -> str | None:
    if value == "":
        return f"empty {what}"
    if pattern.fullmatch(value):
        return None
    if not re.fullmatch(first, value[0]):
        return f"invalid {what} {value!r}: must start with {first}"
    if not value[-1].isascii() or not value[-1].isalnum():
        return f"invalid {what} {value!r}: must end with a letter or digit"
    return f"invalid {what} {value!r}: only {middle} allowed inside"


def vendor_problem(vendor: str) -> str | None:
    """Why ``vendor`` is not a valid CDI vendor, or None."""
    return _segment_problem("vendor", vendor, _VENDOR_OR_CLASS, "[A-Za-z]", "[A-Za-z0-9_.-]")


def class_problem(class_: str) -> str | None:
    """Why ``class_`` is not a valid CDI class, or None."""
    return _segment_problem("class", class_, _VENDOR_OR_CLASS, "[A-Za-z]", "[A-Za-z0-9_.-]")


def device_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid CDI device name, or None."""
    return _segment_problem("device name", name, _DEVICE_NAME, "[A-Za-z0-9]", "[A-Za-z0-9_.:-]")


def parse_kind(kind: str, *, source: str = "", field: str = "kind") -> tuple[str, str]:
    """Split ``vendor/class`` at the first ``/`` and validate both halves."""
    vendor, sep, class_ = kind.partition("/")
    if not sep:
        raise InputError(source, field, f"invalid kind {kind!r}: expected vendor/class")
    problem = vendor_problem(vendor) or class_problem(class_)
    if problem:
        raise InputError(source, field, f"invalid kind {kind!r}: {problem}")
    return vendor, class_


def parse_qualified_name(text: str, *, source: str = "", field: str = "") -> tuple[str, str, str]:
    """``vendor/class=name`` → ``(vendor, class_, name)``; raises InputError naming the bad part."""
    if text == "" or text.startswith("/"):
        raise InputError(source, field, f"unqualified device {text!r}: expected vendor/class=name")
    kind, sep, name = text.partition("=")
    vendor, slash, class_ = kind.partition("/")
    parts = (("vendor", vendor), ("class", slash and class_), ("device name", name))
    missing = [what for what, value in parts if not value]
    if not sep or missing:
        what = ", ".join(missing) or "device name"
        raise InputError(source, field, f"unqualified device {text!r}: missing {what}")
    problem = vendor_problem(vendor) or class_problem(class_) or device_name_problem(name)
    if problem:
        raise InputError(source, field, f"invalid device {text!r}: {problem}")
    return vendor, class_, name


def is_qualified_name(text: str) -> bool:
    try:
        parse_qualified_name(text)
    except InputError:
        return False
    return True


def qualified_name(vendor: str, class_: str, name: str) -> str:
    return f"{vendor}/{class_}={name}"


def parse_annotations(
    annotations: Mapping[str, str],
    prefixes: Sequence[str] = DEFAULT_ANNOTATION_PREFIXES,
    *,
    source: str = "config.json",
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """CDI requests in annotations: ``((key, (name, ...)), ...)`` sorted by key.

    Every key starting with one of ``prefixes`` holds comma-separated qualified names (no
    trimming). One bad element fails that annotation, naming the key and the element.
    """
    found: list[tuple[str, tuple[str, ...]]] = []
    for key in sorted(annotations):
        if not any(key.startswith(p) for p in prefixes):
            continue
        value = annotations[key]
        field = f"annotations[{key!r}]"
        if not isinstance(value, str):
            raise InputError(source, field, "expected a string of comma-separated CDI device names")
        names = tuple(value.split(","))
        for name in names:
            try:
                parse_qualified_name(name)
            except InputError as exc:
                raise InputError(source, field, f"invalid CDI device name {name!r}: {exc.reason}") from exc
        found.append((key, names))
    return tuple(found)


def env_id_to_name(device_id: str, kind: str = "nvidia.com/gpu") -> str:
    """A device ID from an env var (``0``, ``GPU-…``, ``0:1``) as a CDI name of ``kind``.

    An ID that already is a qualified name is returned unchanged.
    """
    if "=" in device_id and is_qualified_name(device_id):
        return device_id
    name = f"{kind}={device_id}"
    parse_qualified_name(name, source="env", field="device id")
    return name
