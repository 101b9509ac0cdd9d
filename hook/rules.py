"""Device cgroup rules: the one model both cgroup writers (v1 lines, v2 eBPF) consume.

Rule: a rule is OCI's ``linux.resources.devices`` entry made exact. ``major``/``minor`` of
``None`` mean "every" (``*``); ``type`` ``a`` means every type. Later rules override earlier
ones for the access they name, as in the OCI spec and the kernel's v1 exception list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Flag, StrEnum

__all__ = ["Access", "DeviceType", "Rule", "ALLOW_ALL", "DENY_ALL"]


class Access(Flag):
    """cgroup device access bits; the values are the kernel's BPF_DEVCG_ACC_* bits."""

    NONE = 0
    M = 1  # BPF_DEVCG_ACC_MKNOD
    R = 2  # BPF_DEVCG_ACC_READ
    W = 4  # BPF_DEVCG_ACC_WRITE
    RWM = 7

    @classmethod
    def parse(cls, text: str) -> Access:
        """Parse ``"rwm"``-style text; raises ValueError on any other letter."""
        acc = cls.NONE
        for ch in text:
            if ch == "r":
                acc |= cls.R
            elif ch == "w":
                acc |= cls.W
            elif ch == "m":
                acc |= cls.M
            else:
                raise ValueError(f"invalid access {text!r}: only r, w and m are allowed")
        return acc

    def __str__(self) -> str:
        return "".join(c for c, bit in (("r", Access.R), ("w", Access.W), ("m", Access.M)) if bit & self)


class DeviceType(StrEnum):
    """Device types a cgroup rule can name (``p``, fifo, only exists for mknod)."""

    ALL = "a"
    CHAR = "c"
    BLOCK = "b"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    allow: bool
    type: DeviceType = DeviceType.ALL
    major: int | None = None
    minor: int | None = None
    access: Access = Access.RWM

    def to_json(self) -> dict[str, object]:
        """The interface.md shape: ``{"allow","type","major","minor","access"}``."""
        return {
            "allow": self.allow,
            "type": str(self.type),
            "major": self.major,
            "minor": self.minor,
            "access": str(self.access),
        }

    def v1_line(self) -> str:
        """The text written to ``devices.allow``/``devices.deny`` (``c 195:* rwm``)."""
        if self.type is DeviceType.ALL and self.major is None and self.minor is None:
            return "a"
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"


ALLOW_ALL = Rule(allow=True)
DENY_ALL = Rule(allow=False)
