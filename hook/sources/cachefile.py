"""Every file the hook keeps under its cache directory (``/run/oci-device-hook``), read and written one way.

Rule: a cache only ever costs or saves time, never decides. Every record is sealed with the
node's key (``hook.sources.nodekey``): a container with the host's ``/run`` can write here, so
ownership proves nothing, and a record whose seal fails is a miss. The directory is this user's,
mode 0700, and never followed through a symlink; a file is read only after ``fstat`` on the
opened (``O_NOFOLLOW|O_NONBLOCK``) descriptor says regular, ours, not group/other-writable and
under the caller's size cap, and its seal holds (``hook.sources.privatefile.read_sealed``, shared
with the fast path, which may import nothing else). Each record carries its format version and
the hook's version (``stamp``, ``current``); anything else is a miss the caller rebuilds. A write
goes to an ``O_EXCL`` temp file in the directory, renamed over the target, removed on failure;
temp files a killed hook left behind are swept on the next write. Nothing here raises: reads
return None, writes a warning text.
"""

from __future__ import annotations

import os
import stat
import time

from hook.core.version import VERSION
from hook.sources import nodekey
from hook.sources.privatefile import open_private, read_sealed

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["STALE_TEMP_S", "current", "open_private", "read", "stamp", "write", "write_raw"]

STALE_TEMP_S = 60  # a write takes milliseconds: an older temp file belongs to a killed hook
_TEMP_SUFFIX = ".tmp"


def stamp(kind: str, format_version: int) -> dict[str, Any]:
    """The header fields every record starts with."""
    return {"kind": kind, "format": format_version, "hook": VERSION}


def current(doc: object, kind: str, format_version: int) -> bool:
    """Whether a decoded record was written by this very hook for this very format."""
    return (
        isinstance(doc, dict)
        and doc.get("kind") == kind
        and doc.get("format") == format_version
        and doc.get("hook") == VERSION
    )


def read(directory: str, name: str, limit: int) -> bytes | None:
    """The record's bytes, or None for anything but the hook's own regular file sealed by this
    node's key (see the module rule)."""
    return read_sealed(directory, name, limit)


def write(directory: str, name: str, data: bytes) -> str | None:
    """Replace ``directory/name`` with ``data`` sealed by the node's key, atomically; a warning
    text when it cannot (no key: nothing is written, as nothing unsealed would be read)."""
    sealed = nodekey.seal(name, data)
    if sealed is None:
        return f"{os.path.join(directory, name)}: cache not written: no node key in {nodekey.KEY_DIR}"
    return write_raw(directory, name, sealed)


def write_raw(directory: str, name: str, data: bytes) -> str | None:
    """Replace ``directory/name`` with ``data`` as is (a record sealed its own way: the CDI cache)."""
    try:
        dfd = _open_dir(directory, create=True)
    except OSError as exc:
        return f"{directory}: cache not written: {exc.strerror or exc}"
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}{_TEMP_SUFFIX}"
    try:
        _sweep(dfd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as exc:
        try:  # noqa: SIM105 - contextlib would be one more import at start
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        return f"{os.path.join(directory, name)}: cache not written: {exc.strerror or exc}"
    finally:
        os.close(dfd)
    return None


class _Untrusted(OSError):
    """The cache directory exists but is not the hook's own."""


def _open_dir(directory: str, *, create: bool) -> int:
    """An fd on the cache directory, created 0700 if asked; a directory that is a symlink, someone
    else's, or open to others (and not ours to fix) raises. Ours but too open (an older hook made
    it 0755) is narrowed to 0700 through the fd, never through the path."""
    if create:
        parent = os.path.dirname(os.path.abspath(directory))
        os.makedirs(parent, mode=0o755, exist_ok=True)
        try:  # noqa: SIM105 - contextlib would be one more import at start
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise _Untrusted(0, f"owned by uid {st.st_uid}, not by the hook")
        if st.st_mode & 0o077:
            if not create:
                raise _Untrusted(0, "open to other users")
            os.fchmod(dfd, 0o700)
    except OSError:
        os.close(dfd)
        raise
    return dfd


def _sweep(dfd: int) -> None:
    """Remove temp files older than ``STALE_TEMP_S`` (a hook killed between create and rename)."""
    now = time.time()
    for entry in os.listdir(dfd):
        if not (entry.startswith(".") and entry.endswith(_TEMP_SUFFIX)):
            continue
        try:
            st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
            if now - st.st_mtime > STALE_TEMP_S or not stat.S_ISREG(st.st_mode):
                os.unlink(entry, dir_fd=dfd)
        except OSError:
            pass
