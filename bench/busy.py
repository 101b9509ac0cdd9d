"""What else was using the CPU: the few busiest processes over a short window, for the Machine section.

Rule: read /proc only (two snapshots of every process's utime+stime, ``interval`` apart), so the
page can say what shared the 2 cores while it was measured; a process that ends meanwhile is
skipped. Names are the kernel's ``comm`` (escaped for Markdown by the caller's backticks).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["busiest"]


def _ticks() -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(entry.name)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def busiest(interval: float = 2.0, top: int = 5) -> str:
    """``comm`` and CPU % (of one core) of the ``top`` busiest processes over ``interval`` seconds."""
    hz = os.sysconf("SC_CLK_TCK")
    first = _ticks()
    time.sleep(interval)
    second = _ticks()
    used: dict[str, float] = {}
    count: dict[str, int] = {}
    for pid, (comm, ticks) in second.items():
        if pid in first and pid != os.getpid() and ticks > first[pid][1]:
            used[comm] = used.get(comm, 0.0) + (ticks - first[pid][1]) / hz / interval * 100
            count[comm] = count.get(comm, 0) + 1
    ranked = sorted(((pct, comm) for comm, pct in used.items() if pct >= 1.0), reverse=True)[:top]
    total = sum(used.values())
    text = ", ".join(f"{comm.replace('`', '')} ({count[comm]} proc) {pct:.0f}%" for pct, comm in ranked)
    text = text or "nothing above 1%"
    return f"{text} (all processes: {total:.0f}% of one core)"
