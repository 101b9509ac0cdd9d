"""The spec-level folding as it was before it was indexed: plain scans, kept as the oracle the
indexed code is compared with (``tests/test_fold_linear.py``). Quadratic, and obviously right.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hook.adapters.allowlist import UNNAMED, access_of
from hook.core.record import replace
from hook.core.rules import DENY_ALL, Access, DeviceType, Rule, rule_number

__all__ = ["as_allow_list", "drop_shadowed", "fold_rules", "last_touching"]


def last_touching(rules: list[Any], rule: dict[str, Any]) -> Any:
    """The last rule that decides any access for ``rule``'s device(s), found by scanning back."""
    for old in reversed(rules):
        if not isinstance(old, dict):
            continue
        kind = old.get("type") or "a"
        every = kind == "a" and old.get("allow") is True
        major, minor = (None, None) if every else (_number(old.get("major")), _number(old.get("minor")))
        if (
            kind in ("a", rule.get("type"))
            and rule_number(major) in (None, rule.get("major"))
            and rule_number(minor) in (None, rule.get("minor"))
        ):
            return old
    return None


def fold_rules(config_rules: list[Any], plan_rules: Iterable[Rule]) -> list[Any]:
    """The config's rules with the plan's appended, less those a CDI edit already appended last."""
    rules = list(config_rules)
    for rule in (r.to_json() for r in plan_rules):
        if last_touching(rules, rule) != rule:
            rules.append(rule)
    return rules


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _and(values: Iterable[Access], start: Access = Access.RWM) -> Access:
    out = start
    for v in values:
        out &= v
    return out


def as_allow_list(
    rules: Sequence[Rule],
    majors: Mapping[DeviceType, Iterable[int]],
    known: Iterable[tuple[DeviceType, int, int]] = (),
) -> tuple[Rule, ...]:
    """``hook.adapters.allowlist.as_allow_list`` with every probe a full ``access_of`` scan."""
    rules = [replace(r, major=rule_number(r.major), minor=rule_number(r.minor)) for r in rules]
    known = [(kt, kmajor, kminor) for kt, kmajor, kminor in known if kmajor >= 0 and kminor >= 0]
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
        floor = _and(
            [access_of(rules, t, UNNAMED, UNNAMED)]
            + [access_of(rules, t, UNNAMED, m) for m in wild_minors]
            + [access_of(rules, t, major, m) for major, ms in probes.items() for m in [UNNAMED, *ms]]
        )
        if floor:
            out.append(Rule(allow=True, type=t, access=floor))
        for major in sorted(probes):
            exact = {m: access_of(rules, t, major, m) for m in probes[major]}
            whole = _and(exact.values(), access_of(rules, t, major, UNNAMED))
            covered = floor
            if whole & ~floor:
                out.append(Rule(allow=True, type=t, major=major, access=whole))
                covered |= whole
            for minor, access in exact.items():
                if access & ~covered:
                    out.append(Rule(allow=True, type=t, major=major, minor=minor, access=access))
    return tuple(out)


def drop_shadowed(rules: Sequence[Rule]) -> list[Rule]:
    """``hook.core.rules._drop_shadowed`` as a pass over the later rules per rule."""
    from hook.core.rules import covers

    kept: list[Rule] = []
    for i, rule in enumerate(rules):
        access = rule.access
        for later in rules[i + 1 :]:
            if covers(later, rule):
                access &= ~later.access
        if access:
            kept.append(rule if access == rule.access else replace(rule, access=access))
    return kept
