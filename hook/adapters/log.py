"""The live-mode log: one JSON line per container, size-rotated like logrotate's ``size``.

Rule: logging never decides whether a container starts, and never waits. ``write_log`` returns
``None`` on success and the error text on failure (the caller prints it as one warning line);
it never raises. The file is opened ``O_APPEND|O_NONBLOCK|O_NOFOLLOW`` and written only if
``fstat`` says it is a regular file with one name, the hook's own: a FIFO, a device, a symlink
or a hardlink at the log path is an error text, not a hang. Rotation renames, replaces or removes
only files the hook created as its log (``O_EXCL``; their identities are kept in a record sealed
by the node key, beside it, ``OWN_RECORD``): a file the operator's settings or anyone else put at
the log path, or at a backup name, is never moved, and past the size limit it is not written
either (the error text says so). Lines are ``json.dumps(sort_keys=True)`` (every control
character escaped, so a container's string cannot forge a line) with each string capped at
``MAX_STRING`` characters; one ``write(2)`` on an ``O_APPEND`` fd so concurrent hooks do not
interleave within a line.
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


OWN_RECORD = "logs.json"  # in the node key's dir: which files the hook created as its log
OWN_KEEP = 16  # identities kept per log path (the log and its backups, with room for races)


def _own_logs() -> dict[str, list[list[int]]]:
    """Every log path's files the hook created, as ``[st_dev, st_ino]``, from the record sealed by
    the node key (it lives with the key, never under ``/run``); {} when there is none."""
    import json

    from hook.sources import cachefile, nodekey

    data = cachefile.read(nodekey.KEY_DIR, OWN_RECORD, 1 << 20)
    try:
        doc = json.loads(data) if data is not None else None
        if isinstance(doc, dict) and doc.get("kind") == "logs" and isinstance(doc.get("files"), dict):
            return doc["files"]  # type: ignore[no-any-return]
    except ValueError:
        pass
    return {}


def _remember_created(path: str, st: os.stat_result) -> None:
    """Record the file the hook just created (``O_EXCL``) at ``path`` as its log."""
    import json

    from hook.sources import cachefile, nodekey

    files = _own_logs()
    mine = [i for i in files.get(path, []) if isinstance(i, list)]
    files[path] = [[st.st_dev, st.st_ino], *mine][:OWN_KEEP]
    doc = {"kind": "logs", "format": 1, "files": files}
    cachefile.write(nodekey.KEY_DIR, OWN_RECORD, json.dumps(doc).encode())


def _ours(name: str, mine: set[tuple[int, int]]) -> bool | None:
    """None: nothing there; True: a regular file the hook created as this log; False: anything else."""
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return None
    return _regular(st.st_mode) and (st.st_dev, st.st_ino) in mine


def _rotate(path: str, backups: int) -> str | None:
    """path.N-1 → path.N … path → path.1; the oldest is dropped. Only files the hook created as
    its log are moved or dropped, and only onto names that are free or its own: else nothing is
    renamed, and the error text says why."""
    mine = {(int(i[0]), int(i[1])) for i in _own_logs().get(path, []) if isinstance(i, list) and len(i) == 2}
    if not _ours(path, mine):
        return f"log {path} not rotated: the hook did not create it (move it away; a new log is started)"
    names = [f"{path}.{n}" for n in range(1, backups + 1)]
    if any(_ours(name, mine) is False for name in names):
        return f"log {path} not rotated: a backup name holds a file the hook did not create"
    if backups <= 0:
        os.unlink(path)
        return None
    for n in range(backups - 1, 0, -1):
        if os.path.exists(f"{path}.{n}"):
            os.replace(f"{path}.{n}", f"{path}.{n + 1}")
    os.replace(path, f"{path}.1")
    return None


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
    path = os.path.abspath(str(path))
    try:
        line = (dumps(_capped(record)) + "\n").encode()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and _regular(st.st_mode) and st.st_size + len(line) > max_bytes:
            refused = _rotate(path, backups)
            if refused:
                return f"cannot write log {path}: {refused}"
            st = None  # moved away: a new log is created
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd, created = -1, False
        if st is None:  # created here, O_EXCL: only then is it recorded as the hook's log
            try:  # noqa: SIM105 - contextlib is one more import on the start path
                fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o640), True
            except FileExistsError:  # another hook made it first
                pass
        if fd < 0:
            fd = os.open(path, flags)
        try:
            st = os.fstat(fd)
            if not _regular(st.st_mode):
                return f"cannot write log {path}: not a regular file"
            if st.st_nlink != 1 or st.st_uid != os.geteuid():
                return f"cannot write log {path}: not the hook's own file (another owner, or a second name)"
            os.write(fd, line)
            if created:
                _remember_created(path, st)
        finally:
            os.close(fd)
    except (OSError, TypeError, ValueError, RecursionError) as exc:
        return f"cannot write log {path}: {exc}"
    return None
