"""The daemon-reload case (issue 14, item 4), through a model of runc's systemd driver.

The model is tests/runc_systemd.py.

With the systemd cgroup driver, runc hands systemd the container's device policy as unit
properties, and every ``systemctl daemon-reload`` writes them into the cgroup again. What the
unit says is therefore what the container keeps:

* spec level (``hook precreate``): the decided allow-list becomes ``DevicePolicy=strict`` plus a
  ``DeviceAllow=`` that grants exactly what runc applied: the narrowing survives a reload;
* prestart (post-hoc) narrowing: the unit still holds the engine's allow-all (``DevicePolicy=auto``):
  a reload re-opens every card the hook denied;
* allow-all plus denies in the config (the naive spec-level fold): runc cannot express it,
  sets ``DevicePolicy=strict`` with no ``DeviceAllow`` at all, and a reload takes ``/dev/null`` away.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hook.adapters.allowlist import HostDevices, parse_device_majors
from hook.adapters.specwriter import fold_plan
from hook.core.oci import parse_config_object, parse_rule
from hook.core.rules import Access, DeviceType, Rule, evaluate
from tests.hosttree import CAPS_MAJOR, make_host_tree
from tests.runc_systemd import RUNC_DEFAULTS, PunchHoleError, systemd_properties, unit_allows

C, B = DeviceType.CHAR, DeviceType.BLOCK
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "slice-privileged" / "config.json"
OTHER_CARDS = [(C, 195, m) for m in (0, 2, 3, 4, 5, 6, 7)]
KEPT = [(C, 195, 1), (C, 195, 255), (C, 1, 3), (C, 5, 0), (C, 136, 4), (C, 511, 0), (C, 10, 200), (B, 8, 0)]


def _plan_and_config(tmp_path: Path) -> tuple[dict[str, object], object]:
    """The seed 000 slice pod decided by the real decide, and the host it ran on."""
    from hook.core.decide import decide
    from hook.core.settings import Settings
    from hook.routes.gather import Options, inputs_for_config

    root = tmp_path / "root"
    make_host_tree(root, "8x-mig", mknod=False)
    raw = json.loads(EXAMPLE.read_text())
    config = parse_config_object(raw, str(EXAMPLE), str(EXAMPLE.parent))
    inventory = Path(__file__).resolve().parents[1] / "examples" / "node" / "inventory.json"
    opts = Options(
        driver_root=root,
        spec_dirs=(tmp_path,),
        inventory_file=inventory,
        use_cache=False,
        settings=Settings(),
    )
    inputs = inputs_for_config(config, {}, "slice", opts)
    return raw, decide(inputs)


@pytest.fixture
def decided(tmp_path: Path) -> tuple[dict[str, object], object, HostDevices]:
    raw, plan = _plan_and_config(tmp_path)
    host = HostDevices(majors=parse_device_majors((tmp_path / "root/proc/devices").read_text()))
    return raw, plan, host


def _rules(config: dict[str, object]) -> list[Rule]:
    linux = config["linux"]
    assert isinstance(linux, dict)
    return [parse_rule(r, "c", "r") for r in linux["resources"]["devices"]]


def _cgroupfs(rules: list[Rule], t: DeviceType, major: int, minor: int) -> bool:
    """What runc's own cgroup writer applies at start: the config's rules, then its defaults."""
    return evaluate([*rules, *RUNC_DEFAULTS], t, major, minor, Access.R | Access.W)


def test_spec_level_allow_list_survives_a_reload(decided) -> None:
    raw, plan, host = decided
    rules = _rules(fold_plan(raw, plan, host))
    props = systemd_properties(rules)
    policy, allow = props
    assert policy == "strict"
    assert ("/dev/char/195:1", "rwm") in allow and ("/dev/char/195:255", "rwm") in allow
    assert ("block-*", "rwm") in allow and ("char-1", "rwm") in allow
    assert not any(
        path.startswith(("/dev/char/195:0", "char-195", f"char-{CAPS_MAJOR}")) for path, _ in allow
    )
    # after daemon-reload the unit grants exactly what runc applied at start, device by device
    probes = [*OTHER_CARDS, *KEPT, (C, CAPS_MAJOR, 1), (C, CAPS_MAJOR, 2), (C, 195, 254), (C, 4, 1)]
    for t, major, minor in probes:
        at_start = _cgroupfs(rules, t, major, minor)
        after_reload = unit_allows(props, t, major, minor, Access.R | Access.W)
        assert after_reload == at_start, (t, major, minor)
    assert not any(unit_allows(props, *p, Access.R) for p in OTHER_CARDS)
    assert all(unit_allows(props, *p, Access.R | Access.W) for p in KEPT)


def test_prestart_narrowing_is_undone_by_a_reload(decided) -> None:
    raw, _, _ = decided
    props = systemd_properties(_rules(raw))  # the unit only ever saw the engine's allow-all
    assert props == ("auto", [])
    assert all(unit_allows(props, *p, Access.R | Access.W) for p in OTHER_CARDS)  # every card back


def test_allow_all_plus_denies_loses_every_device_after_a_reload(decided) -> None:
    raw, plan, _ = decided
    naive = _rules(fold_plan(raw, plan))  # no host: the old fold, allow-all then one deny per card
    assert naive[0] == Rule(allow=True) and not naive[-1].allow
    props = systemd_properties(naive)
    assert props == ("strict", [])  # "systemd doesn't support blacklist device rules"
    assert not unit_allows(props, C, 1, 3, Access.R | Access.W)  # /dev/null gone


def test_a_deny_inside_an_allowed_wildcard_is_refused_by_runc() -> None:
    """Why the allow-list never follows an allow with a deny: runc's emulator rejects the hole."""
    rules = [
        Rule(allow=False),
        Rule(allow=True, type=C, major=195),
        Rule(allow=False, type=C, major=195, minor=3),
    ]
    with pytest.raises(PunchHoleError):
        systemd_properties(rules)


def test_a_deny_after_an_allow_a_rule_with_numbers_is_written_again() -> None:
    """Issue 31 (s142737-153): runc reads an allow ``a`` rule as every device whatever its numbers,
    so a deny the config already holds *before* such a rule does not hold: the spec writer must
    append the plan's deny after it, not skip it as already there."""
    from hook.core.plan import Plan, Verdict

    deny = Rule(allow=False, type=DeviceType.CHAR, major=195, minor=1, access=Access.RWM)
    raw = {
        "linux": {
            "resources": {
                "devices": [
                    deny.to_json(),
                    {"allow": True, "type": "a", "major": 1, "minor": 3, "access": "rwm"},  # runc: a *:* rwm
                ]
            }
        }
    }
    plan = Plan(verdict=Verdict.APPLY, reason="narrowed", rules=(deny,))
    rules = _rules(fold_plan(raw, plan))
    assert not evaluate(rules, DeviceType.CHAR, 195, 1, Access.R | Access.W)
    assert rules[-1] == deny
