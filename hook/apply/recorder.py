"""The simulation adapter: records what a live run would apply, and touches nothing.

Rule: simulation and live mode differ only in the adapter, so the Recorder takes the same whole
Plan the live transaction takes and turns it into the same steps, in the same order, as data
(cgroup rules with their v1 lines, then node removals, then node creations).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hook.plan import Node, Plan
from hook.rules import Rule

__all__ = ["Recorder"]


class Recorder:
    """Collects steps in ``steps``; ``apply``/``rollback`` mirror the cgroup writers' interface."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def apply(self, rules: Iterable[Rule]) -> tuple[str, ...]:
        rules = tuple(rules)
        lines = tuple(("allow " if r.allow else "deny ") + r.v1_line() for r in rules)
        self.steps.append({"step": "cgroup", "rules": [r.to_json() for r in rules], "v1": list(lines)})
        return lines

    def rollback(self) -> None:
        self.steps.append({"step": "rollback"})

    def nodes(self, create: Sequence[Node], remove: Sequence[str]) -> None:
        if remove:
            self.steps.append({"step": "remove", "paths": sorted(remove)})
        if create:
            self.steps.append({"step": "create", "nodes": [n.to_json() for n in create]})

    def apply_plan(self, plan: Plan) -> list[dict[str, Any]]:
        """The steps ``transaction.apply_plan`` would take for ``plan``, as JSON-ready data."""
        if plan.rules:
            self.apply(plan.rules)
        self.nodes(plan.create, plan.remove)
        return self.steps
