"""The resident daemon's own mount table, parsed once and read again only when the kernel says it
changed.

Rule: ``hook nri`` locates a container's cgroup through its own ``/proc/self/mountinfo`` at every
StartContainer; on a node running many pods that file has a line per mount of every container, and
parsing it per start is work proportional to the node, not to the container. The kernel marks a
``mountinfo`` file descriptor with ``POLLPRI | POLLERR`` once its mount namespace's table changed
since the descriptor last polled (proc(5)); so one descriptor is held open, polled before every use,
and the file is read again from its start whenever it was marked (or the last parse failed). The
poll comes before the read: a change during the read marks the descriptor again, so the next use
reads again, and the table used is never older than the poll. Only for ``/proc/self/mountinfo`` of
a process that keeps views warm (``hook.sources.warm``); the per-start hook reads the file each time.
"""

from __future__ import annotations

import os
import select
from _thread import allocate_lock

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")

__all__ = ["kept", "reads"]

_fds: dict[str, int] = {}
_parsed: dict[str, object] = {}  # path -> the parse of its last read
_lock = allocate_lock()
reads = [0]  # how many times the file was read (tests count them)


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    reads[0] += 1
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def kept(path: str, parse: Callable[[str, str], T]) -> T:
    """``parse(text, path)`` of the mount table at ``path``, as of now (see the module rule).
    ``OSError`` and the parser's errors as a fresh read would raise them; a failed parse is not kept."""
    with _lock:
        fd = _fds.get(path)
        if fd is None:
            fd = _fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            _parsed.pop(path, None)
        else:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            if poller.poll(0):
                _parsed.pop(path, None)
        if path not in _parsed:
            _parsed[path] = parse(_read_all(fd), path)
        return _parsed[path]  # type: ignore[return-value]
