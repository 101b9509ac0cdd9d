"""One exception family for the whole hook; only ``hook.cli``/``hook.entry`` map it to exit codes.

Rule: every error names the file and the field at fault, so runc can show the one line to a
user who can act on it. ``InputError`` is bad input, ``PolicyRefusal`` a deliberate ``deny``,
``ApplyError`` a failed change to a live container (after rollback).
"""

from __future__ import annotations

__all__ = ["HookError", "InputError", "PolicyRefusal", "ApplyError", "UsageError"]


class HookError(Exception):
    """Base of every error the hook raises on purpose; the exit code is a class attribute."""

    exit_code = 1

    def __init__(self, file: str, field: str, reason: str) -> None:
        super().__init__(file, field, reason)
        self.file = file
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        """One line: file, field, reason; each escaped and capped (a field or reason may quote a
        container's string), a repeated part said once."""
        from hook.core.escape import clean

        parts: list[str] = []
        for p in (self.file, self.field, self.reason):
            if p and (not parts or parts[-1] != p):
                parts.append(p)
        return ": ".join(clean(p, 1024) for p in parts)

    def as_object(self) -> dict[str, object]:
        """The error for ``--format json`` (stdout stays JSON on error): each part escaped as in ``str``."""
        from hook.core.escape import clean

        fields = {"file": self.file, "field": self.field, "reason": self.reason}
        escaped = {k: clean(v, 1024) for k, v in fields.items()}
        return {"message": str(self), **escaped, "exit_code": self.exit_code}


class InputError(HookError):
    """A file, field or argument the hook was given cannot be used as it is."""


class PolicyRefusal(HookError):
    """The decision is ``deny``: the container must not start (exit 3)."""

    exit_code = 3


class ApplyError(HookError):
    """Changing the live container failed; everything already changed has been undone."""


class UsageError(HookError):
    """The command line itself is wrong (exit 2)."""

    exit_code = 2
