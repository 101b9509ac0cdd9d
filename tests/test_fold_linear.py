"""The indexed spec-level folding (``hook.adapters.specwriter``, ``hook.adapters.allowlist``), rule
evaluator (``hook.core.rules.Verdicts``) and shadow dropping (``normalize``) give exactly what the
plain scans they replaced gave (``tests.fold_oracle``), on random rules."""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from hook.adapters import allowlist, specwriter
from hook.adapters.allowlist import UNNAMED, HostDevices, access_of, as_allow_list
from hook.adapters.specwriter import fold_plan
from hook.core import rules as rules_module
from hook.core.plan import Plan, Verdict
from hook.core.rules import Access, DeviceType, Rule, Verdicts, evaluate, normalize
from tests import fold_oracle

C, B = DeviceType.CHAR, DeviceType.BLOCK
MAJORS = (1, 195, 237, 300)
MINORS = (0, 1, 2, 255)

number = st.one_of(st.none(), st.sampled_from(MAJORS + MINORS), st.just(-1))
rule_st = st.builds(
    Rule,
    allow=st.booleans(),
    type=st.sampled_from([DeviceType.ALL, C, B]),
    major=number,
    minor=number,
    access=st.integers(1, 7).map(Access),
)
# config.json rules as an engine or a CDI edit may write them: missing or odd fields, runc's
# reading of each (no type is "a", a negative or non-integer number is "*") is the oracle's
json_number = st.one_of(
    st.none(), st.sampled_from(MAJORS + MINORS), st.just(-1), st.just(True), st.just("195")
)
json_rule = st.one_of(
    st.fixed_dictionaries(
        {"allow": st.one_of(st.booleans(), st.just("yes"))},
        optional={
            "type": st.sampled_from(["a", "c", "b", "", None]),
            "major": json_number,
            "minor": json_number,
            "access": st.sampled_from(["rwm", "r", "w", "rw"]),
        },
    ),
    rule_st.map(Rule.to_json),
    st.just("not a rule"),
)
probes = [(t, ma, mi) for t in (C, B) for ma in (*MAJORS, 7, UNNAMED) for mi in (*MINORS, 9, UNNAMED)]


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(rule_st, max_size=12),
    majors=st.fixed_dictionaries(
        {C: st.lists(st.sampled_from((*MAJORS, 5, -1))), B: st.lists(st.sampled_from((8, 195)))}
    ),
    known=st.lists(
        st.tuples(st.sampled_from([C, B]), st.sampled_from((*MAJORS, -1)), st.sampled_from((*MINORS, -1, 7)))
    ),
)
def test_allow_list_is_the_scanning_one(
    rules: list[Rule], majors: dict[DeviceType, list[int]], known: list[tuple[DeviceType, int, int]]
) -> None:
    assert as_allow_list(rules, majors, known) == fold_oracle.as_allow_list(rules, majors, known)


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_st, max_size=12))
def test_indexed_verdicts_answer_as_evaluate(rules: list[Rule]) -> None:
    verdicts = Verdicts(rules)
    for t, major, minor in probes:
        for default_allow in (False, True):
            for access in map(Access, range(1, 8)):
                assert verdicts.allows(t, major, minor, access, default_allow) == evaluate(
                    rules, t, major, minor, access, default_allow
                ), (t, major, minor, access, default_allow)
        if all((r.major or 0) >= 0 and (r.minor or 0) >= 0 for r in rules):  # access_of reads no negatives
            assert Access(verdicts.access(t, major, minor)) == access_of(rules, t, major, minor)


def _fold(config_rules: list[Any], plan_rules: list[Rule], host: HostDevices | None) -> list[Any]:
    config = {"linux": {"devices": [], "resources": {"devices": config_rules}}}
    plan = Plan(verdict=Verdict.APPLY, reason="test", rules=tuple(plan_rules))
    return list(fold_plan(config, plan, host)["linux"]["resources"]["devices"])


class _Scanning:
    """``specwriter._Touching`` answered by the oracle's scan over the very list being folded."""

    def __init__(self, rules: list[Any]) -> None:
        self.rules = rules

    def add(self, old: Any) -> None:  # the scan sees the appended rule in the list itself
        pass

    def last(self, rule: dict[str, Any]) -> Any:
        return fold_oracle.last_touching(self.rules, rule)


@settings(max_examples=400, deadline=None)
@given(config_rules=st.lists(json_rule, max_size=10), plan_rules=st.lists(rule_st, max_size=10))
def test_fold_appends_as_the_scanning_fold(config_rules: list[Any], plan_rules: list[Rule]) -> None:
    # the config's own last rules repeated as plan rules: the case the check exists for
    plan_rules = [*plan_rules, *(r for r in plan_rules[:2])]
    assert _fold(config_rules, plan_rules, None) == fold_oracle.fold_rules(config_rules, plan_rules)


@settings(max_examples=200, deadline=None)
@given(
    config_rules=st.lists(
        rule_st.filter(lambda r: r.type is not DeviceType.ALL or r.major is None).map(Rule.to_json),
        max_size=8,
    ),
    plan_rules=st.lists(
        rule_st.filter(lambda r: (r.major or 0) >= 0 and (r.minor or 0) >= 0), min_size=1, max_size=8
    ),
    nodes=st.lists(
        st.tuples(st.sampled_from([C, B]), st.sampled_from(MAJORS), st.sampled_from(MINORS)), max_size=6
    ),
)
def test_whole_fold_with_a_host_is_the_scanning_one(
    config_rules: list[Any], plan_rules: list[Rule], nodes: list[tuple[DeviceType, int, int]]
) -> None:
    host = HostDevices(majors={C: (1, 195), B: (8,)}, nodes=tuple(nodes))
    plan_rules = [
        *plan_rules,
        Rule(allow=False, type=C, major=195, minor=0),
    ]  # a deny: the allow-list is written
    new = _fold(config_rules, plan_rules, host)
    with (
        mock.patch.object(specwriter, "_Touching", _Scanning),
        mock.patch.object(allowlist, "as_allow_list", fold_oracle.as_allow_list),
    ):
        old = _fold(config_rules, plan_rules, host)
    assert new == old


@settings(max_examples=500, deadline=None)
@given(rules=st.lists(rule_st, max_size=14))
def test_shadow_dropping_is_the_scanning_one(rules: list[Rule]) -> None:
    """``normalize``'s first step, indexed, against the pass over every later rule per rule."""
    assert rules_module._drop_shadowed(rules) == fold_oracle.drop_shadowed(rules)
    assert normalize(rules) == normalize_with(fold_oracle.drop_shadowed, rules)


def normalize_with(drop: Any, rules: list[Rule]) -> tuple[Rule, ...]:
    with mock.patch.object(rules_module, "_drop_shadowed", drop):
        return normalize(rules)
