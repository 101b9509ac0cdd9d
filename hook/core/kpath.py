"""Paths from config.json as the kernel and runc resolve them, for comparing one with another.

Rule: pure string work, no filesystem. ``posixpath.normpath`` keeps exactly two leading slashes
(POSIX leaves ``//x`` implementation-defined), but Linux resolves ``//dev`` as ``/dev``; a
comparison on ``normpath`` output lets ``//dev`` past a check for ``/dev``. runc reads a relative
mount destination as below the container's ``/`` (libcontainer ``specconv``: "relative destination
… using it as relative to /", then ``securejoin`` under the rootfs) and a relative bind source
from the bundle directory (it changes into the bundle before it builds the config). Symlinks are
not followed here: the live node helper checks the filesystem itself (``apply.devnodes``).
"""

from __future__ import annotations

import posixpath

__all__ = ["lexical", "container_path", "host_source"]


def lexical(path: str) -> str:
    """``path`` with ``.``, ``..`` and repeated slashes resolved as the kernel walks them
    (``..`` at ``/`` stays at ``/``); a relative path stays relative."""
    clean = posixpath.normpath(path)
    return clean[1:] if clean.startswith("//") else clean


def container_path(path: str) -> str:
    """A path inside the container (a mount destination, a device path), always absolute."""
    return lexical("/" + path)


def host_source(source: str, bundle: str) -> str | None:
    """A bind mount's source on the host; ``None`` when it is relative and the bundle is unknown
    (``hook precreate`` has no bundle, a relative one depends on runc's working directory):
    then the hook cannot tell what it names."""
    if source.startswith("/"):
        return lexical(source)
    if not bundle.startswith("/"):
        return None
    return lexical(posixpath.join(bundle, source))
