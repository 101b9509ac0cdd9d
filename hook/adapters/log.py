"""The live-mode log: one JSON line per container, size-rotated like logrotate's ``size``.

Rule: logging never decides whether a container starts, and never waits. ``write_log`` returns
``None`` on success and the error text on failure (the caller prints it as one warning line);
it never raises. The file is opened ``O_APPEND|O_NONBLOCK|O_NOFOLLOW`` and written only if
``fstat`` says it is a regular file: a FIFO, a device or a symlink at the log path is an error
text, not a hang. Lines are ``json.dumps(sort_keys=True)`` (every control character escaped, so
a container's string cannot forge a line) with each string capped at ``MAX_STRING`` characters;
one ``write(2)`` on an ``O_APPEND`` fd so concurrent hooks do not interleave within a line.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["write_log"]

MAX_BYTES = 10 * 1024 * 1024
MAX_STRING = 4096


def _capped(value: Any) -> Any:
    """The record with every string (key or value) cut to ``MAX_STRING`` characters."""
    if isinstance(value, str):
        return (
            value if len(value) <= MAX_STRING else value[:MAX_STRING] + f"...[{len(value) - MAX_STRING} more]"
        )
    if isinstance(value, dict):
        return {_capped(k): _capped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_capped(v) for v in value]
    return value


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
        line = (json.dumps(_capped(record), sort_keys=True, default=str) + "\n").encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size + len(line) > max_bytes:
            _rotate(path, backups)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(path, flags, 0o640)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"cannot write log {path}: not a regular file"
            os.write(fd, line)
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError, RecursionError) as exc:
        return f"cannot write log {path}: {exc}"
    return None
