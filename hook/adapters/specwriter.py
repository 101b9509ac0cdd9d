"""The spec writer adapter: fold a decision into config.json, as the runtime will then apply it.

Rule: pure; takes the config as decoded JSON and returns a new one. Used by simulation's
``--output-config`` and by ``hook precreate`` (the same fold, so what an operator simulates is
what the runtime gets). CDI edits go first (what a CDI-aware engine does before runc), then the
Plan: created nodes added to ``linux.devices``, removed paths taken out of it, rules appended after
the config's own. A plan that denies (narrowing) rewrites the rules as an allow-list
(``hook.adapters.allowlist``): runc's systemd driver and its v1 emulator both mishandle deny rules after an
allow, and the allow-list is what survives a ``systemctl daemon-reload``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hook.core.plan import Plan
from hook.core.rules import rule_number

if TYPE_CHECKING:
    from hook.adapters.allowlist import HostDevices
    from hook.sources.cdi.edits import ContainerEdits

__all__ = ["fold_plan", "fold_cdi", "cdi_already_applied"]


def fold_plan(config: dict[str, Any], plan: Plan, host: HostDevices | None = None) -> dict[str, Any]:
    """``config`` with ``plan`` folded in; with ``host`` (the node's majors and nodes), a narrowing
    plan's rules become an allow-list instead of allow-all plus denies."""
    out = copy.deepcopy(config)
    linux = out.setdefault("linux", {})
    gone = set(plan.remove)
    devices = [d for d in linux.get("devices") or [] if d.get("path") not in gone]
    have = {d.get("path") for d in devices}
    for node in plan.create:
        if node.path not in have:
            devices.append(node.to_json())
    linux["devices"] = devices
    resources = linux.setdefault("resources", {})
    rules = list(resources.get("devices") or [])
    touching = _Touching(rules)
    for rule in (r.to_json() for r in plan.rules):
        if touching.last(rule) != rule:  # a CDI edit already appended this very rule last
            rules.append(rule)
            touching.add(rule)
    if host is not None and any(not r.allow for r in plan.rules):
        rules = _allow_list(rules, devices, host)
    resources["devices"] = rules
    return out


class _Touching:
    """The last rule that decides any access for a plan rule's device(s), found by lookup: an
    identical one makes the plan rule a no-op. Read as runc does (``oci.parse_rule``): no type is
    ``a``, a negative number is ``*``, and ``a`` with ``allow`` allows every device, numbers or not.

    A rule touches plan rule ``T major:minor`` when its type is ``a`` or ``T`` and each of its numbers
    is ``*`` or equal: at most eight exact keys. Each key keeps its last rule and that rule's
    position, so a plan of n rules over a config of m costs n + m, not n * (n + m) (big nodes hold
    hundreds of each).
    """

    __slots__ = ("_count", "_last")

    def __init__(self, rules: list[Any]) -> None:
        self._last: dict[tuple[object, object, object], tuple[int, Any]] = {}
        self._count = 0
        for old in rules:
            self.add(old)

    def add(self, old: Any) -> None:
        """``old`` is now the config's last rule."""
        self._count += 1
        if not isinstance(old, dict):
            return
        kind = old.get("type") or "a"
        if not isinstance(kind, str):  # never a plan rule's type, so it touches none
            return
        every = kind == "a" and old.get("allow") is True  # runc: "a" allows every device, numbers or not
        major, minor = (None, None) if every else (_number(old.get("major")), _number(old.get("minor")))
        self._last[(kind, rule_number(major), rule_number(minor))] = (self._count, old)

    def last(self, rule: dict[str, Any]) -> Any:
        """The last rule touching ``rule`` (a plan rule's JSON), or ``None``."""
        found = (0, None)
        for kind in {"a", rule.get("type")}:
            for major in {None, rule.get("major")}:
                for minor in {None, rule.get("minor")}:
                    hit = self._last.get((kind, major, minor))
                    if hit is not None and hit[0] > found[0]:
                        found = hit
        return found[1]


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _allow_list(rules: list[Any], devices: Iterable[Any], host: HostDevices) -> list[Any]:
    from hook.adapters.allowlist import as_allow_list
    from hook.core.oci import parse_rule
    from hook.core.rules import DeviceType

    parsed = [parse_rule(r, "config.json", f"linux.resources.devices[{i}]") for i, r in enumerate(rules)]
    known = [
        (DeviceType(d["type"]), int(d["major"]), int(d["minor"]))
        for d in devices
        if isinstance(d, dict) and d.get("type") in ("c", "b")
    ]
    return [r.to_json() for r in as_allow_list(parsed, host.majors, [*known, *host.nodes])]


def cdi_already_applied(config: dict[str, Any], edits: ContainerEdits) -> bool:
    """Every edit is already in the config, exactly (``hook.sources.cdi.pending.pending`` is empty)."""
    from hook.sources.cdi.pending import pending

    return pending(config, edits).is_empty()


def fold_cdi(config: dict[str, Any], edits: ContainerEdits) -> dict[str, Any]:
    """``config`` with the CDI edits applied as the engine would, less what the engine already
    applied exactly (``hook.sources.cdi.pending``): a node or mount that differs is applied, and so
    replaces the entry at its path or destination."""
    from hook.sources.cdi.edits import apply_to_config
    from hook.sources.cdi.pending import pending

    rest = pending(config, edits)
    if rest.is_empty():
        return config
    return apply_to_config(config, rest)
