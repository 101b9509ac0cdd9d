"""The spec writer adapter: fold a decision into config.json, as a CDI-aware engine would hand it to runc.

Rule: pure; takes the config as decoded JSON and returns a new one. CDI edits go first (the
engine applies them before runc), then the Plan: rules appended after the config's own,
created nodes added to ``linux.devices``, removed paths taken out of it.
"""

from __future__ import annotations

import copy
from typing import Any

from hook.plan import Plan

__all__ = ["fold_plan"]


def fold_plan(config: dict[str, Any], plan: Plan) -> dict[str, Any]:
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
    for rule in (r.to_json() for r in plan.rules):
        if _last_touching(rules, rule) != rule:  # a CDI edit already appended this very rule last
            rules.append(rule)
    resources["devices"] = rules
    return out


def _last_touching(rules: list[Any], rule: dict[str, Any]) -> Any:
    """The last rule that decides any access for ``rule``'s device(s): an identical one makes it a no-op."""
    for old in reversed(rules):
        if not isinstance(old, dict):
            continue
        if (old.get("type", "a") in ("a", rule.get("type"))
                and old.get("major") in (None, rule.get("major"))
                and old.get("minor") in (None, rule.get("minor"))):
            return old
    return None
