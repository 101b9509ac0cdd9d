"""The node helper's calls that this Python's ``os`` may lack: ``setns``, ``unshare``, ``openat2``.

Rule: reached through ``_ctypes``, the C core of ``ctypes``, never the ``ctypes`` package. The
package's Python layer (``types``, ``struct``, ``ctypes._endian`` and its hundred-odd classes)
costs about 2 ms of every start that changes a node (issue 35), for three calls whose arguments
are ints and byte strings: all go through one function-pointer class, with libc's ``errno`` kept
(``FUNCFLAG_USE_ERRNO``) and returned as ``OSError``. ``open_how`` is packed by ``_struct`` (its
three ``u64`` fields, native order), which is how the kernel reads it. ``os.setns`` and ``os.unshare``
(Python 3.12) are used where the interpreter has them. Nothing here decides; the callers own every check.
"""

from __future__ import annotations

import _ctypes
import os
from _struct import pack

__all__ = ["SYS_OPENAT2", "openat2", "setns", "unshare"]

SYS_OPENAT2 = 437  # x86_64 and aarch64 (asm-generic) alike
OPEN_HOW = "=QQQ"  # struct open_how: flags, mode, resolve (u64 each)


class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # C int, what both calls return
    _type_ = "i"


class _Call(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


_LIBC = _ctypes.dlopen(None)  # type: ignore[arg-type]  # the process itself (libc's symbols), as CDLL(None)
_SETNS = _Call(_ctypes.dlsym(_LIBC, "setns"))
_SYSCALL = _Call(_ctypes.dlsym(_LIBC, "syscall"))
_UNSHARE = _Call(_ctypes.dlsym(_LIBC, "unshare"))


def _error(name: str | None = None) -> OSError:
    err = _ctypes.get_errno()
    return OSError(err, os.strerror(err)) if name is None else OSError(err, os.strerror(err), name)


def setns(fd: int, nstype: int) -> None:
    """Join the namespace ``fd`` names (``nstype``: its ``CLONE_NEW*`` flag); ``OSError`` on failure."""
    if hasattr(os, "setns"):
        os.setns(fd, nstype)
    elif _SETNS(fd, nstype) != 0:
        raise _error()


def unshare(flags: int) -> None:
    """Stop sharing what ``flags`` names (``CLONE_FS``: root, cwd, umask) with the other threads."""
    if hasattr(os, "unshare"):
        os.unshare(flags)
    elif _UNSHARE(flags) != 0:
        raise _error()


def openat2(dirfd: int, name: str, flags: int, resolve: int) -> int:
    """``openat2(dirfd, name, {flags, 0, resolve})``: the new fd, or ``OSError`` with the kernel's
    errno (``ENOSYS`` on kernels before 5.6, ``EXDEV`` for a refused mount crossing) and ``name``."""
    how = pack(OPEN_HOW, flags, 0, resolve)
    fd = _SYSCALL(SYS_OPENAT2, dirfd, name.encode(), how, len(how))
    if fd < 0:
        raise _error(name)
    return int(fd)
