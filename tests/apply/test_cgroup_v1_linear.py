"""``cgroup_v1.check_effect`` is linear and says exactly what the quadratic original said.

The reference below is the original O(rules^2 + rules * entries) check, kept verbatim in meaning:
for each rule, the bits no later covering rule re-decides; an allow needs one entry covering the
rule with all those bits; a deny needs no overlapping entry granting any of them; with
``a *:* rwm`` listed only a wildcard deny can be checked.
"""

from __future__ import annotations

import cProfile
import pstats
import random
from collections.abc import Callable, Sequence

import pytest

from hook.adapters.apply.cgroup_v1 import ListEntry, check_effect
from hook.core.rules import Access, DeviceType, Rule

TYPES = (DeviceType.ALL, DeviceType.CHAR, DeviceType.BLOCK)


def reference(entries: Sequence[ListEntry], rules: Sequence[Rule]) -> list[str]:
    def pending(i: int) -> Access:
        acc = rules[i].access
        for later in rules[i + 1 :]:
            if ListEntry(later.type, later.major, later.minor, later.access).covers(rules[i]):
                acc &= ~later.access
        return acc

    allow_all = [e for e in entries if e == ListEntry(DeviceType.ALL, None, None, Access.RWM)]
    failed = []
    for i, rule in enumerate(rules):
        acc = pending(i)
        if not acc:
            continue
        if allow_all:
            ok = rule.allow or rule.v1_line() != "a"
        elif rule.allow:
            ok = any(e.covers(rule) and (e.access & acc) == acc for e in entries)
        else:
            ok = not any(e.overlaps(rule) and (e.access & acc) for e in entries)
        if not ok:
            failed.append(("allow " if rule.allow else "deny ") + rule.v1_line())
    return failed


def _num(rng: random.Random, wild: float) -> int | None:
    return None if rng.random() < wild else rng.choice((0, 1, 2, 195, 237))


def _access(rng: random.Random) -> Access:
    return Access(rng.randint(1, 7))


def random_rule(rng: random.Random) -> Rule:
    return Rule(
        allow=rng.random() < 0.5,
        type=rng.choice(TYPES),
        major=_num(rng, 0.2),
        minor=_num(rng, 0.3),
        access=_access(rng),
    )


def random_entry(rng: random.Random) -> ListEntry:
    return ListEntry(rng.choice(TYPES), _num(rng, 0.15), _num(rng, 0.25), _access(rng))


@pytest.mark.parametrize("seed", range(400))
def test_linear_check_equals_the_quadratic_one_on_random_rule_sets(seed: int) -> None:
    rng = random.Random(seed)
    rules = [random_rule(rng) for _ in range(rng.randint(0, 14))]
    entries = [random_entry(rng) for _ in range(rng.randint(0, 10))]
    if rng.random() < 0.15:
        entries.append(ListEntry(DeviceType.ALL, None, None, Access.RWM))
    rng.shuffle(entries)
    assert check_effect(entries, rules) == reference(entries, rules)


def test_random_sets_exercise_every_branch() -> None:
    """The random sets above are not trivially empty: some fail, some pass, both kinds, both lists."""
    outcomes = set()
    for seed in range(400):
        rng = random.Random(seed)
        rules = [random_rule(rng) for _ in range(rng.randint(0, 14))]
        entries = [random_entry(rng) for _ in range(rng.randint(0, 10))]
        for line in reference(entries, rules):
            outcomes.add(line.split()[0])
    assert outcomes == {"allow", "deny"}


def _narrowing(n: int) -> tuple[list[ListEntry], list[Rule]]:
    """A node's worth of device rules on a default-deny list: allow n nodes, deny n others."""
    rules = []
    entries = []
    for minor in range(n):
        rw = Access.R | Access.W
        rules.append(Rule(allow=True, type=DeviceType.CHAR, major=195, minor=minor, access=rw))
        rules.append(Rule(allow=False, type=DeviceType.CHAR, major=237, minor=minor))
        entries.append(ListEntry(DeviceType.CHAR, 195, minor, Access.R | Access.W))
    return entries, rules


def _calls(run: Callable[[], object]) -> int:
    """Python-level calls made (work, not time: a loaded machine's memory effects blur timings)."""
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def test_big_rule_sets_agree_and_the_work_is_linear() -> None:
    entries, rules = _narrowing(300)
    assert check_effect(entries, rules) == reference(entries, rules) == []
    few = _calls(lambda: check_effect(*_narrowing(400)))
    many = _calls(lambda: check_effect(*_narrowing(3200)))
    assert many <= few * 8 * 1.1, (few, many)  # the original made ~8x more again (quadratic)


def test_the_work_count_sees_a_quadratic_check() -> None:
    """The call count is not blind: the original, quadratic check fails the same bound."""
    few = _calls(lambda: reference(*_narrowing(50)))
    many = _calls(lambda: reference(*_narrowing(400)))
    assert many > few * 8 * 1.1
