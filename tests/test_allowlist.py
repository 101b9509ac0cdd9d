"""hook.adapters.allowlist: a narrowed rule list as deny-all plus allows, never wider, exact where
promised."""

from __future__ import annotations

import random

import pytest

from hook.adapters.allowlist import UNNAMED, access_of, as_allow_list, is_allow_list
from hook.core.rules import DENY_ALL, Access, DeviceType, Rule, evaluate

C, B = DeviceType.CHAR, DeviceType.BLOCK
RWM = Access.RWM


def allow(t: DeviceType, major: int | None = None, minor: int | None = None, a: Access = RWM) -> Rule:
    return Rule(allow=True, type=t, major=major, minor=minor, access=a)


def deny(t: DeviceType, major: int | None = None, minor: int | None = None, a: Access = RWM) -> Rule:
    return Rule(allow=False, type=t, major=major, minor=minor, access=a)


SEED000_MAJORS = {C: [1, 4, 5, 10, 195, 226, 234, 236, 237, 511], B: [7, 8, 9, 253]}


def test_privileged_slice_pod_keeps_its_card_the_control_nodes_and_every_other_major() -> None:
    rules = [
        Rule(allow=True),
        *(deny(C, 195, m) for m in (0, 2, 3, 4, 5, 6, 7)),
        deny(C, 237, 1),
        deny(C, 237, 2),
    ]
    known = [(C, 195, m) for m in (*range(8), 254, 255)] + [(C, 237, 1), (C, 237, 2), (C, 511, 0)]
    out = as_allow_list(rules, SEED000_MAJORS, known)
    assert out == (
        DENY_ALL,
        allow(B),
        *(allow(C, m) for m in (1, 4, 5, 10)),
        allow(C, 195, 1),
        allow(C, 195, 254),
        allow(C, 195, 255),
        *(allow(C, m) for m in (226, 234, 236)),
        allow(C, 511),
    )
    assert is_allow_list(out)
    # 237 (nvidia-caps) has no allowed known minor left: nothing of it is allowed
    assert access_of(out, C, 237, 5) == Access.NONE


def test_an_allow_list_stays_what_it_was() -> None:
    rules = [
        DENY_ALL,
        allow(C, 195, 1, Access.R | Access.W),
        allow(C, 195, 3),
        deny(C, 195, 3),
        allow(C, 136),
    ]
    out = as_allow_list(rules, SEED000_MAJORS, [(C, 195, 3)])
    assert out == (DENY_ALL, allow(C, 136), allow(C, 195, 1, Access.R | Access.W))


def test_access_bits_are_kept_per_node() -> None:
    rules = [Rule(allow=True, access=Access.R | Access.M), deny(C, 195, 0), allow(C, 195, 1, Access.W)]
    out = as_allow_list(rules, {C: [195], B: []}, [(C, 195, 255)])
    assert access_of(out, C, 195, 1) == RWM
    assert access_of(out, C, 195, 255) == Access.R | Access.M
    assert access_of(out, C, 195, 0) == Access.NONE
    assert access_of(out, B, 8, 0) == Access.R | Access.M


def test_is_allow_list() -> None:
    assert is_allow_list([DENY_ALL, allow(C, 1)])
    assert not is_allow_list([Rule(allow=True), deny(C, 195, 0)])
    assert not is_allow_list([DENY_ALL, allow(C, 195), deny(C, 195, 0)])
    assert not is_allow_list([])


def _random_rule(rng: random.Random) -> Rule:
    t = rng.choice([DeviceType.ALL, C, B])
    major = rng.choice([None, None, 1, 195, 237, 300])
    minor = rng.choice([None, None, 0, 1, 2]) if rng.random() < 0.8 else None
    access = Access(rng.randint(1, 7))
    return Rule(allow=rng.random() < 0.55, type=t, major=major, minor=minor, access=access)


@pytest.mark.parametrize("seed", range(200))
def test_never_wider_and_exact_on_known_nodes_of_unholed_majors(seed: int) -> None:
    rng = random.Random(seed)
    rules = [_random_rule(rng) for _ in range(rng.randint(1, 8))]
    majors = {
        C: rng.sample([1, 5, 195, 237, 400], rng.randint(0, 4)),
        B: rng.sample([8, 195], rng.randint(0, 2)),
    }
    known = [(rng.choice([C, B]), rng.choice([1, 195, 237, 400]), rng.choice([0, 1, 2, 3])) for _ in range(4)]
    out = as_allow_list(rules, majors, known)
    assert is_allow_list(out)
    every_major = {1, 5, 8, 195, 237, 300, 400, 999}
    for t in (C, B):
        for major in every_major:
            for minor in (0, 1, 2, 3, 7, UNNAMED):
                for bit in (Access.M, Access.R, Access.W):
                    if evaluate(out, t, major, minor, bit):
                        assert evaluate(rules, t, major, minor, bit), (t, major, minor, bit, out)
    # exact where the module promises it: every known node, every minor of a major without a hole
    for t, major, minor in known:
        assert access_of(out, t, major, minor) == access_of(rules, t, major, minor)
    for t in (C, B):
        listed = set(majors[t]) | {r.major for r in rules if r.major is not None and r.type in (t, "a")}
        listed |= {k[1] for k in known if k[0] is t}
        for major in listed:
            holes = {access_of(rules, t, major, m) for m in (0, 1, 2, 3, UNNAMED)}
            if len(holes) == 1:  # every minor alike: the whole major is kept as it was
                assert access_of(out, t, major, 9) == access_of(rules, t, major, 9)
