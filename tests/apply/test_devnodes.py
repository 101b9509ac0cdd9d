"""devnodes against real mount namespaces: a process made with ``unshare -m`` stands in for a
paused container (before pivot_root, like runc at prestart, and after it), with a tmpfs /dev
that exists only in that namespace; hostile rootfs layouts must leave the host untouched."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hook.adapters.apply import devnodes, devpath
from hook.core.errors import ApplyError
from hook.core.plan import Node

BUSYBOX = Path("/usr/bin/busybox")
CAP2 = Node(
    path="/dev/nvidia-caps/nvidia-cap2", type="c", major=237, minor=2, file_mode=0o444, uid=1000, gid=1001
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and mknod need root")


def make_rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "dev").mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    return root


@pytest.fixture
def spawn() -> Iterator[Callable[[str], int]]:
    """Start ``sh -c script`` in a private mount namespace; the script echoes ``ready`` when set up."""
    procs: list[subprocess.Popen[str]] = []

    def start(script: str) -> int:
        proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def unpivoted(root: Path, extra: str = "") -> str:
    return f"mount -t tmpfs -o mode=755 tmpfs {root}/dev && {extra} echo ready && exec sleep 600"


def pivoted(root: Path) -> str:
    bb = "/bin/busybox"
    inner = f"{bb} umount -l /old; {bb} mount -t tmpfs tmpfs /dev; echo ready; exec {bb} sleep 600"
    setup = f"mount --bind {root} {root} && cd {root} && mkdir -p old && pivot_root . old"
    return f"{setup} && exec {bb} sh -c '{inner}'"


def in_ns(pid: int, root: Path | None, path: str) -> Path:
    """A host path that reaches ``path`` of the container through ``/proc/<pid>/root``."""
    base = Path(f"/proc/{pid}/root")
    return base / str(root).lstrip("/") / path.lstrip("/") if root else base / path.lstrip("/")


def test_create_before_pivot_lands_in_the_namespace_tmpfs(
    tmp_path: Path, spawn: Callable[[str], int]
) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root, "mknod -m 640 " + str(root) + "/dev/victim c 1 3 &&"))
    undo = devnodes.apply(pid, [CAP2], ["/dev/victim"], rootfs=str(root))
    st = os.lstat(in_ns(pid, root, CAP2.path))
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (237, 2)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o444, 1000, 1001)
    assert stat.S_IMODE(os.lstat(in_ns(pid, root, "/dev/nvidia-caps")).st_mode) == 0o755
    assert not in_ns(pid, root, "/dev/victim").exists()
    assert undo.created == (CAP2.path,) and undo.removed == ("/dev/victim",)
    assert list((root / "dev").iterdir()) == []  # the host side of the rootfs never saw it
    undo.run()
    assert not in_ns(pid, root, "/dev/nvidia-caps").exists()
    victim = os.lstat(in_ns(pid, root, "/dev/victim"))
    assert (os.major(victim.st_rdev), os.minor(victim.st_rdev), stat.S_IMODE(victim.st_mode)) == (1, 3, 0o640)


def test_create_after_pivot_uses_namespace_root(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(pivoted(root))
    undo = devnodes.apply(pid, [CAP2], [], rootfs=str(root))
    assert stat.S_ISCHR(os.lstat(in_ns(pid, None, CAP2.path)).st_mode)
    undo.run()
    assert not in_ns(pid, None, "/dev/nvidia-caps").exists()


def test_after_pivot_works_without_rootfs(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    pid = spawn(pivoted(make_rootfs(tmp_path)))
    undo = devnodes.apply(pid, [CAP2], [])
    st = os.lstat(in_ns(pid, None, CAP2.path))
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (237, 2)
    assert undo.created == (CAP2.path,)
    undo.run()
    assert not in_ns(pid, None, CAP2.path).exists()


def test_undo_leaves_a_node_that_replaced_ours(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    """Between apply and undo something else may take the path: undo removes only its own node
    (mutant h08 drops that check)."""
    pid = spawn(pivoted(make_rootfs(tmp_path)))
    undo = devnodes.apply(pid, [CAP2], [])
    ours = in_ns(pid, None, CAP2.path)
    ours.unlink()
    os.mknod(ours, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    undo.run()
    st = os.lstat(ours)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


def test_unpivoted_without_rootfs_is_refused(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    pid = spawn(unpivoted(make_rootfs(tmp_path)))
    with pytest.raises(ApplyError, match="not pivoted"):
        devnodes.apply(pid, [CAP2], [])
    assert not Path("/dev/nvidia-caps/nvidia-cap2").exists()


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(devpath, "_openat2_works", [request.param == "openat2"])
    return str(request.param)


def test_hostile_dev_symlink_to_host_dir(tmp_path: Path, spawn: Callable[[str], int], resolver: str) -> None:
    root = make_rootfs(tmp_path)
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (root / "dev").rmdir()
    (root / "dev").symlink_to(host_dir)
    pid = spawn("echo ready; exec sleep 600")
    with pytest.raises(ApplyError, match=r"dev\b.*Not a directory"):
        devnodes.apply(pid, [CAP2], [], rootfs=str(root))
    assert list(host_dir.iterdir()) == []


def test_hostile_symlink_below_dev(tmp_path: Path, spawn: Callable[[str], int], resolver: str) -> None:
    root = make_rootfs(tmp_path)
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    pid = spawn(unpivoted(root, f"ln -s {host_dir} {root}/dev/nvidia-caps &&"))
    with pytest.raises(ApplyError, match=r"nvidia-caps\b.*Not a directory"):
        devnodes.apply(pid, [CAP2], [], rootfs=str(root))
    assert list(host_dir.iterdir()) == []


def test_removal_refuses_directory_and_undoes_earlier_creates(
    tmp_path: Path, spawn: Callable[[str], int]
) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root, f"mkdir {root}/dev/adir &&"))
    with pytest.raises(ApplyError, match="not the planned device node"):
        devnodes.apply(pid, [CAP2, Node(path="/dev/adir", type="c", major=1, minor=1)], [], rootfs=str(root))
    assert not in_ns(pid, root, "/dev/nvidia-caps").exists()
    with pytest.raises(ApplyError, match="not a device node"):
        devnodes.apply(pid, [], ["/dev/adir"], rootfs=str(root))
    assert in_ns(pid, root, "/dev/adir").is_dir()


def test_removal_of_symlink_is_refused_target_untouched(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    root = make_rootfs(tmp_path)
    target = tmp_path / "target"
    os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    pid = spawn(unpivoted(root, f"ln -s {target} {root}/dev/link &&"))
    with pytest.raises(ApplyError, match="refusing to remove something that is not a device node"):
        devnodes.apply(pid, [], ["/dev/link"], rootfs=str(root))
    assert stat.S_ISCHR(os.lstat(target).st_mode)


def test_identical_existing_node_is_kept_different_one_refused(
    tmp_path: Path, spawn: Callable[[str], int]
) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root, f"mknod {root}/dev/same c 237 2 && mknod {root}/dev/other c 237 3 &&"))
    same = Node(path="/dev/same", type="c", major=237, minor=2)
    assert devnodes.apply(pid, [same], [], rootfs=str(root)).journal == ()
    with pytest.raises(ApplyError, match="not the planned device"):
        devnodes.apply(pid, [Node(path="/dev/other", type="c", major=237, minor=2)], [], rootfs=str(root))


def test_wrong_rootfs_is_refused(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root))
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    with pytest.raises(ApplyError, match="rootfs"):
        devnodes.apply(pid, [CAP2], [], rootfs=str(tmp_path / "nowhere"))
    # a directory that exists on the host but is a different inode from the namespace's view
    pid2 = spawn(f"mount -t tmpfs tmpfs {decoy} && echo ready && exec sleep 600")
    with pytest.raises(ApplyError, match="not its rootfs"):
        devnodes.apply(pid2, [CAP2], [], rootfs=str(decoy))


@pytest.mark.parametrize("path", ["/etc/passwd", "/dev/../etc/x", "dev/x", "/dev//x", "/dev"])
def test_paths_outside_dev_are_refused_before_anything_runs(path: str) -> None:
    with pytest.raises(ApplyError) as info:
        devnodes.apply(os.getpid(), [Node(path=path, type="c", major=1, minor=3)], [])
    assert info.value.field == path


def test_missing_process_names_its_namespace_file(tmp_path: Path) -> None:
    with pytest.raises(ApplyError) as info:
        devnodes.apply(424242, [CAP2], [], proc=tmp_path)
    assert info.value.file == str(tmp_path / "424242" / "ns" / "mnt")


# ---- issue 11 item 1: never on the host's /dev ----------------------------------------------------


def host_dir_with_node(tmp_path: Path) -> Path:
    """A directory on the host's root filesystem standing in for the host's /dev (one fake node)."""
    host_dir = tmp_path / "host-dev"
    host_dir.mkdir()
    os.mknod(host_dir / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    return host_dir


def test_dev_on_the_host_filesystem_is_left_alone(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    """/dev bound from a host directory: every change is skipped. The directory's filesystem is
    the host's / here when tmp is on it, else it is named as a host /dev (a tmpfs /tmp)."""
    root, host_dir = make_rootfs(tmp_path), host_dir_with_node(tmp_path)
    pid = spawn(f"mount --bind {host_dir} {root}/dev && echo ready && exec sleep 600")
    on_root = os.stat(host_dir).st_dev == os.stat("/").st_dev
    host_dev = ("/dev",) if on_root else ("/dev", str(host_dir))
    undo = devnodes.apply(pid, [CAP2], ["/dev/nvidia0"], rootfs=str(root), host_dev=host_dev)
    assert undo.journal == () and {p for p, _ in undo.skipped} == {CAP2.path, "/dev/nvidia0"}
    assert all("host filesystem" in why for _, why in undo.skipped)
    assert sorted(p.name for p in host_dir.iterdir()) == ["nvidia0"]


def test_dev_of_a_listed_host_dev_dir_is_left_alone(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    """``host_dev`` names <driver-root>/dev; a container /dev on its filesystem is the host's too.
    Here the container's tmpfs is reached from this namespace through /proc/<pid>/root."""
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root, f"mknod {root}/dev/nvidia0 c 195 0 &&"))
    their_dev = in_ns(pid, root, "/dev")
    undo = devnodes.apply(pid, [], ["/dev/nvidia0"], rootfs=str(root), host_dev=("/dev", str(their_dev)))
    assert undo.journal == () and [p for p, _ in undo.skipped] == ["/dev/nvidia0"]
    assert stat.S_ISCHR(os.lstat(their_dev / "nvidia0").st_mode)


def test_host_bind_below_dev_is_not_crossed(
    tmp_path: Path, spawn: Callable[[str], int], resolver: str
) -> None:
    """A hostPath /dev/nvidia-caps in a tmpfs /dev: cards are changed, nothing under the bind."""
    root, host_dir = make_rootfs(tmp_path), host_dir_with_node(tmp_path)
    caps = f"mkdir {root}/dev/nvidia-caps && mount --bind {host_dir} {root}/dev/nvidia-caps"
    pid = spawn(unpivoted(root, f"{caps} && mknod {root}/dev/nvidia1 c 195 1 &&"))
    undo = devnodes.apply(pid, [CAP2], ["/dev/nvidia1", "/dev/nvidia-caps/nvidia0"], rootfs=str(root))
    assert undo.removed == ("/dev/nvidia1",) and undo.created == ()
    assert {p for p, _ in undo.skipped} == {CAP2.path, "/dev/nvidia-caps/nvidia0"}
    assert all("another mount" in why for _, why in undo.skipped)
    assert sorted(p.name for p in host_dir.iterdir()) == ["nvidia0"]


def test_bind_mounted_host_node_is_not_removed(tmp_path: Path, spawn: Callable[[str], int]) -> None:
    root, host_dir = make_rootfs(tmp_path), host_dir_with_node(tmp_path)
    node = f"{root}/dev/nvidia0"
    pid = spawn(unpivoted(root, f"touch {node} && mount --bind {host_dir}/nvidia0 {node} &&"))
    undo = devnodes.apply(pid, [], ["/dev/nvidia0"], rootfs=str(root))
    assert undo.journal == () and [p for p, _ in undo.skipped] == ["/dev/nvidia0"]
    assert stat.S_ISCHR(os.lstat(host_dir / "nvidia0").st_mode)


# ---- issue 11 item 9: one error line, the step once, the file named -----------------------------


def test_mknod_failure_names_the_node_and_the_operation(
    tmp_path: Path, spawn: Callable[[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "mknod", full)  # the forked child inherits it
    with pytest.raises(ApplyError) as info:
        devnodes.apply(pid, [CAP2], [], rootfs=str(root))
    assert str(info.value) == f"{CAP2.path}: mknod: No space left on device"
    assert not in_ns(pid, root, "/dev/nvidia-caps").exists()  # the parent directory was undone


class _Openat2Fails:
    """``openat2`` that fails with one errno (seccomp's EPERM, an old kernel's ENOSYS...), as
    ``hook.adapters.apply.libcalls.openat2`` reports it."""

    def __init__(self, err: int) -> None:
        self.err = err

    def __call__(self, dirfd: int, name: str, flags: int, resolve: int) -> int:
        raise OSError(self.err, os.strerror(self.err), name)


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM], ids=["ENOSYS", "EPERM"])
def test_openat2_unavailable_falls_back_to_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.setattr(devpath, "_openat2_works", [True])
    monkeypatch.setattr(devpath, "openat2", _Openat2Fails(err))
    dirfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = devpath.open_child_dir(dirfd, "sub")
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "sub"))
        os.close(fd)
    finally:
        os.close(dirfd)
    assert devpath._openat2_works == [False]


def test_openat2_refusal_is_not_retried_by_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any other errno is openat2's answer (here EACCES): the fallback must not second-guess it."""
    (tmp_path / "sub").mkdir()
    monkeypatch.setattr(devpath, "_openat2_works", [True])
    monkeypatch.setattr(devpath, "openat2", _Openat2Fails(errno.EACCES))
    dirfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(PermissionError) as info:
            devpath.open_child_dir(dirfd, "sub")
    finally:
        os.close(dirfd)
    assert info.value.filename == "sub"
    assert devpath._openat2_works == [True]


def test_the_helpers_real_wait_status_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper closes its pipe, then dies without a report: the error carries its exit status,
    which only a blocking wait can read (the pipe's EOF comes before the exit)."""

    def dies_late(ns_fd: int, wfd: int, *rest: object) -> None:
        os.close(wfd)
        time.sleep(0.3)
        os._exit(3)

    monkeypatch.setattr(devnodes, "_child", dies_late)
    pid = os.getpid()
    out = devnodes._in_namespace(pid, Path("/proc"), None, (), ())
    why = "the helper in the container's namespace exited without a report (wait status 768)"
    assert out.error == (f"/proc/{pid}/ns/mnt", "", why)


def test_a_rootfs_that_cannot_be_statted_is_named_with_its_strerror(tmp_path: Path) -> None:
    """Issue 24 (fresh mutant s530669-140, ``strerror and str(exc)``): the line names the path and
    the error once (``No such file or directory``), not Python's ``[Errno 2] ...: '<path>'``."""
    missing = tmp_path / "no-rootfs"
    with pytest.raises(ApplyError) as info:
        devnodes._in_namespace(os.getpid(), Path("/proc"), str(missing), (), ())
    assert (info.value.file, info.value.field, info.value.reason) == (
        str(missing),
        "stat",
        "No such file or directory",
    )


def test_undo_removes_every_directory_it_made_however_deep(
    tmp_path: Path, spawn: Callable[[str], int]
) -> None:
    """Issue 31 (s142737-130): a node two directories below /dev (``/dev/dri/by-path/...`` has that
    shape) makes both directories; the undo removes each one where it is, leaving the container's
    /dev as it found it."""
    root = make_rootfs(tmp_path)
    pid = spawn(unpivoted(root))
    deep = Node(path="/dev/odh-a/odh-b/nvidia-cap2", type="c", major=237, minor=2, file_mode=0o444)
    undo = devnodes.apply(pid, [deep], [], rootfs=str(root))
    assert stat.S_ISCHR(os.lstat(in_ns(pid, root, deep.path)).st_mode)
    undo.run()
    assert sorted(os.listdir(in_ns(pid, root, "/dev"))) == []
