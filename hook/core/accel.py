"""What the engine already gave a container: privileged mode, CAP_SYS_ADMIN, accelerator nodes,
and the nodes CDI injection appended after a privileged allow-all.

Rule: pure functions of the config's rules and paths, read as runc applies them
(``hook.core.oci.parse_rule``, ``hook.core.kpath``). ``is_accelerator`` is asked for every node of
the container and the host, several times per start, so its globs compile once per process.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from hook.core.kpath import container_path
from hook.core.oci import OciConfig
from hook.core.rules import Access, DeviceType, Rule

__all__ = ["is_privileged", "has_sys_admin", "is_accelerator", "injected_keys"]


def is_privileged(rules: Sequence[Rule]) -> bool:
    """The engine's privileged mode: an allow-all rule (containerd ``WithAllDevicesAllowed``, CRI-O);
    ``a`` with numbers allows everything too, as runc applies it (``oci.parse_rule``)."""
    return any(
        r.allow
        and r.type is DeviceType.ALL
        and Access.R | Access.W in r.access
        for r in rules
    )


def has_sys_admin(config: OciConfig) -> bool:
    return "CAP_SYS_ADMIN" in config.bounding


_MATCHERS: dict[tuple[str, ...], re.Pattern[str]] = {}
_LAST: list[tuple[Mapping[str, tuple[str, ...]], dict[str, tuple[str, ...]], re.Pattern[str]]] = []


def _matcher(patterns: Mapping[str, tuple[str, ...]]) -> re.Pattern[str]:
    """All vendors' globs as one compiled regex (one compile per process, not one per glob).

    Called once per node, so the mapping last asked about is remembered with a copy of its
    contents: the same, unchanged mapping is answered by one dict comparison.
    """
    if _LAST and _LAST[0][0] is patterns and _LAST[0][1] == patterns:
        return _LAST[0][2]
    key = tuple(p for pats in patterns.values() for p in pats)
    if key not in _MATCHERS:
        _MATCHERS[key] = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in key) or "(?!)")
    _LAST[:] = [(patterns, dict(patterns), _MATCHERS[key])]
    return _MATCHERS[key]


_SEEN: dict[tuple[re.Pattern[str], str], bool] = {}


def is_accelerator(path: str, patterns: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether ``path`` is a /dev node one of the globs names; remembered per (globs, path),
    since one start asks it several times for every node of the container and the host."""
    matcher = _matcher(patterns)
    known = _SEEN.get((matcher, path))
    if known is not None:
        return known
    clean = container_path(path)  # //dev/x and dev/x are /dev/x to runc and the kernel (hook.kpath)
    found = clean.startswith("/dev/") and matcher.match(clean[len("/dev/") :]) is not None
    if len(_SEEN) < 65536:
        _SEEN[(matcher, path)] = found
    return found


def injected_keys(rules: Sequence[Rule]) -> frozenset[tuple[str, int, int]]:
    """Exact allow rules after the (last) allow-all: in a privileged container the engine resets
    the rules to one allow-all, and CDI injection (containerd ``WithCDI``, CRI-O
    ``SpecInjectCDIDevices``) then appends one allow rule per injected node, so these are the
    devices injected into this very container (the CDI library's ``InjectDevices``, which both call,
    adds one allow rule per device node)."""
    last = max((i for i, r in enumerate(rules) if is_privileged((r,))), default=None)
    if last is None:
        return frozenset()
    return frozenset(
        (str(r.type), r.major, r.minor)
        for r in rules[last + 1 :]
        if r.allow and r.major is not None and r.minor is not None
    )
