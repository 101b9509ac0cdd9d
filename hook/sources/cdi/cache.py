"""The parsed-spec cache: each spec file is parsed once across hook runs.

Rule: an entry is reused only while its file's ``(path, size, mtime_ns, inode, ctime_ns)`` is
unchanged (``ctime`` moves on every write, also one that keeps the size and restores the mtime).
The cache is one file written through ``hook.sources.cachefile`` (its directory, open and write rules): a
seal line (the node key's MAC over the header, ``hook.sources.nodekey``), a JSON header line
(magic, format and hook version, per-file key, kind, device names, error, body offset, length and
BLAKE2b digest) followed by one JSON line per spec body, so a warm load reads and decodes only the
header; a body is read (and its digest checked) only for a spec a request touches. A container
with the host's ``/run`` can write this file: a header that fails its seal, or a body that fails
its digest, is never believed. A cache that is corrupt, forged or foreign (other magic, format or
hook version, not a regular file of ours, group or world writable, over ``MAX_BYTES``) is ignored
and rebuilt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from hook.core.record import record
from hook.core.version import VERSION
from hook.sources import cachefile, nodekey

__all__ = ["MAGIC", "FORMAT_VERSION", "CACHE_NAME", "DEFAULT_CACHE_DIR", "FileKey", "Entry", "Cache",
           "file_key", "read", "write"]

MAGIC: Final = "oci-device-hook/cdi-cache"
FORMAT_VERSION: Final = 4  # 2: specs decoded the reference way (YAML, Go conversions); 3: ctime in keys;
# 4: sealed by the node key, each body's BLAKE2b digest (a CRC is no proof against a writer)
CACHE_NAME: Final = "cdi-cache.json"
DEFAULT_CACHE_DIR: Final = Path("/run/oci-device-hook")
MAX_BYTES: Final = 64 << 20

FileKey = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns


def file_key(st: os.stat_result) -> FileKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


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
        fd = cachefile.open_private(str(self._path.parent), self._path.name, MAX_BYTES)
        if fd is None:
            return None
        try:  # the file may have been replaced since the header was read: the digest tells
            start, length, sha = item["body"]  # type: ignore[index]
            chunk = os.pread(fd, int(length), self._base + int(start))
            if not isinstance(sha, str) or not nodekey.same(nodekey.digest(chunk).encode(), sha.encode()):
                return None
            value = json.loads(chunk)
        except (TypeError, KeyError, ValueError, OSError, RecursionError):
            return None
        finally:
            os.close(fd)
        return value if isinstance(value, dict) else None


def read(path: Path) -> Cache | None:
    """The cache at ``path``, or None when it is absent, corrupt, foreign or of another version."""
    fd = cachefile.open_private(str(path.parent), path.name, MAX_BYTES)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            seal = fh.readline(len(nodekey.SEAL) + 65)
            line = fh.readline(MAX_BYTES)  # bodies are read later, only those a request needs
        proven = nodekey.unseal(path.name, seal + line[:-1])
        if proven is None or not line.endswith(b"\n"):
            return None  # not sealed by this node's key: written by someone else, or never ours
        header = json.loads(proven)
    except (OSError, ValueError, RecursionError):
        return None
    base = len(seal) + len(line)
    if not (isinstance(header, dict) and header.get("magic") == MAGIC
            and header.get("version") == FORMAT_VERSION and header.get("hook") == VERSION
            and isinstance(header.get("files"), dict) and header.get("size") == size - base):
        return None
    for item in header["files"].values():
        if not _well_formed(item):
            return None
    return Cache(header, path, base)


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
                         "body": [offset, len(body) - 1, nodekey.digest(bodies[source])]}
        chunks.append(body)
        offset += len(body)
    header = {"magic": MAGIC, "version": FORMAT_VERSION, "hook": VERSION, "size": offset, "files": files}
    sealed = nodekey.seal(path.name, json.dumps(header, separators=(",", ":")).encode())
    if sealed is None:
        return False  # no node key: nothing unsealed would be believed, so nothing is written
    return cachefile.write_raw(str(path.parent), path.name, sealed + b"\n" + b"".join(chunks)) is None
