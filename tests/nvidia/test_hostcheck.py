"""Host node verification (hook.sources.nvidia.hostcheck)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources.nvidia.hostcheck import verify_host_node


def _node(path: Path, major: int, minor: int) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


def test_matching_node_is_accepted(tmp_path: Path) -> None:
    st = verify_host_node(_node(tmp_path / "nvidia0", 195, 0), 195, 0)
    assert stat.S_ISCHR(st.st_mode)


@pytest.mark.parametrize(("major", "minor"), [(195, 1), (237, 0)], ids=["other minor", "other major"])
def test_other_device_number_is_refused(tmp_path: Path, major: int, minor: int) -> None:
    path = _node(tmp_path / "nvidia0", major, minor)
    with pytest.raises(InputError) as info:
        verify_host_node(path, 195, 0)
    assert info.value.file == str(path) and info.value.field == "st_rdev"
    assert f"{major}:{minor}" in info.value.reason


def test_symlink_is_refused(tmp_path: Path) -> None:
    target = _node(tmp_path / "real", 195, 0)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(InputError) as info:
        verify_host_node(tmp_path / "link", 195, 0)
    assert info.value.field == "type"


def test_regular_file_and_missing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="not a character device"):
        verify_host_node(tmp_path / "f", 195, 0)
    with pytest.raises(InputError) as info:
        verify_host_node(tmp_path / "absent", 195, 0)
    assert info.value.file == str(tmp_path / "absent") and "not found" in info.value.reason


def test_unstatable_path_is_an_input_error(tmp_path: Path) -> None:
    """Not only a missing node: any ``lstat`` error (here ENOTDIR) is one line naming the path."""
    (tmp_path / "dev").write_text("")
    with pytest.raises(InputError) as info:
        verify_host_node(tmp_path / "dev/nvidia0", 195, 0)
    assert info.value.file == str(tmp_path / "dev/nvidia0")
    assert info.value.reason == "cannot stat: Not a directory"
