"""One line of ``hook doctor``: a ``Check`` (name, ok, detail, fix) and the checklist's rendering.

Rule: a check reads the host, never changes it, and never raises; ``✓`` only beside what is
right, ``✗`` beside a failure (the run exits 1), ``!`` beside what the doctor cannot judge or what
is wrong only for an engine the node may not use (a warning: the run still passes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from hook.core.record import asdict, record

HOOK_PATH = "/usr/libexec/oci-device-hook/hook"  # the contract's paths (docs/interface.md)
LIBEXEC = "/usr/libexec/oci-device-hook"


@record(kw_only=False)
class Check:
    """``ok`` false fails the run; ``warn`` (with ``ok`` true) is a ``!`` line that does not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False


def render(checks: Sequence[Check], fmt: str) -> str:
    """Text checklist for people, or a JSON list of {name, ok, detail, fix, warn} for programs."""
    if fmt == "json":
        return json.dumps([asdict(c) for c in checks], indent=2)
    lines = ["oci-device-hook doctor"]
    for c in checks:
        mark = "✗" if not c.ok else "!" if c.warn else "✓"
        lines.append(f"{mark} {c.name}: {c.detail}")
        if (not c.ok or c.warn) and c.fix:
            lines.append(f"    fix: {c.fix}")
    passed = sum(c.ok for c in checks)
    warned = sum(c.ok and c.warn for c in checks)
    note = f" ({warned} with a warning)" if warned else ""
    lines.append(f"{passed} of {len(checks)} checks passed{note}")
    return "\n".join(lines)
