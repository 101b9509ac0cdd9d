"""The Plan: the one value ``decide`` returns and every adapter (live or simulated) consumes.

Rule: a Plan is complete before anything is applied. Adapters get the whole Plan; none of them
decides anything, so simulation and live mode differ only in the adapter.
"""

from __future__ import annotations

from enum import StrEnum

from hook.core.plainplan import Node as Node  # enum-free: the per-start apply step reads it
from hook.core.plainplan import PlainPlan, PlainRule
from hook.core.record import field, record
from hook.core.rules import Rule, normalize

__all__ = ["Verdict", "Node", "Plan", "plain"]


class Verdict(StrEnum):
    NONE = "none"
    APPLY = "apply"
    DENY = "deny"


@record
class Plan:
    verdict: Verdict
    reason: str
    rules: tuple[Rule, ...] = ()
    create: tuple[Node, ...] = ()
    remove: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    denied: tuple[str, ...] = ()  # accelerator nodes denied (or, under audit, that would be), by path

    @property
    def changes(self) -> bool:
        return bool(self.rules or self.create or self.remove)


def plain(plan: Plan | PlainPlan) -> PlainPlan:
    """``plan`` as plain values (``hook.core.plainplan``: what crosses the wire and is applied)."""
    if isinstance(plan, PlainPlan):
        return plan

    def rules(given: tuple[Rule, ...]) -> tuple[PlainRule, ...]:
        return tuple(
            PlainRule(allow=r.allow, type=str(r.type), major=r.major, minor=r.minor, access=str(r.access))
            for r in given
        )

    return PlainPlan(
        verdict=str(plan.verdict),
        reason=plan.reason,
        rules=rules(plan.rules),
        create=plan.create,
        remove=plan.remove,
        warnings=plan.warnings,
        denied=plan.denied,
        normal=rules(tuple(normalize(plan.rules))) if plan.rules else (),
    )
