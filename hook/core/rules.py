"""Device cgroup rules: the one model both cgroup writers (v1 lines, v2 eBPF) consume.

Rule: a rule is OCI's ``linux.resources.devices`` entry made exact. ``major``/``minor`` of
``None`` mean "every" (``*``); ``type`` ``a`` means every type. Later rules override earlier
ones for the access they name, as in the OCI spec and the kernel's v1 exception list.

``evaluate`` is the reference meaning of a rule list (the emulator): for every access bit asked
for, the last rule that matches the device and names that bit decides it; bits no rule names get
the default. A request is allowed only if every bit is. ``normalize`` rewrites a list into a
shorter, ordered one with exactly the same ``evaluate`` answers, so both writers (v1 lines, v2
eBPF) start from the same rules and tests can compare their output.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Flag, StrEnum

from hook.core.record import record, replace

__all__ = [
    "Access",
    "DeviceType",
    "Rule",
    "ALLOW_ALL",
    "DENY_ALL",
    "evaluate",
    "normalize",
    "matches",
    "covers",
    "rule_number",
    "Verdicts",
]


class Access(Flag):
    """cgroup device access bits; the values are the kernel's BPF_DEVCG_ACC_* bits."""

    NONE = 0
    M = 1  # BPF_DEVCG_ACC_MKNOD
    R = 2  # BPF_DEVCG_ACC_READ
    W = 4  # BPF_DEVCG_ACC_WRITE
    RWM = 7

    @classmethod
    def parse(cls, text: str) -> Access:
        """Parse ``"rwm"``-style text; raises ValueError on any other letter."""
        acc = cls.NONE
        for ch in text:
            if ch == "r":
                acc |= cls.R
            elif ch == "w":
                acc |= cls.W
            elif ch == "m":
                acc |= cls.M
            else:
                raise ValueError(f"invalid access {text!r}: only r, w and m are allowed")
        return acc

    def __str__(self) -> str:
        return _ACCESS_TEXT[self._value_ & 7]


# Every rwm combination's text, by its bits (enum arithmetic per rule costs more than the lookup).
_ACCESS_TEXT = tuple("".join(c for c, bit in (("r", 2), ("w", 4), ("m", 1)) if bit & n) for n in range(8))


class DeviceType(StrEnum):
    """Device types a cgroup rule can name (``p``, fifo, only exists for mknod)."""

    ALL = "a"
    CHAR = "c"
    BLOCK = "b"


def rule_number(value: int | None) -> int | None:
    """A rule's major or minor as the runtime matches it: ``None`` is ``*``, and so is any negative
    number. runc turns an absent number into -1 and its eBPF filter checks a number only when it is
    ``>= 0`` (opencontainers/cgroups ``devices/devicefilter.go``; its v1 emulator and systemd
    driver treat -1 as ``*`` and the kernel's v1 parser refuses other negatives); crun's filter
    does the same (``ebpf.c``, ``has_major = major >= 0``). Callers refuse numbers out of range."""
    return None if value is None or value < 0 else value


@record
class Rule:
    allow: bool
    type: DeviceType = DeviceType.ALL
    major: int | None = None
    minor: int | None = None
    access: Access = Access.RWM

    def to_json(self) -> dict[str, object]:
        """The interface.md shape: ``{"allow","type","major","minor","access"}``."""
        return {
            "allow": self.allow,
            "type": str(self.type),
            "major": self.major,
            "minor": self.minor,
            "access": str(self.access),
        }

    @property
    def bits(self) -> int:
        """The access bits (what ``hook.core.plainplan.PlainRule.bits`` says for the same rule)."""
        return self.access.value & 7

    def v1_line(self) -> str:
        """The text written to ``devices.allow``/``devices.deny`` (``c 195:* rwm``)."""
        if self.type is DeviceType.ALL and self.major is None and self.minor is None:
            return "a"
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type!s} {major}:{minor} {_ACCESS_TEXT[self.access.value & 7]}"


ALLOW_ALL = Rule(allow=True)
DENY_ALL = Rule(allow=False)


_BITS = (Access.M, Access.R, Access.W)
_INT_BITS = tuple(b.value for b in _BITS)
_NOBODY = (-1, False)  # no rule names this bit: the default decides


def matches(rule: Rule, type: DeviceType, major: int, minor: int) -> bool:
    """Whether ``rule`` names the device ``type major:minor`` (access aside; a negative number is ``*``)."""
    return (
        rule.type in (DeviceType.ALL, type)
        and (rule.major is None or rule.major < 0 or rule.major == major)
        and (rule.minor is None or rule.minor < 0 or rule.minor == minor)
    )


def covers(outer: Rule, inner: Rule) -> bool:
    """Every device ``inner`` names is also named by ``outer`` (access aside)."""
    return (
        outer.type in (DeviceType.ALL, inner.type)
        and outer.major in (None, inner.major)
        and outer.minor in (None, inner.minor)
    )


def _overlap(a: Rule, b: Rule) -> bool:
    """Some device is named by both rules."""
    return (
        (DeviceType.ALL in (a.type, b.type) or a.type == b.type)
        and (None in (a.major, b.major) or a.major == b.major)
        and (None in (a.minor, b.minor) or a.minor == b.minor)
    )


def evaluate(
    rules: Sequence[Rule],
    type: DeviceType,
    major: int,
    minor: int,
    access: Access,
    default_allow: bool = False,
) -> bool:
    """Answer one kernel question the way the rule list means it: every bit, last naming rule wins.

    This is the oracle the eBPF builder and the v1 writer are tested against, so it is written
    for obviousness, not speed. ``type`` must be a real device type and ``access`` non-empty:
    the kernel never asks about ``a`` or about no access at all.
    """
    if type is DeviceType.ALL or not access:
        raise ValueError(f"a probe needs a device type c/b and some access, got {type} {access!r}")
    for bit in _BITS:
        if not bit & access:
            continue
        verdict = default_allow
        for rule in rules:
            if bit & rule.access and matches(rule, type, major, minor):
                verdict = rule.allow
        if not verdict:
            return False
    return True


class Verdicts:
    """``evaluate`` for many probes of one rule list: a probe costs a few lookups, not a pass over
    every rule (where both the rules and the probes grow with the node's accelerators, a pass per
    probe is quadratic).

    A probe ``T major:minor`` is named exactly by the rules keyed by type ``a`` or ``T``, major
    ``*`` or ``major`` and minor ``*`` or ``minor`` (a negative number read as ``*``, as
    ``matches`` does); per access bit, the last of those that names the bit decides it. So each key
    keeps, per bit, the position and verdict of its last rule naming it. Bits are plain ``int``
    (the ``Access`` values): enum arithmetic per probe would cost more than the lookups.
    """

    __slots__ = ("_last",)

    def __init__(self, rules: Sequence[Rule]) -> None:
        last: dict[tuple[object, object, object], list[tuple[int, bool]]] = {}
        for at, rule in enumerate(rules):
            key = (rule.type, rule_number(rule.major), rule_number(rule.minor))
            slot = last.setdefault(key, [_NOBODY, _NOBODY, _NOBODY])
            bits = rule.access.value
            for i, bit in enumerate(_INT_BITS):
                if bits & bit:
                    slot[i] = (at, rule.allow)
        self._last = last

    def access(self, type: DeviceType, major: int, minor: int, default_allow: bool = False) -> int:
        """The bits (``Access`` values) the rules allow on ``type major:minor``."""
        get, every = self._last.get, DeviceType.ALL
        named = (
            get((every, None, None)), get((every, None, minor)), get((every, major, None)),
            get((every, major, minor)), get((type, None, None)), get((type, None, minor)),
            get((type, major, None)), get((type, major, minor)),
        )  # fmt: skip
        slots = [s for s in named if s is not None]
        if not slots:
            return 7 if default_allow else 0
        latest = map(max, zip(*slots, strict=True)) if len(slots) > 1 else slots[0]
        out = 0  # per bit, the latest of the naming rules (one slot: its own), else the default
        for bit, (at, allow) in zip(_INT_BITS, latest, strict=True):
            if allow if at >= 0 else default_allow:
                out |= bit
        return out

    def allows(
        self, type: DeviceType, major: int, minor: int, access: Access, default_allow: bool = False
    ) -> bool:
        """``evaluate(rules, type, major, minor, access, default_allow)``."""
        if type is DeviceType.ALL or not access:
            raise ValueError(f"a probe needs a device type c/b and some access, got {type} {access!r}")
        wanted = access.value
        return self.access(type, major, minor, default_allow) & wanted == wanted


def _drop_shadowed(rules: Sequence[Rule]) -> list[Rule]:
    """Remove access bits a later rule over a superset of devices decides anyway; drop emptied rules.

    One pass from the end: the rules that ``covers`` a rule ``T major:minor`` are keyed by type
    ``a`` or ``T``, major ``*`` or ``major``, minor ``*`` or ``minor`` (numbers as written), so
    each key keeps the union of the access of the rules after the current one (a pass over the
    later rules per rule was quadratic: 132,353 ``covers`` calls for a 513-rule slice pod plan).
    """
    later: dict[tuple[object, object, object], int] = {}
    kept: list[Rule] = []
    for rule in reversed(rules):
        shadow = 0
        for t in {DeviceType.ALL, rule.type}:
            for major in {None, rule.major}:
                for minor in {None, rule.minor}:
                    shadow |= later.get((t, major, minor), 0)
        own = rule.access.value
        key = (rule.type, rule.major, rule.minor)
        later[key] = later.get(key, 0) | own
        access = own & ~shadow & 7
        if access:
            kept.append(rule if access == own else replace(rule, access=Access(access)))
    kept.reverse()
    return kept


def _commute(a: Rule, b: Rule) -> bool:
    """Swapping two neighbours cannot change any answer."""
    return a.allow == b.allow or not (a.access & b.access) or not _overlap(a, b)


def _sort_key(rule: Rule) -> tuple[int, str, int, int, bool, int]:
    """Broad rules first, then by type, major, minor; ``None`` (``*``) sorts before numbers."""
    wild = (rule.type is DeviceType.ALL) + (rule.major is None) + (rule.minor is None)
    major = -1 if rule.major is None else rule.major
    minor = -1 if rule.minor is None else rule.minor
    return (-wild, str(rule.type), major, minor, rule.allow, rule.access.value)


def _sorted(rules: list[Rule]) -> list[Rule]:
    """Insertion sort that only swaps neighbours that commute, so the meaning is kept."""
    out: list[Rule] = []
    for rule in rules:
        pos = len(out)
        while pos > 0 and _sort_key(rule) < _sort_key(out[pos - 1]) and _commute(rule, out[pos - 1]):
            pos -= 1
        out.insert(pos, rule)
    return out


def _merge_neighbours(rules: list[Rule]) -> list[Rule]:
    """Fold adjacent rules on the same devices with the same verdict into one (``r`` + ``w`` = ``rw``)."""
    out: list[Rule] = []
    for rule in rules:
        prev = out[-1] if out else None
        if prev is not None and prev.allow == rule.allow and covers(prev, rule) and covers(rule, prev):
            out[-1] = replace(prev, access=prev.access | rule.access)
        else:
            out.append(rule)
    return out


def normalize(rules: Sequence[Rule]) -> tuple[Rule, ...]:
    """The same meaning (for both defaults) as ``rules``, deduplicated, merged and in a stable order.

    Steps: access bits shadowed by a later, broader-or-equal rule are dropped (this removes
    duplicates and no-op rules), rules are sorted broad-to-narrow where swapping cannot change an
    answer, and neighbours on the same devices with the same verdict are merged. The output is a
    fixed point: normalizing it again returns it unchanged.
    """
    current = list(rules)
    for _ in range(len(current) + 1):  # bounded: a later round only drops, merges or re-sorts
        nxt = _merge_neighbours(_sorted(_drop_shadowed(current)))
        if nxt == current:
            break
        current = nxt
    return tuple(current)
