"""One path of a container's ``/dev``, resolved and changed without ever leaving it.

Rule: runs in the helper that has joined the container's mount namespace (``hook.adapters.apply.
devnodes``). Every path is resolved from the ``/dev`` fd one component at a time, never following
a symlink, never accepting ``..`` and never crossing into another mount (``openat2`` with
``RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH|RESOLVE_NO_XDEV`` per component, else an ``O_NOFOLLOW``
open checked with ``fstat``: a symlinked component is an error, another mount is ``OtherMount``).
Each node is re-checked with ``lstat`` (``S_ISCHR``/``S_ISBLK`` and major:minor) after ``mknod``;
only device nodes are ever removed, and only on the ``/dev`` filesystem itself. Every change is
written to the journal first-hand, so the parent can undo exactly what was done.
"""

from __future__ import annotations

import errno
import os
import stat

from hook.adapters.apply.libcalls import openat2
from hook.core.errors import ApplyError
from hook.core.record import record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "ROW",
    "Change",
    "DevDir",
    "OtherMount",
    "divmod_dev",
    "open_child_dir",
    "run_actions",
    "change",
    "row",
    "split_container_path",
]

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
DIR_MODE = 0o755
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@record
class Change:
    """One journal entry: ``mkdir`` or ``mknod`` (we created it) or ``unlink`` (we removed it)."""

    op: str
    path: str
    type: str = ""
    major: int = 0
    minor: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0


ROW = ("op", "path", "type", "major", "minor", "mode", "uid", "gid")  # a journal row: Change's fields


def row(c: Change) -> list[Any]:
    """``c`` as a journal row (``ROW``): what the helper keeps and sends, no record per node."""
    return [c.op, c.path, c.type, c.major, c.minor, c.mode, c.uid, c.gid]


def change(r: Sequence[Any]) -> Change:
    """A journal row back as the ``Change`` it records (for an undo)."""
    op, path, type, major, minor, mode, uid, gid = r
    return Change(op=op, path=path, type=type, major=major, minor=minor, mode=mode, uid=uid, gid=gid)


def split_container_path(path: str) -> tuple[str, ...]:
    """``/dev/a/b`` → ``("dev", "a", "b")``; anything not strictly below ``/dev`` is refused."""
    parts = tuple(path.split("/"))
    if len(parts) < 3 or parts[0] != "" or parts[1] != "dev" or any(p in ("", ".", "..") for p in parts[1:]):
        raise ApplyError("plan", path, "device paths must be normalized absolute paths below /dev")
    return parts[1:]


# ---- syscalls ---------------------------------------------------------------------------------

_openat2_works = [True]


class OtherMount(Exception):
    """A path component is another mount (or filesystem) than the container's ``/dev``."""


def open_child_dir(dirfd: int, name: str, same_dev: int | None = None) -> int:
    """Open one existing directory component below ``dirfd`` without following a symlink.

    With ``same_dev`` (the container ``/dev``'s ``st_dev``) the component must not be another
    mount: ``openat2`` refuses the crossing (``RESOLVE_NO_XDEV``), the fallback compares ``st_dev``.
    """
    if _openat2_works[0]:
        resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH
        if same_dev is not None:
            resolve |= RESOLVE_NO_XDEV
        try:
            return openat2(dirfd, name, _DIR_FLAGS, resolve)
        except OSError as exc:
            if exc.errno == errno.EXDEV and same_dev is not None:
                raise OtherMount(name) from None
            if exc.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: seccomp may block unknown syscalls
                raise
            _openat2_works[0] = False
    fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):  # O_PATH|O_NOFOLLOW opens a symlink itself
        os.close(fd)
        raise OSError(errno.ELOOP, "symbolic link in container path", name)
    if same_dev is not None and st.st_dev != same_dev:
        os.close(fd)
        raise OtherMount(name)
    return fd


class DevDir:
    """The container's ``/dev`` in the child: its fd, its ``st_dev``, the journal and the skips.

    ``dirs`` holds every directory below it resolved so far (by its components), so a plan of
    hundreds of nodes in a few directories walks each directory once: a node costs its ``lstat``
    and its change, not a walk. A held fd was opened by the same checked walk (no symlink, no
    ``..``, no other mount) and names that directory for the helper's life (nothing in the
    container runs while its prestart hooks do); a directory the helper removes is dropped.
    """

    def __init__(self, fd: int, st_dev: int) -> None:
        self.fd = fd
        self.st_dev = st_dev
        self.journal: list[list[Any]] = []  # rows (``ROW``), in the order done
        self.skipped: list[list[str]] = []  # [container path, why]
        self.dirs: dict[tuple[str, ...], int] = {}

    def forget(self, parts: tuple[str, ...]) -> None:
        """Drop (and close) the held fds of ``/dev/<parts>`` and of everything below it."""
        for key in [k for k in self.dirs if k[: len(parts)] == parts]:
            os.close(self.dirs.pop(key))

    def close(self) -> None:
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()


def _walk(dev: DevDir, parts: tuple[str, ...], create: bool) -> int | None:
    """An fd for the directory ``/dev/<parts>``, held by ``dev`` (the caller never closes it),
    creating missing ones (0755) when asked; None when one is missing and not to be created."""
    if not parts:
        return dev.fd
    fd = dev.dirs.get(parts)
    if fd is not None:
        return fd
    fd = dev.fd
    for i, name in enumerate(parts):
        key = parts[: i + 1]
        nxt = dev.dirs.get(key)
        if nxt is None:
            try:
                nxt = open_child_dir(fd, name, dev.st_dev)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(name, DIR_MODE, dir_fd=fd)
                dev.journal.append(["mkdir", "/dev/" + "/".join(key), "", 0, 0, DIR_MODE, 0, 0])
                nxt = open_child_dir(fd, name, dev.st_dev)
            dev.dirs[key] = nxt
        fd = nxt
    return fd


def _lstat(dirfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _same_device(st: os.stat_result | None, kind: str, major: int, minor: int) -> bool:
    is_kind = stat.S_ISCHR if kind == "c" else stat.S_ISBLK
    return st is not None and is_kind(st.st_mode) and divmod_dev(st.st_rdev) == (major, minor)


def divmod_dev(rdev: int) -> tuple[int, int]:
    return os.major(rdev), os.minor(rdev)


def _mknod(dev: DevDir, node: Change) -> None:
    """Create one node (parents too); an identical node already there is left alone."""
    parts = split_container_path(node.path)[1:]
    dirfd = _walk(dev, parts[:-1], create=True)
    assert dirfd is not None
    st = _lstat(dirfd, parts[-1])
    if st is not None:
        if _same_device(st, node.type, node.major, node.minor):
            return
        raise ApplyError(node.path, "mknod", "exists and is not the planned device node")
    kind = stat.S_IFCHR if node.type == "c" else stat.S_IFBLK
    os.mknod(parts[-1], kind | (node.mode & 0o7777), os.makedev(node.major, node.minor), dir_fd=dirfd)
    dev.journal.append(row(node))
    try:
        os.chown(parts[-1], node.uid, node.gid, dir_fd=dirfd, follow_symlinks=False)
    except OSError as exc:
        raise ApplyError(node.path, "chown", exc.strerror or str(exc)) from exc
    if not _same_device(_lstat(dirfd, parts[-1]), node.type, node.major, node.minor):
        raise ApplyError(node.path, "mknod", "node differs from the plan after mknod")


def _unlink(dev: DevDir, path: str, expect: Change | None) -> None:
    """Remove one char/block node of the container's /dev; with ``expect`` only if it is still that device."""
    parts = split_container_path(path)[1:]
    dirfd = _walk(dev, parts[:-1], create=False)
    if dirfd is None:
        return
    st = _lstat(dirfd, parts[-1])
    if st is None:
        return
    if expect is not None and not _same_device(st, expect.type, expect.major, expect.minor):
        return  # something else is there now: not ours to remove
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise ApplyError(path, "unlink", "refusing to remove something that is not a device node")
    if st.st_dev != dev.st_dev:  # a node bind-mounted from elsewhere (the host's, typically)
        raise OtherMount(parts[-1])
    os.unlink(parts[-1], dir_fd=dirfd)
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
    major, minor = divmod_dev(st.st_rdev)
    mode = stat.S_IMODE(st.st_mode)
    dev.journal.append(["unlink", path, kind, major, minor, mode, st.st_uid, st.st_gid])


def _rmdir(dev: DevDir, path: str) -> None:
    """Remove a directory we created, only while it is empty."""
    parts = split_container_path(path)[1:]
    dirfd = _walk(dev, parts[:-1], create=False)
    if dirfd is None:
        return
    try:
        os.rmdir(parts[-1], dir_fd=dirfd)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise
        return
    dev.forget(parts)


def run_actions(dev: DevDir, actions: Sequence[tuple[str, Change]]) -> None:
    """Each action in order; one that would cross into another mount is skipped and noted.

    Any other failure names the container path and the operation (one ``ApplyError``).
    """
    try:
        for op, change in actions:
            try:
                if op == "mknod":
                    _mknod(dev, change)
                elif op in ("unlink", "unlink-ours"):
                    _unlink(dev, change.path, expect=change if op == "unlink-ours" else None)
                elif op == "rmdir":
                    _rmdir(dev, change.path)
            except OtherMount as exc:
                dev.skipped.append([change.path, f"{exc} is another mount than the container's /dev"])
            except OSError as exc:
                raise ApplyError(change.path, op, exc.strerror or str(exc)) from exc
    finally:
        dev.close()
