"""devnodes' thread helper (``in_thread``, what the long-lived NRI daemon uses instead of a fork
per start): the same changes in the container's mount namespace, the same refusals, and nothing
of the join left on the daemon: its own mount namespace, root, cwd, umask and fd table are as
before, and no process is forked."""

from __future__ import annotations

import errno
import gc
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.apply import devnodes
from hook.core.errors import ApplyError
from tests.apply.test_devnodes import CAP2, in_ns, make_rootfs, pivoted, spawn, unpivoted

__all__ = ["spawn"]  # the fixture, shared

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and mknod need root")


def _own() -> tuple[Any, ...]:
    """What a join that leaked would change in this thread (and the process's open fds)."""
    gc.collect()  # an earlier test's unreachable file closes now, not between the two snapshots
    umask = os.umask(0o022)
    os.umask(umask)
    root, cwd = os.stat("/"), os.stat(".")
    return (
        os.readlink("/proc/thread-self/ns/mnt"),
        (root.st_dev, root.st_ino),
        (cwd.st_dev, cwd.st_ino),
        umask,
        sorted(os.listdir("/proc/self/fd")),
    )


@pytest.fixture
def no_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise AssertionError("the thread helper forked")

    monkeypatch.setattr(os, "fork", refuse)


def test_the_thread_creates_removes_and_undoes_in_the_namespace_and_leaves_the_daemon_as_it_was(
    tmp_path: Path, spawn: Callable[[str], int], no_fork: None
) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(pivoted(root))
    os.mknod(in_ns(pid, None, "/dev/nvidia0"), stat.S_IFCHR | 0o666, os.makedev(195, 0))
    before = _own()
    undo = devnodes.apply(pid, [CAP2], ["/dev/nvidia0"], in_thread=True)
    assert _own() == before
    st = os.lstat(in_ns(pid, None, CAP2.path))
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444  # umask 0, the thread's
    assert (st.st_uid, st.st_gid) == (1000, 1001)
    assert not in_ns(pid, None, "/dev/nvidia0").exists()
    assert undo.created == (CAP2.path,) and undo.removed == ("/dev/nvidia0",) and undo.in_thread
    undo.run()
    assert _own() == before
    assert not in_ns(pid, None, "/dev/nvidia-caps").exists()
    assert stat.S_ISCHR(os.lstat(in_ns(pid, None, "/dev/nvidia0")).st_mode)
    assert not Path("/dev/nvidia-caps/nvidia-cap2").exists()


def test_the_thread_refuses_what_the_child_refuses(
    tmp_path: Path, spawn: Callable[[str], int], no_fork: None
) -> None:
    root = make_rootfs(tmp_path)
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    pid = spawn(unpivoted(root, f"ln -s {host_dir} {root}/dev/nvidia-caps &&"))
    before = _own()
    with pytest.raises(ApplyError, match=r"nvidia-caps\b.*Not a directory"):
        devnodes.apply(pid, [CAP2], [], rootfs=str(root), in_thread=True)
    assert list(host_dir.iterdir()) == [] and _own() == before
    with pytest.raises(ApplyError, match="not pivoted"):
        devnodes.apply(pid, [CAP2], [], in_thread=True)
    assert _own() == before


def test_a_thread_that_cannot_unshare_never_joins(
    tmp_path: Path, spawn: Callable[[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its own filesystem attributes the thread would share the daemon's root and umask:
    it reports the error and joins nothing (the kernel would refuse the join too; this does not
    rely on it)."""
    joined: list[int] = []

    def no_unshare(flags: int) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(devnodes, "unshare", no_unshare)
    monkeypatch.setattr(devnodes, "setns", lambda fd, nstype: joined.append(fd))
    pid = spawn(pivoted(make_rootfs(tmp_path)))
    before = _own()
    with pytest.raises(ApplyError) as info:
        devnodes.apply(pid, [CAP2], [], in_thread=True)
    assert info.value.field == "unshare" and info.value.file == f"/proc/{pid}/ns/mnt"
    assert joined == [] and _own() == before
    assert not in_ns(pid, None, "/dev/nvidia-caps").exists()
