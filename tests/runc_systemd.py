"""A model of how runc's systemd cgroup driver turns a config's device rules into unit properties.

Restated (not copied) from runc's ``libcontainer/cgroups/devices/systemd.go`` (``systemdProperties``,
opencontainers/runc commit 1b2fd31; the same code lives on in opencontainers/cgroups
``devices/systemd.go``) and its emulator (opencontainers/cgroups ``devices/devices_emulator.go``):

* the rules (the config's, then runc's built-in ``AllowedDevices``, ``specconv/spec_linux.go``) go
  through the emulator: an ``a`` rule resets it to allow-all (allow) or deny-all (deny); in
  deny-all mode an allow adds an exception and a deny removes one; in allow-all mode the reverse;
  removing access that a wildcard exception still grants is an error ("cannot punch hole");
* an allow-all emulator with exceptions is a "blacklist": systemd has no deny entries, so runc
  logs "systemd doesn't support blacklist device rules" and sets ``DevicePolicy=strict`` with an
  *empty* ``DeviceAllow`` (every device denied); a plain allow-all becomes ``DevicePolicy=auto``;
* otherwise ``DevicePolicy=strict`` and one ``DeviceAllow`` entry per exception: ``char-*`` /
  ``block-*`` for ``*:*``, ``char-M`` for ``M:*`` (systemd >= 240), ``/dev/char/M:m`` for an exact
  node; a ``*:m`` rule is dropped with a warning.

systemd keeps these properties on the unit and writes them again on every ``daemon-reload``;
``unit_allows`` answers what the container may open after such a reload.
"""

from __future__ import annotations

from collections.abc import Sequence

from hook.core.rules import Access, DeviceType, Rule

__all__ = ["RUNC_DEFAULTS", "PunchHoleError", "systemd_properties", "unit_allows"]


def _r(t: DeviceType, major: int | None, minor: int | None, access: str) -> Rule:
    return Rule(allow=True, type=t, major=major, minor=minor, access=Access.parse(access))


C, B = DeviceType.CHAR, DeviceType.BLOCK
# runc 1.1 specconv.AllowedDevices, appended after the config's rules
RUNC_DEFAULTS = (
    _r(C, None, None, "m"),
    _r(B, None, None, "m"),
    *(_r(C, 1, m, "rwm") for m in (3, 8, 7, 5, 9)),  # null random full zero urandom
    _r(C, 5, 0, "rwm"),  # tty
    _r(C, 136, None, "rwm"),  # pts
    _r(C, 5, 2, "rwm"),  # ptmx
)


class PunchHoleError(ValueError):
    """runc refuses the rules (the container does not start)."""


Key = tuple[DeviceType, int | None, int | None]


def _emulate(rules: Sequence[Rule]) -> tuple[bool, dict[Key, Access]]:
    default_allow = False
    exceptions: dict[Key, Access] = {}
    for rule in rules:
        if rule.type is DeviceType.ALL:
            default_allow, exceptions = rule.allow, {}
            continue
        key: Key = (rule.type, rule.major, rule.minor)
        if rule.allow != default_allow:  # adds an exception
            exceptions[key] = exceptions.get(key, Access.NONE) | rule.access
            continue
        for partial in (
            (rule.type, None, rule.minor),
            (rule.type, rule.major, None),
            (rule.type, None, None),
        ):
            if partial != key and exceptions.get(partial, Access.NONE) & rule.access:
                raise PunchHoleError(f"cannot punch hole in {partial} with {rule}")
        left = exceptions.get(key, Access.NONE) & ~rule.access
        if left:
            exceptions[key] = left
        else:
            exceptions.pop(key, None)
    return default_allow, exceptions


def systemd_properties(rules: Sequence[Rule]) -> tuple[str, list[tuple[str, str]]]:
    """``(DevicePolicy, DeviceAllow)`` runc hands systemd for these rules (runc's defaults appended)."""
    default_allow, exceptions = _emulate([*rules, *RUNC_DEFAULTS])
    if default_allow:
        return ("auto", []) if not exceptions else ("strict", [])
    entries: list[tuple[str, str]] = []
    for (t, major, minor), access in sorted(
        exceptions.items(),
        key=lambda kv: (kv[0][1] or -1, kv[0][2] if kv[0][2] is not None else -1, kv[0][0]),
    ):
        group = "char-" if t is C else "block-"
        if major is None:
            if minor is not None:
                continue  # "_ *:n _" has no systemd form: runc warns and skips it
            entries.append((group + "*", str(access)))
        elif minor is None:
            entries.append((f"{group}{major}", str(access)))
        else:
            entries.append((f"/dev/{'char' if t is C else 'block'}/{major}:{minor}", str(access)))
    return "strict", entries


def unit_allows(
    props: tuple[str, list[tuple[str, str]]], t: DeviceType, major: int, minor: int, access: Access
) -> bool:
    """What the unit's device policy lets the container do once systemd re-applies it."""
    policy, entries = props
    if policy == "auto" and not entries:
        return True
    granted = Access.NONE
    for path, perms in entries:
        if path.startswith("/dev/"):
            kind, _, numbers = path[len("/dev/") :].partition("/")
            a, _, b = numbers.partition(":")
            hit = (kind == "char") == (t is C) and (int(a), int(b)) == (major, minor)
        else:
            kind, _, which = path.partition("-")
            hit = (kind == "char") == (t is C) and which in ("*", str(major))
        if hit:
            granted |= Access.parse(perms)
    return access & granted == access
