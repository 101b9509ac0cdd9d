"""The Plan: the one value ``decide`` returns and every adapter (live or simulated) consumes.

Rule: a Plan is complete before anything is applied. Adapters get the whole Plan; none of them
decides anything, so simulation and live mode differ only in the adapter.
"""

from __future__ import annotations

from enum import StrEnum

from hook.core.record import field, record
from hook.core.rules import Rule

__all__ = ["Verdict", "Node", "Plan"]


class Verdict(StrEnum):
    NONE = "none"
    APPLY = "apply"
    DENY = "deny"


@record
class Node:
    """A device node as seen from inside the container (``path`` is a container path)."""

    path: str
    type: str  # "c" or "b"
    major: int
    minor: int
    file_mode: int = 0o666
    uid: int = 0
    gid: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "type": self.type,
            "major": self.major,
            "minor": self.minor,
            "fileMode": self.file_mode,
            "uid": self.uid,
            "gid": self.gid,
        }


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
