"""Device rules as an allow-list: "deny all", then only ``allow`` rules, never a deny after an allow.

Rule: pure. A narrowed privileged config is "allow everything, then deny these accelerator
nodes"; runc's systemd driver cannot express that (systemd has no deny entries: runc logs
"systemd doesn't support blacklist device rules", sets ``DevicePolicy=strict`` with an empty
``DeviceAllow=``, and after a ``daemon-reload`` the container loses every device, ``/dev/null``
included), and runc's v1 emulator refuses a deny that punches a hole in an allowed wildcard. So
the spec-level writer hands the runtime the same meaning as an allow-list:

* every block device keeps what the rules gave block devices (``b *:*``);
* every char major the host knows (``/proc/devices``, the nodes in ``/dev`` and in the config)
  keeps what the rules gave it (``c M:*``), unless some minor of it is narrower than the rest
  (a hole, i.e. an accelerator major with denied nodes);
* such a major keeps exactly its known minors that the rules allow (the allocated accelerators
  and the control nodes such as ``nvidiactl``), each with its own access.

The result never allows more than the rules did, for any device; it allows exactly as much for
every block device, every known char major without a hole and every known minor. What it gives
up: char majors no driver has registered yet (no device behind them today) and the unknown minors
of a holed major (a node created later on an accelerator major).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hook.core.record import record, replace
from hook.core.rules import DENY_ALL, Access, DeviceType, Rule, Verdicts, rule_number

__all__ = ["UNNAMED", "HostDevices", "parse_device_majors", "access_of", "as_allow_list", "is_allow_list"]

UNNAMED = 1 << 32  # a probe number no rule can name (rules hold 0..2^31-1 or None): all such look alike
_BITS = (Access.M, Access.R, Access.W)


@record
class HostDevices:
    """What the host knows of devices: majors with a driver, and the nodes under its ``/dev``."""

    majors: Mapping[DeviceType, tuple[int, ...]]
    nodes: tuple[tuple[DeviceType, int, int], ...] = ()


def parse_device_majors(text: str) -> dict[DeviceType, tuple[int, ...]]:
    """``/proc/devices``: the majors of both sections; a line that is not ``<number> <name>`` is skipped."""
    found: dict[DeviceType, list[int]] = {DeviceType.CHAR: [], DeviceType.BLOCK: []}
    current: DeviceType | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            current = {"Character devices:": DeviceType.CHAR, "Block devices:": DeviceType.BLOCK}.get(
                stripped
            )
            continue
        number = stripped.split(" ", 1)[0]
        if current is not None and number.isdigit():
            found[current].append(int(number))
    return {t: tuple(sorted(set(v))) for t, v in found.items()}


def access_of(rules: Sequence[Rule], type: DeviceType, major: int, minor: int) -> Access:
    """Every access bit the rules allow on ``type major:minor`` (default deny, last naming rule wins)."""
    verdict = {bit: False for bit in _BITS}
    for rule in rules:
        if (
            rule.type in (DeviceType.ALL, type)
            and rule.major in (None, major)
            and rule.minor in (None, minor)
        ):
            for bit in _BITS:
                if bit & rule.access:
                    verdict[bit] = rule.allow
    out = Access.NONE
    for bit, allowed in verdict.items():
        if allowed:
            out |= bit
    return out


def is_allow_list(rules: Sequence[Rule]) -> bool:
    """Starts with deny-all and holds no other deny: what runc's systemd driver can hand to systemd."""
    return bool(rules) and rules[0] == DENY_ALL and all(r.allow for r in rules[1:])


def _as_runtime_reads(rule: Rule) -> Rule:
    """A negative number is ``*`` to runc and crun: read it so, and so never write one back out."""
    major, minor = rule_number(rule.major), rule_number(rule.minor)
    return rule if (major, minor) == (rule.major, rule.minor) else replace(rule, major=major, minor=minor)


def as_allow_list(
    rules: Sequence[Rule],
    majors: Mapping[DeviceType, Iterable[int]],
    known: Iterable[tuple[DeviceType, int, int]] = (),
) -> tuple[Rule, ...]:
    """``rules`` rewritten as deny-all plus allows (see the module rule).

    ``majors`` lists, per type (``c``/``b``), the majors the host has a driver for; ``known`` the
    ``(type, major, minor)`` of every node the host or the config holds. Majors and minors the
    rules name are added to both.
    """
    rules = [_as_runtime_reads(r) for r in rules]
    known = [(kt, kmajor, kminor) for kt, kmajor, kminor in known if kmajor >= 0 and kminor >= 0]
    access = Verdicts(rules).access  # every probe below: a few lookups, not a pass over the rules
    out: list[Rule] = [DENY_ALL]
    for t in (DeviceType.BLOCK, DeviceType.CHAR):
        minors: dict[int, set[int]] = {}
        for m in majors.get(t, ()):
            if m >= 0:
                minors.setdefault(m, set())
        wild_minors: set[int] = set()
        for r in rules:
            if r.type not in (DeviceType.ALL, t):
                continue
            if r.major is None:
                if r.minor is not None:
                    wild_minors.add(r.minor)
            else:
                named = minors.setdefault(r.major, set())
                if r.minor is not None:
                    named.add(r.minor)
        for kt, kmajor, kminor in known:
            if kt is t:
                minors.setdefault(kmajor, set()).add(kminor)
        probes = {major: sorted(named | wild_minors) for major, named in minors.items()}
        floor = access(t, UNNAMED, UNNAMED)
        for m in wild_minors:
            floor &= access(t, UNNAMED, m)
        for major, ms in probes.items():
            for m in [UNNAMED, *ms]:
                floor &= access(t, major, m)
        if floor:
            out.append(Rule(allow=True, type=t, access=Access(floor)))
        for major in sorted(probes):
            exact = {m: access(t, major, m) for m in probes[major]}
            whole = access(t, major, UNNAMED)
            for bits in exact.values():
                whole &= bits
            covered = floor
            if whole & ~floor:
                out.append(Rule(allow=True, type=t, major=major, access=Access(whole)))
                covered |= whole
            for minor, bits in exact.items():
                if bits & ~covered:
                    out.append(Rule(allow=True, type=t, major=major, minor=minor, access=Access(bits)))
    return tuple(out)
