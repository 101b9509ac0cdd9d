"""The parsed-spec cache: each spec file is parsed once across hook runs.

Rule: an entry is reused only while its file's ``(path, size, mtime_ns, inode)`` is unchanged.
The cache is one file written atomically (temp file + ``os.replace``, mode 0600): a JSON header
line (magic, format version, per-file key, kind, device names, error, body offset and CRC-32)
followed by one JSON line per spec body, so a warm load reads and decodes only the header; a
body is read (and its CRC checked) only for a spec a request touches. A cache that is corrupt or
foreign (other magic or version, not owned by us, group/world writable) is ignored and rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any, Final

from hook.record import record

__all__ = ["MAGIC", "FORMAT_VERSION", "CACHE_NAME", "DEFAULT_CACHE_DIR", "FileKey", "Entry", "Cache",
           "file_key", "read", "write"]

MAGIC: Final = "oci-device-hook/cdi-cache"
FORMAT_VERSION: Final = 2  # 2: specs decoded the reference way (YAML for every file, Go conversions)
CACHE_NAME: Final = "cdi-cache.json"
DEFAULT_CACHE_DIR: Final = Path("/run/oci-device-hook")

FileKey = tuple[int, int, int]  # size, mtime_ns, inode


def file_key(st: os.stat_result) -> FileKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


@record(kw_only=False)
class Entry:
    """One spec file as cached: a valid spec (kind, names, body) or an error line."""

    key: FileKey
    kind: str = ""
    names: tuple[str, ...] = ()
    error: str | None = None
    body: dict[str, Any] | None = None  # set when freshly parsed; else loaded lazily from the cache


class Cache:
    """A read cache file: the header index plus the raw bytes that hold the bodies."""

    def __init__(self, header: dict[str, Any], path: Path, base: int) -> None:
        self._files: dict[str, Any] = header["files"]
        self._path = path
        self._base = base

    def paths(self) -> set[str]:
        return set(self._files)

    def lookup(self, path: str, key: FileKey) -> Entry | None:
        item = self._files.get(path)
        if not isinstance(item, dict) or item.get("key") != list(key):
            return None
        error = item.get("error")
        if error is not None:
            return Entry(key=key, error=str(error))
        return Entry(key=key, kind=item["kind"], names=tuple(item["names"]))

    def body(self, path: str) -> dict[str, Any] | None:
        """The raw spec body of ``path``; None if this cache cannot provide it (treat as a miss)."""
        item = self._files.get(path)
        try:
            start, length, crc = item["body"]  # type: ignore[index]
            with open(self._path, "rb") as fh:  # the file may have been replaced: the CRC tells
                fh.seek(self._base + int(start))
                chunk = fh.read(int(length))
            if zlib.crc32(chunk) != crc:
                return None
            value = json.loads(chunk)
        except (TypeError, KeyError, ValueError, OSError):
            return None
        return value if isinstance(value, dict) else None


def _trusted(st: os.stat_result) -> bool:
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def read(path: Path) -> Cache | None:
    """The cache at ``path``, or None when it is absent, corrupt, foreign or of another version."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not _trusted(st):
                return None
            line = fh.readline()  # bodies are read later, only those a request needs
    except OSError:
        return None
    try:
        header = json.loads(line)
    except ValueError:
        return None
    if not (line.endswith(b"\n") and isinstance(header, dict) and header.get("magic") == MAGIC
            and header.get("version") == FORMAT_VERSION and isinstance(header.get("files"), dict)
            and header.get("size") == st.st_size - len(line)):
        return None
    for item in header["files"].values():
        if not _well_formed(item):
            return None
    return Cache(header, path, len(line))


def _well_formed(item: Any) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("key"), list):
        return False
    if item.get("error") is not None:
        return isinstance(item["error"], str)
    names = item.get("names")
    if not isinstance(item.get("kind"), str) or not isinstance(names, list):
        return False
    return all(isinstance(n, str) for n in names)


def write(path: Path, entries: dict[str, Entry], bodies: dict[str, bytes]) -> bool:
    """Atomically replace the cache with ``entries``; ``bodies`` are serialized spec bodies.

    Returns False when the cache cannot be written (read-only /run, no permission): the hook
    then simply parses again next time.
    """
    files: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for source, entry in entries.items():
        if entry.error is not None:
            files[source] = {"key": list(entry.key), "error": entry.error}
            continue
        body = bodies[source] + b"\n"
        files[source] = {"key": list(entry.key), "kind": entry.kind, "names": list(entry.names),
                         "body": [offset, len(body) - 1, zlib.crc32(bodies[source])]}
        chunks.append(body)
        offset += len(body)
    header = {"magic": MAGIC, "version": FORMAT_VERSION, "size": offset, "files": files}
    data = json.dumps(header, separators=(",", ":")).encode() + b"\n" + b"".join(chunks)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        import tempfile  # only a cache miss writes; a warm start never pays for it

        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:  # mkstemp creates the file with mode 0600
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
