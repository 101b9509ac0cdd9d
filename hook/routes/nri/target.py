"""Which process NRI's start (or Synchronize) names, checked before anything is written to it.

Rule: a pid from the socket is a claim, never a fact. It is acted on only when, through a pidfd
held from before the first read until after the last: it is not the daemon, not init and not the
daemon's parent; its mount namespace differs from the daemon's and from init's (where root cannot
read init's, from the daemon's alone, and the check says so); its cgroup is the container's
``linux.cgroupsPath`` (``hook.adapters.apply.locate``), which names the container's own id; and it
is still alive after all of that (so every file read was that process's: a pid is reused only
after its process died). Whatever fails is an ``InputError`` on the event's ``pid`` field and
nothing is written. The bounding set is read from the same process (``CapBnd``): NRI does not
carry capabilities.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

from hook.adapters.apply.locate import CgroupTarget, find_container
from hook.core.errors import InputError
from hook.core.record import record
from hook.routes.nri.spec import SYS_ADMIN, names_container

__all__ = ["Checked", "check_pid", "alive", "bounding_of"]

CAP_SYS_ADMIN_BIT = 21


@record
class Checked:
    pid: int
    pidfd: int
    target: CgroupTarget
    bounding: frozenset[str]
    namespaces: str  # which mount namespaces it was compared with


def alive(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def bounding_of(status: str) -> frozenset[str]:
    """The names a decision reads from ``/proc/PID/status`` ``CapBnd`` (only CAP_SYS_ADMIN matters)."""
    for line in status.splitlines():
        if line.startswith("CapBnd:"):
            bits = int(line.split(":", 1)[1].strip(), 16)
            return frozenset({SYS_ADMIN}) if bits >> CAP_SYS_ADMIN_BIT & 1 else frozenset()
    raise ValueError("no CapBnd line")


def _ns(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_pid(
    pid: int, container_id: str, cgroups_path: str, source: str, proc: Path = Path("/proc")
) -> Checked:
    """The checked target; the caller closes ``pidfd`` (``release``)."""

    def refuse(why: str) -> InputError:
        return InputError(source, "pid", f"{pid} is not container {container_id[:64]!r}'s: {why}")

    if pid <= 1 or pid in (os.getpid(), os.getppid()):
        raise refuse("it is init or the daemon itself")
    if not names_container(cgroups_path, container_id):
        raise InputError(
            source,
            "linux.cgroupsPath",
            f"{cgroups_path[:200]!r} does not name container {container_id[:64]!r}",
        )
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise refuse(f"pidfd_open: {exc.strerror or exc}") from exc
    try:
        try:
            theirs = _ns(proc / str(pid) / "ns" / "mnt")
            ours = _ns(proc / "self" / "ns" / "mnt")
        except OSError as exc:
            raise refuse(f"{exc.filename}: {exc.strerror or exc}") from exc
        try:
            init: tuple[int, int] | None = _ns(proc / "1" / "ns" / "mnt")
            namespaces = "the daemon's and init's"
        except OSError:
            init, namespaces = None, "the daemon's only (init's mount namespace cannot be read)"
        if theirs in (ours, init):
            raise refuse("it shares the mount namespace of " + ("the daemon" if theirs == ours else "init"))
        target = find_container(pid, cgroups_path, source=source, proc=proc)
        try:
            status = (proc / str(pid) / "status").read_text(errors="replace")
            bounding = bounding_of(status)
        except (OSError, ValueError) as exc:
            raise refuse(f"status: {exc}") from exc
        if not alive(pidfd):
            raise refuse("it exited while being checked")
        return Checked(pid=pid, pidfd=pidfd, target=target, bounding=bounding, namespaces=namespaces)
    except BaseException:
        os.close(pidfd)
        raise
