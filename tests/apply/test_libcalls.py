"""libcalls: ``setns`` and ``openat2`` through ``_ctypes`` alone, read back by what the kernel did.

The ``open_how`` fields are checked by their effect: the flags by the fd's kind, each ``resolve``
bit by the refusal it alone causes (a symlink, ``..`` out of the directory, another mount), so a
field packed in the wrong slot or the wrong width fails here. Errors come back with the kernel's
errno, and ``openat2``'s with the name, as the old ``ctypes`` calls reported them.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hook.adapters.apply import devpath, libcalls

DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NO_SYMLINKS = devpath.RESOLVE_NO_SYMLINKS
BENEATH = devpath.RESOLVE_BENEATH
NO_XDEV = devpath.RESOLVE_NO_XDEV


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("sub")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_openat2_opens_the_directory_below_with_the_flags_given(tree: int, tmp_path: Path) -> None:
    fd = libcalls.openat2(tree, "sub", DIR_FLAGS, NO_SYMLINKS | BENEATH)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "sub"))
        flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        assert flags & os.O_PATH and flags & os.O_CLOEXEC  # the flags field, read back by the kernel
    finally:
        os.close(fd)


def test_each_resolve_bit_refuses_what_it_names(tree: int) -> None:
    assert os.path.isdir(f"/proc/self/fd/{tree}/link")  # the symlink resolves without the bit...
    with pytest.raises(OSError) as info:
        libcalls.openat2(tree, "link", DIR_FLAGS & ~os.O_NOFOLLOW, NO_SYMLINKS)
    assert info.value.errno == errno.ELOOP and info.value.filename == "link"
    fd = libcalls.openat2(tree, "sub/..", DIR_FLAGS, 0)  # ... and ".." leaves only with BENEATH unset
    os.close(fd)
    with pytest.raises(OSError) as info:
        libcalls.openat2(tree, "sub/../..", DIR_FLAGS, BENEATH)
    assert info.value.errno == errno.EXDEV


def test_no_xdev_refuses_another_mount() -> None:
    root = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        if os.stat("/proc").st_dev == os.fstat(root).st_dev:
            pytest.fail("/proc is expected to be its own mount")
        fd = libcalls.openat2(root, "proc", DIR_FLAGS, 0)
        os.close(fd)
        with pytest.raises(OSError) as info:
            libcalls.openat2(root, "proc", DIR_FLAGS, NO_XDEV)
        assert info.value.errno == errno.EXDEV and info.value.filename == "proc"
    finally:
        os.close(root)


def test_openat2_reports_the_kernels_errno(tree: int) -> None:
    with pytest.raises(FileNotFoundError) as info:
        libcalls.openat2(tree, "absent", DIR_FLAGS, NO_SYMLINKS)
    assert info.value.filename == "absent" and info.value.strerror == os.strerror(errno.ENOENT)


def test_setns_refuses_what_is_not_a_namespace(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            libcalls.setns(fd, 0x00020000)
        assert info.value.errno == errno.EINVAL
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="joining a mount namespace needs CAP_SYS_ADMIN")
def test_setns_joins_the_mount_namespace(tmp_path: Path) -> None:
    """A child joins a namespace ``unshare -m`` made, and sees the tmpfs mounted only there."""
    mark = tmp_path / "mnt"
    mark.mkdir()
    ns = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none {mark} && touch {mark}/inside && echo ready && read x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert ns.stdout is not None and ns.stdout.readline() == "ready\n"
        code = (
            "import os, sys; from hook.adapters.apply import libcalls;"
            f"fd = os.open('/proc/{ns.pid}/ns/mnt', os.O_RDONLY);"
            "libcalls.setns(fd, 0x00020000);"
            f"sys.exit(0 if os.path.exists('{mark}/inside') else 3)"
        )
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
        assert not (mark / "inside").exists()  # the host never saw it
    finally:
        ns.communicate("\n")


def test_the_module_loads_no_ctypes_package() -> None:
    code = "import sys, hook.adapters.apply.libcalls; print(sorted(m for m in sys.modules if 'ctypes' in m))"
    got = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert got.stdout.split() == ["['_ctypes']"], got.stderr


def test_unshare_reports_the_kernels_refusal() -> None:
    with pytest.raises(OSError) as info:
        libcalls.unshare(-1)  # no such flags
    assert info.value.errno == errno.EINVAL
