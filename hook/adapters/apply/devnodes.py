"""Device nodes inside a live container: create the Plan's nodes, remove its removals, undo both.

Rule: every change happens in a helper that has joined the container's mount namespace
(``setns`` on ``/proc/<pid>/ns/mnt``): a thread with its own filesystem attributes (``in_thread``:
the per-start hook and ``hook nri``, where a fork costs 2-3 ms a start) or a forked child. Every
container path is resolved and changed by ``hook.adapters.apply.devpath`` (one component at a time
from an ``O_PATH`` fd, no symlink, no ``..``, no other mount). The helper reports a journal (the
child as JSON over a pipe) so the caller can undo exactly what was done, even when the helper
failed half-way.

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

import os

from hook.adapters.apply.devpath import (
    ROW,
    Change,
    DevDir,
    change,
    open_child_dir,
    run_actions,
    split_container_path,
)
from hook.adapters.apply.libcalls import setns, unshare
from hook.adapters.apply.locate import path_text
from hook.adapters.log import dumps  # json's own C encoder and scanner: the json package loads re
from hook.core.errors import ApplyError
from hook.core.record import record
from hook.sources.privatefile import loads

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from os import PathLike
    from typing import Any

    from hook.core.plan import Node

__all__ = ["Change", "Undo", "apply", "split_container_path"]

CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200


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


def _open_dev(root_fd: int, host_devs: frozenset[int]) -> DevDir | None:
    """The container's /dev below its root; None when it is on a host filesystem (shared)."""
    fd = open_child_dir(root_fd, "dev")  # /dev is a mount of its own: crossing into it is fine
    st = os.fstat(fd)
    if st.st_dev in host_devs:
        os.close(fd)
        return None
    return DevDir(fd, st.st_dev)


def _work(
    ns_fd: int,
    ids: tuple[Any, Any],
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_devs: frozenset[int],
    ns_name: str,
) -> dict[str, Any]:
    """Join, resolve root and /dev, act; the report. Never raises, and closes every fd it opened
    (a helper thread's fds are the daemon's own)."""
    report: dict[str, Any] = {"error": None, "journal": [], "skipped": []}
    dev: DevDir | None = None
    root_fd = -1
    try:
        try:
            setns(ns_fd, CLONE_NEWNS)
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
            run_actions(dev, actions)
    except ApplyError as exc:
        report["error"] = [exc.file, exc.field, exc.reason]
    except OSError as exc:
        report["error"] = [exc.filename or "", "", exc.strerror or str(exc)]
    except BaseException as exc:  # the helper must always report (and the child exit)
        report["error"] = ["", "", repr(exc)]
    if dev is not None:
        report["journal"] = dev.journal
        report["skipped"] = dev.skipped
        dev.close()
        os.close(dev.fd)
    if root_fd >= 0:
        os.close(root_fd)
    return report


def _thread(
    ns_fd: int,
    ids: tuple[Any, Any],
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_devs: frozenset[int],
    ns_name: str,
) -> dict[str, Any]:
    """``_work`` in a new thread of this process: a fork copies the process's memory map (a
    long-lived daemon's heap; the per-start hook's 2-3 ms with its wait and copy-on-write faults).
    The thread first unshares its filesystem attributes (``CLONE_FS``: root, cwd, umask), which
    Linux requires before ``setns(CLONE_NEWNS)`` in one thread of many, so the join, the root and
    the umask are that thread's alone; it then ends, never serving anything else. Nothing in it
    imports (the report is the same dict the child writes)."""
    import _thread

    done = _thread.allocate_lock()
    done.acquire()
    out: list[dict[str, Any]] = []

    def body() -> None:
        try:
            try:
                unshare(CLONE_FS)  # libc's symbol was resolved at import, in the daemon's namespace
            except OSError as exc:
                out.append({"error": [ns_name, "unshare", os.strerror(exc.errno or 0)], "journal": [],
                            "skipped": []})  # fmt: skip
            else:
                out.append(_work(ns_fd, ids, rootfs, actions, host_devs, ns_name))
        except BaseException as exc:  # always report, never print (a traceback reads files)
            out.append({"error": ["", "", repr(exc)], "journal": [], "skipped": []})
        finally:
            done.release()

    _thread.start_new_thread(body, ())
    done.acquire()
    return out[0]


def _child(
    ns_fd: int,
    wfd: int,
    ids: tuple[Any, Any],
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_devs: frozenset[int],
    ns_name: str = "mount namespace",
) -> None:
    """Runs in the forked child: ``_work``, then its report on the pipe; never returns."""
    report = _work(ns_fd, ids, rootfs, actions, host_devs, ns_name)
    status = 1
    try:
        os.write(wfd, dumps(report).encode())
        status = 0
    finally:
        os._exit(status)  # 1: the parent gets no report and fails the step (the runtime aborts the container)


def _row(r: object) -> tuple[Any, ...]:
    """One journal row from the helper's report: exactly ``ROW``'s fields, else the report is unread."""
    if not isinstance(r, list) or len(r) != len(ROW):
        raise ValueError("not a journal row")
    return tuple(r)


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
    rows: tuple[tuple[Any, ...], ...]  # the journal (``devpath.ROW``)
    skipped: tuple[tuple[str, str], ...]
    error: tuple[str, str, str] | None


def _in_namespace(
    pid: int,
    proc: str,
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_dev: Sequence[str],
    in_thread: bool = False,
) -> _Outcome:
    """Fork a child (``in_thread``: start a thread, ``_thread``) into ``pid``'s mount namespace to
    run ``actions``; its journal, skips and error."""
    ns_path = os.path.join(proc, str(pid), "ns", "mnt")
    try:
        ns_fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ApplyError(ns_path, "open", exc.strerror or str(exc)) from exc
    try:
        host_root = os.stat("/")
        rootfs_st = os.stat(rootfs) if rootfs is not None else None
    except OSError as exc:
        os.close(ns_fd)
        raise ApplyError(exc.filename or "/", "stat", exc.strerror or str(exc)) from exc
    ids = ((rootfs_st.st_dev, rootfs_st.st_ino) if rootfs_st else None, (host_root.st_dev, host_root.st_ino))
    host_devs = _host_devs(host_dev)
    if in_thread:
        try:
            report = _thread(ns_fd, ids, rootfs, actions, host_devs, ns_path)
        finally:
            os.close(ns_fd)
        status = 0
        data = b""
    else:
        data, status = _forked(ns_fd, ids, rootfs, actions, host_devs, ns_path)
        report = None
    try:
        if report is None:
            report = loads(data)
        rows = tuple(_row(r) for r in report["journal"])
        skipped = tuple((str(p), str(w)) for p, w in report["skipped"])
        error = report["error"]
    except (ValueError, KeyError, TypeError):
        why = f"the helper in the container's namespace exited without a report (wait status {status})"
        return _Outcome(rows=(), skipped=(), error=(ns_path, "", why))
    return _Outcome(rows=rows, skipped=skipped, error=tuple(error) if error else None)


def _forked(
    ns_fd: int,
    ids: tuple[Any, Any],
    rootfs: str | None,
    actions: Sequence[tuple[str, Change]],
    host_devs: frozenset[int],
    ns_path: str,
) -> tuple[bytes, int]:
    """The child's report (bytes) and its wait status; closes ``ns_fd``."""
    dumps(None)  # the encoder is built here: the child, in the container's namespace, imports nothing
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(rfd)
        _child(ns_fd, wfd, ids, rootfs, actions, host_devs, ns_path)
    os.close(wfd)
    os.close(ns_fd)
    data = b""
    with os.fdopen(rfd, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(child, 0)
    return data, status


@record
class Undo:
    """What ``apply`` changed in one container, and how to take it back."""

    pid: int
    rootfs: str | None
    rows: tuple[tuple[Any, ...], ...]  # the journal as the helper kept it (``devpath.ROW``)
    proc: str = "/proc"
    host_dev: tuple[str, ...] = ("/dev",)
    skipped: tuple[tuple[str, str], ...] = ()  # (container path, why) left alone: not the container's /dev
    in_thread: bool = False  # undone the way it was done (see ``_in_namespace``)

    @property
    def journal(self) -> tuple[Change, ...]:
        """Each change done, in order (made from the rows only when asked: an undo, a test)."""
        return tuple(change(r) for r in self.rows)

    @property
    def created(self) -> tuple[str, ...]:
        return tuple(r[1] for r in self.rows if r[0] == "mknod")

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(r[1] for r in self.rows if r[0] == "unlink")

    def run(self) -> None:
        """Remove what was created (only if still the same device) and re-create what was removed."""
        inverse = {"mknod": "unlink-ours", "unlink": "mknod", "mkdir": "rmdir"}
        actions = [(inverse[c.op], c) for c in reversed(self.journal)]
        if not actions:
            return
        out = _in_namespace(self.pid, self.proc, self.rootfs, actions, self.host_dev, self.in_thread)
        if out.error:
            file, op, reason = out.error
            raise ApplyError(file, f"undo {op}" if op else "undo", reason)


def apply(
    pid: int,
    create: Sequence[Node],
    remove: Sequence[str],
    *,
    rootfs: str | None = None,
    proc: str | PathLike[str] = "/proc",
    host_dev: Sequence[str] = ("/dev",),
    in_thread: bool = False,
) -> Undo:
    """Create ``create`` and remove ``remove`` in ``pid``'s container; on failure undo and raise.

    ``host_dev`` lists the host's ``/dev`` directories (``/dev``, ``<driver-root>/dev``): a
    container ``/dev`` on one of their filesystems, or on the host's ``/``, is left untouched.
    """
    made: list[tuple[str, Change]] = []
    for n in create:
        split_container_path(n.path)
        if n.type not in ("c", "b"):
            raise ApplyError("plan", n.path, f"node type must be c or b, not {n.type!r}")
        made.append(
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
    actions: list[tuple[str, Change]] = []  # the removals first, then the creates
    for p in remove:  # checked after the creates (a bad create is the error named first)
        split_container_path(p)
        actions.append(("unlink", Change(op="unlink", path=p)))
    actions += made
    where = path_text(os.fspath(proc))
    out = _in_namespace(pid, where, rootfs, actions, host_dev, in_thread)
    undo = Undo(
        pid=pid,
        rootfs=rootfs,
        rows=out.rows,
        proc=where,
        host_dev=tuple(host_dev),
        skipped=out.skipped,
        in_thread=in_thread,
    )
    if out.error:
        file, op, reason = out.error
        try:
            undo.run()
        except ApplyError as exc:
            reason += f" (undo also failed: {exc})"
        raise ApplyError(file or "device nodes child", op, reason)
    return undo
