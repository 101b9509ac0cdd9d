"""A model of what crun's systemd cgroup driver makes of a config's device rules (the unit it asks for).

Restated (not copied) from containers/crun ``src/libcrun/cgroup-systemd.c`` (``append_devices``,
``append_device_allow``, ``find_first_rule_no_default``, ``has_allow_all``; commit ba38286f, the
same logic since 1.0) and ``cgroup-resources.c`` (``default_devices``):

* a major or minor ``<= 0`` is a wildcard (``IS_WILDCARD``); an absent number is 0;
* an allow-all list (from the back, only allows up to an ``a``/``c *:*`` + ``b *:*``) becomes
  ``DevicePolicy=auto``; otherwise ``DevicePolicy=strict``, crun's default devices, and one
  ``DeviceAllow=`` per allow rule after the last deny-all: ``char-*``/``block-*`` for ``*:*``,
  ``char-M`` for ``M:*``, ``/dev/char/M:m`` for an exact node; a ``*:m`` rule is dropped; a type
  ``a`` rule is written once as char and once as block; a deny that an earlier rule does not
  already make redundant is an error ("systemd does not support deny rules for devices"; the
  model raises on every deny after the last deny-all, a simplification the hook's allow-lists,
  which hold none, never meet).

systemd writes these properties into the cgroup again on every ``daemon-reload``; ``unit_allows``
answers what the container may then open. The model reads the rules as plain JSON, on purpose
not through the hook's parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CRUN_DEFAULTS", "DenyRuleError", "device_allow", "unit_allows"]

CRUN_DEFAULTS = (
    ("c", -1, -1, "m"), ("b", -1, -1, "m"), ("c", 1, 3, "rwm"), ("c", 1, 8, "rwm"), ("c", 1, 7, "rwm"),
    ("c", 5, 0, "rwm"), ("c", 1, 5, "rwm"), ("c", 1, 9, "rwm"), ("c", 5, 1, "rwm"), ("c", 136, -1, "rwm"),
    ("c", 5, 2, "rwm"), ("c", 10, 200, "rwm"),
)  # fmt: skip


class DenyRuleError(Exception):
    """crun refuses the unit: a deny rule systemd cannot hold."""


def _wild(n: int) -> bool:
    return n <= 0


def _num(rule: dict[str, Any], key: str) -> int:
    value = rule.get(key)
    return value if isinstance(value, int) else 0


def _entry(kind: str, major: int, minor: int, access: str) -> tuple[str, str] | None:
    if _wild(major) and not _wild(minor):
        return None  # "wildcard for major is not supported": ignored
    name = "char" if kind == "c" else "block"
    if _wild(major):
        return f"{name}-*", access
    if _wild(minor):
        return f"{name}-{major}", access
    return f"/dev/{name}/{major}:{minor}", access


def device_allow(rules: Sequence[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]]:
    """(DevicePolicy, DeviceAllow entries) crun's systemd driver asks systemd for."""
    allow_all, remaining = False, {"c", "b"}
    for rule in reversed(rules):
        if not rule.get("allow"):
            break
        if _wild(_num(rule, "major")) and _wild(_num(rule, "minor")):
            kind = rule.get("type") or "a"
            if kind == "a":
                allow_all = True
                break
            remaining.discard(kind)
            if not remaining:
                allow_all = True
                break
    if allow_all:
        return "auto", []
    entries = [e for d in CRUN_DEFAULTS if (e := _entry(d[0], d[1], d[2], d[3])) is not None]
    start = next((i for i, r in enumerate(rules) if r.get("allow")), len(rules))  # no deny-all: first allow
    for i in range(len(rules) - 1):
        r = rules[i]
        if (r.get("type") or "a") == "a" and _wild(_num(r, "major")) and _wild(_num(r, "minor")) \
                and not r.get("allow"):
            start = i + 1
    for rule in rules[start:]:
        if not rule.get("allow"):
            raise DenyRuleError(str(rule))
        kinds = ("c", "b") if (rule.get("type") or "a") == "a" else (rule["type"],)
        for kind in kinds:
            e = _entry(kind, _num(rule, "major"), _num(rule, "minor"), rule.get("access") or "")
            if e is not None:
                entries.append(e)
    return "strict", entries


def unit_allows(policy: str, entries: Sequence[tuple[str, str]], kind: str, major: int, minor: int,
                access: str) -> bool:
    """Whether the unit lets the container open ``kind major:minor`` with every bit of ``access``."""
    if policy == "auto":
        return True
    name = "char" if kind == "c" else "block"
    granted = set()
    for device, acc in entries:
        if device in (f"{name}-*", f"{name}-{major}", f"/dev/{name}/{major}:{minor}"):
            granted |= set(acc)
    return set(access) <= granted
