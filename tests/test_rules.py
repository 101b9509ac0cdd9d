"""The rule emulator: ``evaluate`` is "later rule wins per access bit"; ``normalize`` keeps its meaning."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hook.core.rules import ALLOW_ALL, DENY_ALL, Access, DeviceType, Rule, evaluate, normalize

C, B, A = DeviceType.CHAR, DeviceType.BLOCK, DeviceType.ALL
R, W, M, RW, RWM = Access.R, Access.W, Access.M, Access.R | Access.W, Access.RWM


def rule(
    allow: bool,
    type: DeviceType = A,
    major: int | None = None,
    minor: int | None = None,
    access: Access = RWM,
):
    return Rule(allow=allow, type=type, major=major, minor=minor, access=access)


@dataclass(frozen=True)
class Case:
    name: str
    rules: tuple[Rule, ...]
    probe: tuple[DeviceType, int, int, Access]
    want: dict[bool, bool]  # default_allow -> verdict


CASES = [
    Case("no rules gives the default", (), (C, 1, 3, R), {False: False, True: True}),
    Case("allow-all", (ALLOW_ALL,), (B, 8, 0, RWM), {False: True, True: True}),
    Case("later deny wins", (ALLOW_ALL, rule(False, C, 195, 1)), (C, 195, 1, R), {False: False, True: False}),
    Case(
        "later deny of w leaves r",
        (ALLOW_ALL, rule(False, C, 195, 1, access=W)),
        (C, 195, 1, R),
        {False: True, True: True},
    ),
    Case(
        "later deny of w denies rw",
        (ALLOW_ALL, rule(False, C, 195, 1, access=W)),
        (C, 195, 1, RW),
        {False: False, True: False},
    ),
    Case(
        "allow r does not allow rw",
        (DENY_ALL, rule(True, C, 1, 3, access=R)),
        (C, 1, 3, RW),
        {False: False, True: False},
    ),
    Case(
        "r and w from two rules allow rw",
        (rule(True, C, 1, None, access=R), rule(True, C, 1, 3, access=W)),
        (C, 1, 3, RW),
        {False: True, True: True},
    ),
    Case(
        "earlier allow beaten by later wildcard deny",
        (rule(True, C, 1, 3), rule(False, C, 1, None)),
        (C, 1, 3, R),
        {False: False, True: False},
    ),
    Case(
        "type c rule ignores block devices", (rule(False, C, 8, 0),), (B, 8, 0, R), {False: False, True: True}
    ),
    Case("major wildcard", (rule(True, C, None, 0, access=M),), (C, 42, 0, M), {False: True, True: True}),
    Case(
        "unnamed bits fall to default",
        (rule(True, C, 1, 3, access=R),),
        (C, 1, 3, Access.R | Access.M),
        {False: False, True: True},
    ),
]


@pytest.mark.parametrize("default_allow", [False, True], ids=["default deny", "default allow"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_evaluate(case: Case, default_allow: bool) -> None:
    assert evaluate(case.rules, *case.probe, default_allow=default_allow) is case.want[default_allow]
    assert (
        evaluate(normalize(case.rules), *case.probe, default_allow=default_allow) is case.want[default_allow]
    )


@pytest.mark.parametrize("probe", [(A, 1, 3, R), (C, 1, 3, Access.NONE)], ids=["type a", "no access"])
def test_evaluate_refuses_questions_the_kernel_never_asks(probe: tuple) -> None:
    with pytest.raises(ValueError, match="probe"):
        evaluate((), *probe)


@pytest.mark.parametrize(
    ("name", "rules", "want"),
    [
        ("duplicates collapse", (rule(True, C, 1, 3), rule(True, C, 1, 3)), (rule(True, C, 1, 3),)),
        (
            "split access merges",
            (rule(True, C, 1, 3, access=R), rule(True, C, 1, 3, access=W)),
            (rule(True, C, 1, 3, access=RW),),
        ),
        (
            "everything before a wildcard is a no-op",
            (rule(False, C, 1, 3), rule(True, C, 1, 9), ALLOW_ALL),
            (ALLOW_ALL,),
        ),
        (
            "shadowed bits are dropped",
            (rule(True, C, 1, 3), rule(False, C, 1, None, access=W)),
            (rule(False, C, 1, None, access=W), rule(True, C, 1, 3, access=R | M)),
        ),
        (
            "broad first when order does not matter",
            (rule(True, C, 1, 3, access=R), rule(True, C, 1, None, access=W)),
            (rule(True, C, 1, None, access=W), rule(True, C, 1, 3, access=R)),
        ),
        (
            "every type counts as wider than one type's every device",
            (rule(True, C, None, None, access=M), rule(True, A, None, None, access=R)),
            (rule(True, A, None, None, access=R), rule(True, C, None, None, access=M)),
        ),
        (
            "order kept when it matters",
            (rule(False, C, 1, 3), rule(True, C, 1, None)),
            (rule(True, C, 1, None),),
        ),
        (
            "narrow allow after broad deny stays after",
            (rule(False, C, 1, None), rule(True, C, 1, 3)),
            (rule(False, C, 1, None), rule(True, C, 1, 3)),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_normalize_examples(name: str, rules: tuple[Rule, ...], want: tuple[Rule, ...]) -> None:
    assert normalize(rules) == want


rule_st = st.builds(
    Rule,
    allow=st.booleans(),
    type=st.sampled_from([A, C, B]),
    major=st.none() | st.sampled_from([1, 195]),
    minor=st.none() | st.sampled_from([0, 3]),
    access=st.sampled_from([R, W, M, RW, R | M, RWM]),
)
PROBES = [
    (t, ma, mi, acc)
    for t in (C, B)
    for ma in (1, 195, 7)
    for mi in (0, 3, 9)
    for acc in (R, W, M, RW, R | M, W | M, RWM)
]


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_st, max_size=8))
def test_normalize_keeps_every_answer_and_is_a_fixed_point(rules: list[Rule]) -> None:
    out = normalize(rules)
    assert len(out) <= len(rules)
    assert normalize(out) == out
    assert len(set(out)) == len(out)
    for default_allow in (False, True):
        for probe in PROBES:
            assert evaluate(out, *probe, default_allow=default_allow) == evaluate(
                rules, *probe, default_allow=default_allow
            ), (probe, default_allow)


def test_access_text_is_rwm_in_that_order() -> None:
    """v1 ``devices.allow``/``deny`` lines and the report spell access as r, w, m in this order."""
    texts = [str(Access(n)) for n in range(8)]
    assert texts == ["", "m", "r", "rm", "w", "wm", "rw", "rwm"]
    assert all(Access.parse(t) == Access(n) for n, t in enumerate(texts))
