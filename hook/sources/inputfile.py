"""One input file a decision reads (config.json, a state file, the kubelet's files), read whole and bounded.

Rule: a file is refused over its limit before it is read whole, and every problem is an
``InputError`` naming the file (``FileNotFoundError`` only where "no file" is a state the caller
weighs). ``read_regular`` also refuses anything that could block or redirect the read: a FIFO,
a device, a symlink.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.errors import InputError

__all__ = ["read_limited", "read_regular"]


def read_limited(path: Path, limit: int, what: str) -> bytes:
    """Read a whole file, refusing one over ``limit`` before reading it all."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(str(path), "", f"no such file ({what})") from None
    except OSError as exc:
        raise InputError(str(path), "", exc.strerror or str(exc)) from None
    if len(data) > limit:
        raise InputError(str(path), "", f"larger than {limit} bytes")
    return data



def read_regular(path: Path, limit: int, what: str) -> bytes:
    """A whole regular file of at most ``limit`` bytes, opened so that nothing there can block or
    redirect the read: ``O_NONBLOCK`` (a FIFO never hangs a container's start), ``O_NOFOLLOW``
    (a symlink is refused) and the regular-file check on the open descriptor.

    ``FileNotFoundError`` when there is no file; every other problem is an ``InputError``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputError(str(path), "", f"{exc.strerror or exc} ({what})") from None
    except ValueError:
        raise InputError(str(path), "", f"path contains a NUL byte ({what})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(str(path), "", f"not a regular file ({what})")
        if st.st_size > limit:
            raise InputError(str(path), "", f"larger than {limit} bytes ({what})")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(str(path), "", f"{exc.strerror or exc} ({what})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise InputError(str(path), "", f"larger than {limit} bytes ({what})")
    return b"".join(chunks)

