"""The node's filesystem as the installer touches it: paths resolved inside a root, whole-file writes.

Rule: the installer runs in a DaemonSet pod with the node's ``/`` at ``--root`` (``/host``), and
node images keep engine configs behind absolute symlinks (``/etc/containerd/config.toml`` →
``/etc/k8s/containerd.toml``). Following such a link in the pod's own filesystem reads and writes
the wrong file, so every node path is resolved the way ``openat2(RESOLVE_IN_ROOT)`` resolves it
(openat2(2)): an absolute symlink target and ``..`` start again at, and never climb above, the
root. A write goes to a temp file beside the target, every byte of it (a short write is looped,
a zero-byte write is ENOSPC), is read back and checked (``verify``), and only then renamed over the
target: a full filesystem leaves the old file, never a truncated one.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["MAX_LINKS", "resolve_in_root", "atomic_write"]

MAX_LINKS = 40  # the kernel's limit on symlinks followed in one lookup (ELOOP past it)


def resolve_in_root(root: str, node_path: str, *, follow: bool = True) -> Path:
    """The host path of ``node_path`` on a node whose ``/`` is ``root``.

    ``follow=False`` keeps a symlink in the last component (what rename, unlink and symlink act
    on); every earlier component is always resolved. A path that does not exist (yet) resolves
    as far as it exists and keeps the rest as written. ``ValueError`` for a relative node path;
    ``OSError(ELOOP)`` past ``MAX_LINKS`` links.
    """
    if not node_path.startswith("/"):
        raise ValueError(f"{node_path!r}: a node path must be absolute")
    base = os.path.realpath(root)
    todo = [p for p in node_path.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()  # at the root, ".." is the root (RESOLVE_IN_ROOT)
            continue
        here = os.path.join(base, *done, part)
        if not todo and not follow:
            done.append(part)
            break
        try:
            target = os.readlink(here)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                raise
            done.append(part)  # not a symlink (or not there): taken as it is
            continue
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", os.path.join("/", *done, part))
        if target.startswith("/"):
            done = []  # an absolute target starts again at the root, not at the host's /
        todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
    return Path(base, *done)


def atomic_write(
    path: Path, data: bytes, mode: int = 0o644, verify: Callable[[bytes], None] | None = None
) -> None:
    """Replace ``path`` (a host path, already resolved) with ``data`` in one rename.

    The temp file is written in a loop until every byte is down, synced, read back whole and
    compared, then handed to ``verify`` (which raises on content the reader would reject); any
    failure removes the temp file and raises, leaving ``path`` as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover of a killed run with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        back = tmp.read_bytes()
        if back != data:
            raise OSError(errno.EIO, f"read back {len(back)} of {len(data)} bytes", str(path))
        if verify is not None:
            verify(back)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)  # the rename itself survives a crash
        finally:
            os.close(dfd)
