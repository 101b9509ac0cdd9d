"""The hook's private files, read with ``posix`` only: trust-checked cache reads, the JSON loader,
and the fast path's compiled settings record.

Rule: a file under the cache directory counts only if it and its directory are the hook's own
(``open_private``) and, for a record, it is sealed by the node's key (``read_sealed``,
``hook.sources.nodekey``); anything odd is a miss, never a hang or a decision. These primitives sit in the
sources layer so the caches (``hook.sources.cachefile``, ``hook.sources.settingsfile``) and the fast
path (``hook.routes.fastpath``) share one copy; like the fast path, this module imports only
``posix`` at load time (``hook.core.version`` only for custom settings). Not ``os``: the floor
(``python3 -ISB``) never loads it, and its import (``posixpath``, ``stat``, ``_collections_abc``'s
classes) was a quarter of the interpreter's own start-up instructions, paid by every container
(issue 35); ``posix`` is built in and loaded already. ``normpath`` and ``abspath`` are
``posixpath``'s, string for string (tests/test_privatefile_paths.py holds them to it). Nor
``from __future__ import annotations``: one more file read on every start; the annotations that
name typing-only types are strings.
"""

import posix

TYPE_CHECKING = False  # typing is not imported at run time: the fast path cannot afford it
if TYPE_CHECKING:
    from typing import Any

FASTPATH_CACHE = "/run/oci-device-hook/fastpath.json"
FASTPATH_FORMAT = 3  # 2: one entry per settings file, with the hook's version; 3: its bytes' digest
SETTINGS_MAX = 1 << 20  # hook.sources.settingsfile.MAX_BYTES
FASTPATH_MAX = 256 << 10


class _Defaults:
    """What ``_json.make_scanner`` reads from its context: exactly ``json.JSONDecoder()``'s defaults."""

    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    strict = True
    memo: "dict[str, Any]" = {}


_JSON_WS = " \t\n\r"  # json.decoder.WHITESPACE
_OTHER_ENCODING = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")  # BOMs json.detect_encoding honours
_scanner: "list[Any]" = []  # [scan_once] once built; [None] where this Python has no _json


def loads(data: bytes) -> "Any":
    """``json.loads(data)`` (same value, a ValueError where it fails) without importing ``json``.

    UTF-8 input goes through the C scanner ``json.loads`` itself uses, set up as its default
    decoder. Whatever ``json.detect_encoding`` might read as another encoding (a BOM, a NUL in the
    first four bytes), a Python without ``_json``, and every way the scanner can fail other than
    a plain decode error (a ``SystemError`` on a truncated escape, a ``RecursionError`` on deep
    nesting) are handed to ``json.loads`` itself: the trick never decides a case the public way
    would decide differently (tests/fuzz proves it on mutated and truncated real configs).
    """
    if not _scanner:
        try:
            from _json import make_scanner
        except ImportError:
            _scanner.append(None)
        else:
            _scanner.append(make_scanner(_Defaults()))  # type: ignore[arg-type]
    scan_once = _scanner[0]
    if scan_once is not None and b"\x00" not in data[:4] and not data.startswith(_OTHER_ENCODING):
        try:
            text = data.decode("utf-8", "surrogatepass")
            value, end = scan_once(text, len(text) - len(text.lstrip(_JSON_WS)))
            if not text[end:].lstrip(_JSON_WS):
                return value
        except Exception:  # any surprise of the trick: ask the public way
            pass
    import json

    return json.loads(data)


def read_limited(fd_or_path: "int | str", limit: int) -> bytes:
    """At most ``limit`` bytes (a path: a ValueError when larger); never blocks on a FIFO or a tty."""
    if isinstance(fd_or_path, int):
        with open(fd_or_path, "rb", closefd=False) as f:
            return f.read(limit + 1)
    fd = posix.open(fd_or_path, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_CLOEXEC)
    try:
        if not is_regular(posix.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = _read_fd(fd, limit + 1)
    finally:
        posix.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def is_regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000  # stat.S_ISREG without importing stat


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = posix.read(fd, min(limit - size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def open_private(directory: str, name: str, limit: int) -> "int | None":
    """An fd on ``directory/name`` if both are the hook's own, else None (a cache miss).

    The rule for every file under the cache directory (``hook.sources.cachefile`` writes them; the fast
    path reads here, with ``os`` only): the directory is not a symlink, is owned by this user
    and open to no one else; the file is opened ``O_NOFOLLOW|O_NONBLOCK`` relative to it and
    ``fstat`` says regular, ours, not group/other-writable and at most ``limit`` bytes before a
    byte is read. A FIFO, a device, a symlink, a planted or huge file is a miss, never a hang.
    """
    try:
        dfd = posix.open(directory, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = posix.fstat(dfd)
        if st.st_uid != posix.geteuid() or st.st_mode & 0o077:
            return None
        flags = posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_CLOEXEC
        fd = posix.open(name, flags, dir_fd=dfd)
    except (OSError, ValueError):
        return None
    finally:
        posix.close(dfd)
    try:
        st = posix.fstat(fd)
        ours = st.st_uid == posix.geteuid() and not st.st_mode & 0o022
        if is_regular(st.st_mode) and ours and st.st_size <= limit:
            return fd
    except OSError:
        pass
    posix.close(fd)
    return None


def read_private(directory: str, name: str, limit: int) -> "bytes | None":
    """The bytes of ``directory/name`` under ``open_private``'s rule, else None (a cache miss)."""
    fd = open_private(directory, name, limit)
    if fd is None:
        return None
    try:
        size = posix.fstat(fd).st_size
        data = _read_fd(fd, size + 1)
        return data if len(data) == size else None  # changed while read: a miss
    except OSError:
        return None
    finally:
        posix.close(fd)


def read_sealed(directory: str, name: str, limit: int) -> "bytes | None":
    """A record's bytes under ``open_private``'s rule and sealed by this node's key (``limit`` is
    the record's, without its seal line), else None (a miss)."""
    from hook.sources.nodekey import SEAL, unseal

    return unseal(name, read_private(directory, name, limit + len(SEAL) + 65))


def fastpath_record(data: "bytes | None", path: str, settings: bytes) -> "dict[str, Any] | None":
    """This settings file's entry in the (unsealed) fast-path record, or None when anything is off.

    The record is ``{"format", "hook", "files": {abspath: entry}}``: several settings files
    (several engines, a test run) each keep their entry, and an entry is a cache of one file's
    bytes (``digest``: ``settings``, as read now, must hash to it). Another format or hook version,
    a foreign shape, garbage or a truncated file is a miss; the full path rewrites it.
    """
    if data is None:
        return None
    from hook.core.version import VERSION  # only for custom settings: the default fast path never reads it
    from hook.sources.nodekey import digest

    try:
        doc = loads(data)
        entry = doc["files"][abspath(path)]
        if (
            doc["kind"] != "fastpath"
            or doc["format"] != FASTPATH_FORMAT
            or doc["hook"] != VERSION
            or entry["digest"] != digest(settings)
            or not _strs(entry["cdi_annotation_prefixes"])
            or not all(entry["cdi_annotation_prefixes"])
            or not isinstance(entry["volume_mount_root"], str)
            or not isinstance(entry["settings"], dict)
        ):
            return None
    except Exception:  # whatever the file holds, it is only a miss
        return None
    return entry if isinstance(entry, dict) else None


def normpath(path: str) -> str:
    """``posixpath.normpath(path)`` without importing ``os``: ``.`` and repeated slashes dropped,
    ``..`` taken back (never above ``/``; kept at the start of a relative path), and exactly two
    leading slashes kept as two (POSIX leaves ``//x`` implementation-defined)."""
    if not path:
        return "."
    lead = 2 if path.startswith("//") and not path.startswith("///") else 1 if path.startswith("/") else 0
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part != ".." or (not lead and not parts) or (parts and parts[-1] == ".."):
            parts.append(part)
        elif parts:
            parts.pop()
    return "/" * lead + "/".join(parts) or "."


def abspath(path: str) -> str:
    """``posixpath.abspath(path)`` without importing ``os`` (the key of a settings file's entry)."""
    return normpath(path if path.startswith("/") else posix.getcwd() + "/" + path)


def _strs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)
