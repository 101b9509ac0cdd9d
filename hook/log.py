"""The live-mode log: one JSON line per container, size-rotated like logrotate's ``size``.

Rule: logging never decides whether a container starts. ``write_log`` returns ``None`` on
success and the error text on failure (the caller may print it as a warning); it never
raises. Lines are ``json.dumps(sort_keys=True)`` so equal records give equal lines, and a
line is written with one ``write(2)`` on an ``O_APPEND`` fd so concurrent hooks do not
interleave within a line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["write_log"]

MAX_BYTES = 10 * 1024 * 1024


def _rotate(path: Path, backups: int) -> None:
    """path.N-1 → path.N … path → path.1; the oldest is dropped."""
    if backups <= 0:
        path.unlink(missing_ok=True)
        return
    for n in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
    os.replace(path, path.with_name(f"{path.name}.1"))


def write_log(record: dict[str, Any], path: Path, max_bytes: int = MAX_BYTES, backups: int = 3) -> str | None:
    """Append ``record`` as one line to ``path``; rotate first if the line would pass ``max_bytes``."""
    try:
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > max_bytes:
            _rotate(path, backups)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError) as exc:
        return f"cannot write log {path}: {exc}"
    return None
