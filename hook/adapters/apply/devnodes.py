"""Device nodes inside a live container: create the Plan's nodes, remove its removals, undo both.

Rule: every change happens in a forked child that has joined the container's mount namespace
(``setns`` on ``/proc/<pid>/ns/mnt``) and every container path is resolved from an ``O_PATH``
root fd one component at a time, never following a symlink and never accepting ``..``
(``openat2`` with ``RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH`` per component, else an
``O_NOFOLLOW`` open checked with ``fstat``). A path under a symlinked component is an error,
so a hostile image cannot point ``/dev`` at a host directory. Each node is re-checked with
``lstat`` (``S_ISCHR``/``S_ISBLK`` and major:minor) after ``mknod``; only device nodes are ever
removed. The child reports a journal (JSON over a pipe) so the parent can undo exactly what
was done, even when the child failed half-way.

Where the container root is: runc runs prestart/createRuntime hooks before ``pivot_root``
(checked with runc 1.1.5: the init's root is the namespace's copy of the host ``/``, and the
rootfs is bind-mounted at its host path with runc's ``/dev`` tmpfs on top). So the root is
the bundle rootfs path looked up *inside* the namespace, and is accepted only if it is the same
inode as the host's rootfs directory; after a pivot the namespace root itself is that inode.
Without a rootfs path, a namespace whose root is the host's root is refused: its ``/dev`` is
the host's devtmpfs.

Nodes are only ever created or removed on a ``/dev`` that is the container's alone (defense in
depth behind ``hook.core.hostdev``, which reads the same from config.json's mounts): the container's
``/dev`` must be on another filesystem (``st_dev``) than the host's ``/``, ``/dev`` and
``<driver-root>/dev``, and below it no path may cross into another mount (``RESOLVE_NO_XDEV``,
else an ``st_dev`` comparison; a bind-mounted node is recognised by its ``st_dev`` too). Where
either fails the change is skipped, never attempted: the device cgroup alone then narrows, and
the skipped paths come back in ``Undo.skipped`` for the report's warnings.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from hook.core.errors import ApplyError
from hook.core.plan import Node
from hook.core.record import fields, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Change", "Undo", "apply", "split_container_path"]

CLONE_NEWNS = 0x00020000
SYS_OPENAT2 = 437  # x86_64 and aarch64 (asm-generic) alike
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


def split_container_path(path: str) -> tuple[str, ...]:
    """``/dev/a/b`` → ``("dev", "a", "b")``; anything not strictly below ``/dev`` is refused."""
    parts = tuple(path.split("/"))
    if len(parts) < 3 or parts[0] != "" or parts[1] != "dev" or any(p in ("", ".", "..") for p in parts[1:]):
        raise ApplyError("plan", path, "device paths must be normalized absolute paths below /dev")
    return parts[1:]


# ---- syscalls ---------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_works = [True]


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):
        os.setns(fd, CLONE_NEWNS)
    elif _libc.setns(fd, CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class OtherMount(Exception):
    """A path component is another mount (or filesystem) than the container's ``/dev``."""


def _open_child_dir(dirfd: int, name: str, same_dev: int | None = None) -> int:
    """Open one existing directory component below ``dirfd`` without following a symlink.

    With ``same_dev`` (the container ``/dev``'s ``st_dev``) the component must not be another
    mount: ``openat2`` refuses the crossing (``RESOLVE_NO_XDEV``), the fallback compares ``st_dev``.
    """
    if _openat2_works[0]:
        resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH
        if same_dev is not None:
            resolve |= RESOLVE_NO_XDEV
        how = _OpenHow(_DIR_FLAGS, 0, resolve)
        fd = _libc.syscall(SYS_OPENAT2, dirfd, name.encode(), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.EXDEV and same_dev is not None:
            raise OtherMount(name)
        if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: seccomp may block unknown syscalls
            raise OSError(err, os.strerror(err), name)
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


# ---- the child's work -------------------------------------------------------------------------


class _Dev:
    """The container's ``/dev`` in the child: its fd, its ``st_dev``, the journal and the skips."""

    def __init__(self, fd: int, st_dev: int) -> None:
        self.fd = fd
        self.st_dev = st_dev
        self.journal: list[Change] = []
        self.skipped: list[list[str]] = []  # [container path, why]


def _walk(dev: _Dev, parts: Sequence[str], create: bool) -> int | None:
    """An fd for the directory ``/dev/<parts>``, creating missing ones (0755) when asked."""
    fd = os.dup(dev.fd)
    try:
        for i, name in enumerate(parts):
            try:
                nxt = _open_child_dir(fd, name, dev.st_dev)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(name, DIR_MODE, dir_fd=fd)
                dev.journal.append(Change(op="mkdir", path="/dev/" + "/".join(parts[: i + 1]), mode=DIR_MODE))
                nxt = _open_child_dir(fd, name, dev.st_dev)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
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


def _mknod(dev: _Dev, node: Change) -> None:
    """Create one node (parents too); an identical node already there is left alone."""
    parts = split_container_path(node.path)[1:]
    dirfd = _walk(dev, parts[:-1], create=True)
    assert dirfd is not None
    try:
        st = _lstat(dirfd, parts[-1])
        if st is not None:
            if _same_device(st, node.type, node.major, node.minor):
                return
            raise ApplyError(node.path, "mknod", "exists and is not the planned device node")
        kind = stat.S_IFCHR if node.type == "c" else stat.S_IFBLK
        os.mknod(parts[-1], kind | (node.mode & 0o7777), os.makedev(node.major, node.minor), dir_fd=dirfd)
        dev.journal.append(node)
        try:
            os.chown(parts[-1], node.uid, node.gid, dir_fd=dirfd, follow_symlinks=False)
        except OSError as exc:
            raise ApplyError(node.path, "chown", exc.strerror or str(exc)) from exc
        if not _same_device(_lstat(dirfd, parts[-1]), node.type, node.major, node.minor):
            raise ApplyError(node.path, "mknod", "node differs from the plan after mknod")
    finally:
        os.close(dirfd)


def _unlink(dev: _Dev, path: str, expect: Change | None) -> None:
    """Remove one char/block node of the container's /dev; with ``expect`` only if it is still that device."""
    parts = split_container_path(path)[1:]
    dirfd = _walk(dev, parts[:-1], create=False)
    if dirfd is None:
        return
    try:
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
        dev.journal.append(
            Change(
                op="unlink",
                path=path,
                type=kind,
                major=major,
                minor=minor,
                mode=mode,
                uid=st.st_uid,
                gid=st.st_gid,
            )
        )
    finally:
        os.close(dirfd)


def _rmdir(dev: _Dev, path: str) -> None:
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
    finally:
        os.close(dirfd)


def _run_actions(dev: _Dev, actions: Sequence[tuple[str, Change]]) -> None:
    """Each action in order; one that would cross into another mount is skipped and noted.

    Any other failure names the container path and the operation (one ``ApplyError``).
    """
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


def _container_root(
    rootfs_id: tuple[int, int] | None, host_root_id: tuple[int, int], rootfs: str | None
) -> int:
    """An O_PATH fd of the container root, called in the child after ``setns`` (see module doc)."""
    ns_root = os.stat("/")
    ns_id = (ns_root.st_dev, ns_root.st_ino)
    if rootfs is None or rootfs_id is None:
        if ns_id == host_root_id:
            raise ApplyError("state", "rootfs", "container has not pivoted yet and no rootfs path was given")
        return os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    if ns_id == rootfs_id:
        return os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != rootfs_id:
        os.close(fd)
        raise ApplyError("state", "rootfs", f"{rootfs} in the container's mount namespace is not its rootfs")
    return fd


def _open_dev(root_fd: int, host_devs: frozenset[int]) -> _Dev | None:
    """The container's /dev below its root; None when it is on a host filesystem (shared)."""
    fd = _open_child_dir(root_fd, "dev")  # /dev is a mount of its own: crossing into it is fine
    st = os.fstat(fd)
    if st.st_dev in host_devs:
        os.close(fd)
        return None
    return _Dev(fd, st.st_dev)


def _child(
    ns_fd: int,
    wfd: int,
    ids: tuple[Any, Any],
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_devs: frozenset[int],
    ns_name: str = "mount namespace",
) -> None:
    """Runs in the forked child: join, resolve root and /dev, act, report; never returns."""
    report: dict[str, Any] = {"error": None, "journal": [], "skipped": []}
    dev: _Dev | None = None
    try:
        try:
            _setns(ns_fd)
        except OSError as exc:
            raise ApplyError(ns_name, "setns", exc.strerror or str(exc)) from exc
        os.umask(0)
        root_fd = _container_root(ids[0], ids[1], rootfs)
        try:
            dev = _open_dev(root_fd, host_devs)
        except OSError as exc:
            raise ApplyError("/dev", "open", exc.strerror or str(exc)) from exc
        if dev is None:
            why = "/dev is on a host filesystem (the st_dev of the host's /, /dev or <driver-root>/dev)"
            report["skipped"] = [[c.path, why] for _, c in actions]
        else:
            _run_actions(dev, actions)
    except ApplyError as exc:
        report["error"] = [exc.file, exc.field, exc.reason]
    except OSError as exc:
        report["error"] = [exc.filename or "", "", exc.strerror or str(exc)]
    except BaseException as exc:  # the child must always report and exit
        report["error"] = ["", "", repr(exc)]
    if dev is not None:
        report["journal"] = [_change_dict(c) for c in dev.journal]
        report["skipped"] = dev.skipped
    status = 1
    try:
        os.write(wfd, json.dumps(report).encode())
        status = 0
    finally:
        os._exit(status)  # 1: the parent gets no report and fails the step (the runtime aborts the container)


def _change_dict(c: Change) -> dict[str, Any]:
    return {f.name: getattr(c, f.name) for f in fields(Change)}


def _host_devs(host_dev: Sequence[str]) -> frozenset[int]:
    """``st_dev`` of the host's ``/`` and each of its ``/dev`` directories, seen from the hook."""
    found = set()
    for path in ("/", *host_dev):
        try:
            found.add(os.stat(path).st_dev)
        except OSError:
            continue  # a driver root without /dev: nothing to compare with
    return frozenset(found)


@record
class _Outcome:
    journal: tuple[Change, ...]
    skipped: tuple[tuple[str, str], ...]
    error: tuple[str, str, str] | None


def _in_namespace(
    pid: int,
    proc: Path,
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_dev: Sequence[str],
) -> _Outcome:
    """Fork a child into ``pid``'s mount namespace to run ``actions``; its journal, skips and error."""
    ns_path = proc / str(pid) / "ns" / "mnt"
    try:
        ns_fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ApplyError(str(ns_path), "open", exc.strerror or str(exc)) from exc
    try:
        host_root = os.stat("/")
        rootfs_st = os.stat(rootfs) if rootfs is not None else None
    except OSError as exc:
        os.close(ns_fd)
        raise ApplyError(exc.filename or "/", "stat", exc.strerror or str(exc)) from exc
    ids = ((rootfs_st.st_dev, rootfs_st.st_ino) if rootfs_st else None, (host_root.st_dev, host_root.st_ino))
    host_devs = _host_devs(host_dev)
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(rfd)
        _child(ns_fd, wfd, ids, rootfs, actions, host_devs, str(ns_path))
    os.close(wfd)
    os.close(ns_fd)
    data = b""
    with os.fdopen(rfd, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(child, 0)
    try:
        report = json.loads(data)
        journal = tuple(Change(**c) for c in report["journal"])
        skipped = tuple((str(p), str(w)) for p, w in report["skipped"])
        error = report["error"]
    except (ValueError, KeyError, TypeError):
        why = f"the helper in the container's namespace exited without a report (wait status {status})"
        return _Outcome(journal=(), skipped=(), error=(str(ns_path), "", why))
    return _Outcome(journal=journal, skipped=skipped, error=tuple(error) if error else None)


@record
class Undo:
    """What ``apply`` changed in one container, and how to take it back."""

    pid: int
    rootfs: str | None
    journal: tuple[Change, ...]
    proc: Path = Path("/proc")
    host_dev: tuple[str, ...] = ("/dev",)
    skipped: tuple[tuple[str, str], ...] = ()  # (container path, why) left alone: not the container's /dev

    @property
    def created(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.journal if c.op == "mknod")

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.journal if c.op == "unlink")

    def run(self) -> None:
        """Remove what was created (only if still the same device) and re-create what was removed."""
        inverse = {"mknod": "unlink-ours", "unlink": "mknod", "mkdir": "rmdir"}
        actions = [(inverse[c.op], c) for c in reversed(self.journal)]
        if not actions:
            return
        out = _in_namespace(self.pid, self.proc, self.rootfs, actions, self.host_dev)
        if out.error:
            file, op, reason = out.error
            raise ApplyError(file, f"undo {op}" if op else "undo", reason)


def apply(
    pid: int,
    create: Sequence[Node],
    remove: Sequence[str],
    *,
    rootfs: str | None = None,
    proc: Path = Path("/proc"),
    host_dev: Sequence[str] = ("/dev",),
) -> Undo:
    """Create ``create`` and remove ``remove`` in ``pid``'s container; on failure undo and raise.

    ``host_dev`` lists the host's ``/dev`` directories (``/dev``, ``<driver-root>/dev``): a
    container ``/dev`` on one of their filesystems, or on the host's ``/``, is left untouched.
    """
    actions: list[tuple[str, Change]] = [("unlink", Change(op="unlink", path=p)) for p in remove]
    for n in create:
        split_container_path(n.path)
        if n.type not in ("c", "b"):
            raise ApplyError("plan", n.path, f"node type must be c or b, not {n.type!r}")
        actions.append(
            (
                "mknod",
                Change(
                    op="mknod",
                    path=n.path,
                    type=n.type,
                    major=n.major,
                    minor=n.minor,
                    mode=n.file_mode,
                    uid=n.uid,
                    gid=n.gid,
                ),
            )
        )
    for p in remove:
        split_container_path(p)
    out = _in_namespace(pid, proc, rootfs, actions, host_dev)
    undo = Undo(
        pid=pid, rootfs=rootfs, journal=out.journal, proc=proc, host_dev=tuple(host_dev), skipped=out.skipped
    )
    if out.error:
        file, op, reason = out.error
        try:
            undo.run()
        except ApplyError as exc:
            reason += f" (undo also failed: {exc})"
        raise ApplyError(file or "device nodes child", op, reason)
    return undo
