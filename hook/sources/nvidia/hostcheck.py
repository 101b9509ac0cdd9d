"""Host device nodes must be what the inventory says they are before anything trusts them.

Rule: a host node is accepted only if ``lstat`` shows a character device whose ``st_rdev`` is the
expected major:minor; a symlink, another file type or another device number is refused with an
``InputError`` naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.errors import InputError

__all__ = ["verify_host_node"]


def verify_host_node(path: Path, expected_major: int, expected_minor: int) -> os.stat_result:
    """Return the node's ``lstat`` result, or raise ``InputError`` if it is not ``c major:minor``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InputError(str(path), "", "device node not found") from None
    except OSError as exc:
        raise InputError(str(path), "", f"cannot stat: {exc.strerror or exc}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise InputError(str(path), "type", "not a character device node (symlinks are not followed)")
    actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if actual != (expected_major, expected_minor):
        raise InputError(
            str(path),
            "st_rdev",
            f"is {actual[0]}:{actual[1]}, expected {expected_major}:{expected_minor}; refusing it",
        )
    return st
