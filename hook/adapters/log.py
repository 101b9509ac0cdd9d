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

import os

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from pathlib import Path
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


def _rotate(path: str, backups: int) -> None:
    """path.N-1 → path.N … path → path.1; the oldest is dropped."""
    if backups <= 0:
        try:  # noqa: SIM105 - contextlib is one more import on the start path
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    for n in range(backups - 1, 0, -1):
        if os.path.exists(f"{path}.{n}"):
            os.replace(f"{path}.{n}", f"{path}.{n + 1}")
    os.replace(path, f"{path}.1")


def _regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000  # stat.S_ISREG without importing stat


_encoder: list[Any] = []  # [encode] once built


def dumps(record: Any) -> str:
    """``json.dumps(record, sort_keys=True, default=str)``, through ``json``'s own C encoder when
    this Python has one (importing the ``json`` package costs the start path ``re`` and ``enum``);
    ``json.dumps`` itself otherwise, and for anything the C encoder refuses."""
    if not _encoder:
        try:
            from _json import encode_basestring_ascii, make_encoder

            # json.JSONEncoder(sort_keys=True, default=str)'s arguments, in c_make_encoder's order
            args: tuple[Any, ...] = ({}, str, encode_basestring_ascii, None, ": ", ", ", True, False, True)
            _encoder.append(make_encoder(*args))
        except ImportError:
            _encoder.append(None)
    encode = _encoder[0]
    if encode is not None:
        try:
            return "".join(encode(record, 0))
        except Exception:
            pass
    import json

    return json.dumps(record, sort_keys=True, default=str)


def write_log(
    record: dict[str, Any], path: Path | str, max_bytes: int = MAX_BYTES, backups: int = 3
) -> str | None:
    """Append ``record`` as one line to ``path``; rotate first if the line would pass ``max_bytes``."""
    path = str(path)
    try:
        line = (dumps(_capped(record)) + "\n").encode()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and _regular(st.st_mode) and st.st_size + len(line) > max_bytes:
            _rotate(path, backups)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(path, flags, 0o640)
        try:
            if not _regular(os.fstat(fd).st_mode):
                return f"cannot write log {path}: not a regular file"
            os.write(fd, line)
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError, RecursionError) as exc:
        return f"cannot write log {path}: {exc}"
    return None
