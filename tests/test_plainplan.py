"""Issue 35 item 1: a served decision's plan is applied from plain values (``hook.core.plainplan``),
with no ``enum``; every one of them must read, print and apply exactly as the core's ``Rule`` and
``Plan`` it came from.
"""

from __future__ import annotations

import itertools
import random

import pytest

from hook.adapters.apply.cgroup_v1 import ListEntry, check_effect, parse_list
from hook.core.plainplan import PlainPlan, PlainRule, access_bits, access_text
from hook.core.plan import Node, Plan, Verdict, plain
from hook.core.rules import Access, DeviceType, Rule
from hook.routes.decision import Live, from_wire, to_wire

NUMBERS = (None, 0, 3, 195, -1)


def every_rule() -> list[Rule]:
    return [
        Rule(allow=allow, type=kind, major=major, minor=minor, access=Access(bits))
        for allow, kind, major, minor, bits in itertools.product(
            (True, False), DeviceType, NUMBERS, NUMBERS, range(8)
        )
    ]


def test_a_plain_rule_prints_and_reads_as_the_core_rule() -> None:
    rules = every_rule()
    plans = plain(Plan(verdict=Verdict.APPLY, reason="r", rules=tuple(rules))).rules
    for rule, p in zip(rules, plans, strict=True):
        assert (p.allow, p.type, p.major, p.minor) == (rule.allow, str(rule.type), rule.major, rule.minor)
        assert p.v1_line() == rule.v1_line(), rule
        assert p.bits == rule.bits == rule.access.value
        assert PlainRule.parse(*rule.to_json().values()) == p  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "r", "w", "m", "rw", "wr", "mwr", "rwm", "mm", "rrw"])
def test_access_reads_as_access_parse(text: str) -> None:
    assert access_bits(text) == Access.parse(text).value
    assert access_text(access_bits(text)) == str(Access.parse(text))


@pytest.mark.parametrize(("kind", "access"), [("x", "rw"), ("C", "rw"), ("c", "rx"), ("c", "R"), ("", "r")])
def test_what_the_core_refuses_the_plain_form_refuses(kind: str, access: str) -> None:
    with pytest.raises(ValueError):
        DeviceType(kind) if kind not in ("a", "c", "b") else Access.parse(access)  # the core's reading
    with pytest.raises(ValueError):
        PlainRule.parse(True, kind, 195, 0, access)


def test_a_served_answer_with_an_unknown_verdict_type_or_access_is_unreadable() -> None:
    """As before: such an answer is a fallback ("an answer this hook cannot read"), never applied."""
    plan = Plan(verdict=Verdict.APPLY, reason="r", rules=(Rule(allow=True, type=DeviceType.CHAR, major=1),))
    good = to_wire(Live(code=0, plan=plan))
    for old, new in ((b'"apply"', b'"allow"'), (b'"c", 1', b'"x", 1'), (b'"rwm"]', b'"rwz"]')):
        assert old in good
        with pytest.raises(ValueError):
            from_wire(good.replace(old, new))


def test_a_plain_plan_is_checked_on_devices_list_as_the_core_plan() -> None:
    """cgroup v1's read-back check says the same for the plain rules as for the core's, on random
    lists (the v2 writer turns plain rules back into ``Rule`` before it builds its program)."""
    rng = random.Random(35)
    types, numbers = ("a", "c", "b"), (None, 0, 1, 195)
    for _ in range(300):
        rules = [
            Rule(allow=rng.random() < 0.5, type=DeviceType(rng.choice(types)), major=rng.choice(numbers),
                 minor=rng.choice(numbers), access=Access(rng.randint(1, 7)))
            for _ in range(rng.randint(0, 8))
        ]  # fmt: skip
        listing = "\n".join(
            f"{rng.choice(types)} {rng.choice(('*', '0', '1', '195'))}:{rng.choice(('*', '0', '1'))} "
            f"{access_text(rng.randint(1, 7))}"
            for _ in range(rng.randint(0, 6))
        )
        entries = parse_list(listing, "l")
        enum_entries = [ListEntry(DeviceType(e.type), e.major, e.minor, Access(e.access)) for e in entries]
        plain_rules = plain(Plan(verdict=Verdict.APPLY, reason="", rules=tuple(rules))).rules
        expected = check_effect(enum_entries, rules)
        assert check_effect(entries, plain_rules) == check_effect(entries, rules) == expected


def test_nodes_are_the_core_nodes() -> None:
    node = Node(path="/dev/nvidia1", type="c", major=195, minor=1, file_mode=0o640, uid=1, gid=2)
    plan = Plan(verdict=Verdict.APPLY, reason="r", create=(node,), remove=("/dev/nvidia0",))
    assert plain(plan).create == (node,) and plain(plan).remove == ("/dev/nvidia0",)
    assert plain(plan).changes and not plain(Plan(verdict=Verdict.NONE, reason="")).changes


def _random_rules(rng: random.Random, n: int) -> list[Rule]:
    types, numbers = ("a", "c", "b"), (None, 0, 1, 195, 237)
    return [
        Rule(allow=rng.random() < 0.5, type=DeviceType(rng.choice(types)), major=rng.choice(numbers),
             minor=rng.choice(numbers), access=Access(rng.randint(1, 7)))
        for _ in range(n)
    ]  # fmt: skip


def test_the_v2_program_from_a_served_plan_is_the_core_plans() -> None:
    """The cgroup v2 writer builds a served plan's program from its ``normal`` list as it is (no
    ``normalize``, no enum): byte for byte the program and digest the core's rules give, with and
    without an original program to append, and a program one path built is recognised by the other."""
    from hook.adapters.apply import bpf

    original = bpf.build_program([Rule(allow=False, type=DeviceType.CHAR, major=1, minor=3)], None, True)
    rng = random.Random(36)
    for _ in range(300):
        rules = _random_rules(rng, rng.randint(1, 10))
        plan = Plan(verdict=Verdict.APPLY, reason="", rules=tuple(rules))
        served = from_wire(to_wire(Live(code=0, plan=plan)))
        assert isinstance(served, Live) and served.plan is not None
        normal = served.plan.normal  # type: ignore[union-attr]
        assert normal == plain(plan).normal
        assert bpf.rules_digest(normal, normalized=True) == bpf.rules_digest(rules)
        for fallthrough, default in ((None, True), (original, False)):
            assert bpf.build_program(normal, fallthrough, default, normalized=True) == bpf.build_program(
                rules, fallthrough, default
            )


def test_a_plans_normal_list_is_the_core_normalize() -> None:
    from hook.core.rules import normalize

    rng = random.Random(37)
    for _ in range(200):
        rules = tuple(_random_rules(rng, rng.randint(0, 12)))
        got = plain(Plan(verdict=Verdict.APPLY, reason="", rules=rules)).normal
        want = plain(Plan(verdict=Verdict.APPLY, reason="", rules=normalize(rules))).rules if rules else ()
        assert got == want


def test_a_served_plan_reads_each_rule_once_for_both_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """``normal`` is ``rules`` in another order: the per-start process reads each distinct rule once
    (254 GPUs: 257 rules, not 514 reads), and both lists come back as the core's."""
    rules = tuple(Rule(allow=False, type=DeviceType.CHAR, major=195, minor=m) for m in range(64))
    plan = Plan(verdict=Verdict.APPLY, reason="r", rules=(Rule(allow=True), *rules))
    wire = to_wire(Live(code=0, plan=plan))
    reads = []
    real = PlainRule.parse.__func__  # type: ignore[attr-defined]

    def parse(cls: type[PlainRule], *args: object) -> PlainRule:
        reads.append(args)
        return real(cls, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(PlainRule, "parse", classmethod(parse))
    served = from_wire(wire)
    assert len(reads) == len(plan.rules)
    assert isinstance(served, Live) and served.plan == plain(plan)


def test_rows_that_are_equal_but_not_the_same_json_are_read_apart() -> None:
    """A key of 0 finds False's entry in a dict: such a row is read on its own, as it always was."""
    wire = to_wire(Live(code=0, plan=Plan(verdict=Verdict.APPLY, reason="r", rules=(Rule(allow=False),))))
    odd = wire.replace(b'"rules": [[false,', b'"rules": [[0,')
    assert odd != wire
    served = from_wire(odd)
    assert isinstance(served, Live) and isinstance(served.plan, PlainPlan)
    assert type(served.plan.rules[0].allow) is int and type(served.plan.normal[0].allow) is bool


def test_the_decider_answers_the_json_normalized_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a decision is encoded once in the decider: ``wire_of`` gives the bytes ``normalized``
    read back for that very value (in this thread only), and they read as that value."""
    import threading

    from hook.routes import decision

    plan = Plan(verdict=Verdict.APPLY, reason="r", rules=(Rule(allow=True, type=DeviceType.CHAR, major=195),))
    served = decision.normalized(Live(code=0, plan=plan, record={"verdict": "apply"}))
    encodes: list[object] = []
    real = decision.to_wire
    monkeypatch.setattr(decision, "to_wire", lambda d: encodes.append(d) or real(d))  # type: ignore[func-returns-value]
    data = decision.wire_of(served)
    assert encodes == [] and from_wire(data) == served and data == real(served)
    other: list[bytes] = []
    worker = threading.Thread(target=lambda: other.append(decision.wire_of(served)))
    worker.start()
    worker.join()
    assert encodes == [served] and other == [data]  # another thread encodes it itself, the same
    assert decision.wire_of(Live(code=0)) == real(Live(code=0)) and len(encodes) == 2
