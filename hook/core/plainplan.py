"""A plan as plain values: what crosses the decider's wire and what the live apply step reads.

Rule: the per-start process acts on a decision it did not make, so it needs the plan's facts,
not the decision core's types: every rule as its allow flag, type letter (``a``, ``c``, ``b``),
numbers and access text (``rwm`` order), every node as ``Node``. Nothing here imports ``enum``
(``hook.core.rules`` and ``hook.core.plan`` do): a served start that applies a plan loads neither.
``hook.core.plan.plain`` turns a ``Plan`` into this form (its enums read as text), and
``PlainRule.parse`` reads the wire's list back with the checks ``Access.parse`` and ``DeviceType``
made (a letter they refuse is a ``ValueError``). Both cgroup writers read these values: v1 the
rules as they are, v2 the plan's ``normal`` list (the rules normalized where they were decided).
"""

from __future__ import annotations

from hook.core.record import field, record

__all__ = ["Node", "PlainPlan", "PlainRule", "access_bits", "access_text"]

VERDICTS = ("none", "apply", "deny")  # hook.core.plan.Verdict's values
TYPES = ("a", "c", "b")  # hook.core.rules.DeviceType's values
_BIT = {"m": 1, "r": 2, "w": 4}  # the kernel's BPF_DEVCG_ACC_* bits, as hook.core.rules.Access
_TEXT = tuple("".join(c for c, bit in (("r", 2), ("w", 4), ("m", 1)) if bit & n) for n in range(8))


def access_bits(text: str) -> int:
    """``Access.parse(text).value``: ``ValueError`` on any letter but r, w and m."""
    bits = 0
    for ch in text:
        if ch not in _BIT:
            raise ValueError(f"invalid access {text!r}: only r, w and m are allowed")
        bits |= _BIT[ch]
    return bits


def access_text(bits: int) -> str:
    """``str(Access(bits))``: the letters in ``rwm`` order."""
    return _TEXT[bits & 7]


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
class PlainRule:
    """``hook.core.rules.Rule`` with its type as a letter and its access as text."""

    allow: bool
    type: str = "a"
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"

    @classmethod
    def parse(cls, allow: bool, type: str, major: int | None, minor: int | None, access: str) -> PlainRule:
        """The rule, its type and access checked as ``DeviceType``/``Access.parse`` check them."""
        if type not in TYPES:
            raise ValueError(f"{type!r} is not a valid device type")
        return cls(allow=allow, type=type, major=major, minor=minor, access=access_text(access_bits(access)))

    @property
    def bits(self) -> int:
        return access_bits(self.access)

    def v1_line(self) -> str:
        """``Rule.v1_line``: the text written to ``devices.allow``/``devices.deny``."""
        if self.type == "a" and self.major is None and self.minor is None:
            return "a"
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"


@record
class PlainPlan:
    """``hook.core.plan.Plan`` in plain values (the verdict as its text)."""

    verdict: str
    reason: str
    rules: tuple[PlainRule, ...] = ()
    create: tuple[Node, ...] = ()
    remove: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    denied: tuple[str, ...] = ()
    # ``hook.core.rules.normalize(rules)``, made where the plan was decided: the cgroup v2 writer
    # builds its eBPF program from it as it is (normalizing here would load enum)
    normal: tuple[PlainRule, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.rules or self.create or self.remove)
