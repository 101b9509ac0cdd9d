"""Host node fill-in by lstat under a driver root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits
from hook.sources.cdi.hostnodes import fill

FIELD = "devices[0].containerEdits.deviceNodes[0]"


def _root_with_node(tmp_path: Path, name: str, mode: int, rdev: int = 0) -> Path:
    (tmp_path / "dev").mkdir(exist_ok=True)
    try:
        os.mknod(tmp_path / "dev" / name, mode, rdev)
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    os.chmod(tmp_path / "dev" / name, stat.S_IMODE(mode))
    return tmp_path


def _one(node: CdiDeviceNode, root: Path) -> CdiDeviceNode:
    return fill(ContainerEdits(device_nodes=(node,)), root).device_nodes[0]


def test_char_node_filled(tmp_path: Path) -> None:
    root = _root_with_node(tmp_path, "null", stat.S_IFCHR | 0o640, os.makedev(1, 3))
    got = _one(CdiDeviceNode(path="/dev/null"), root)
    assert (got.type, got.major, got.minor, got.file_mode) == ("c", 1, 3, 0o640)


def test_host_path_used(tmp_path: Path) -> None:
    root = _root_with_node(tmp_path, "sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))
    got = _one(CdiDeviceNode(path="/dev/disk", host_path="/dev/sda"), root)
    assert (got.path, got.type, got.major, got.minor) == ("/dev/disk", "b", 8, 0)


def test_spec_values_kept(tmp_path: Path) -> None:
    root = _root_with_node(tmp_path, "x", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    got = _one(CdiDeviceNode(path="/dev/x", type="c", major=9, minor=9, file_mode=0o600), root)
    assert (got.major, got.minor, got.file_mode) == (9, 9, 0o600)


def test_minimal_node_needs_no_host_node(tmp_path: Path) -> None:
    node = CdiDeviceNode(path="/dev/absent", type="c", major=195, minor=0)
    assert _one(node, tmp_path) == node


def test_missing_host_node_names_spec_and_field(tmp_path: Path) -> None:
    node = CdiDeviceNode(path="/dev/nvidia9", source="/etc/cdi/nvidia.yaml", field=FIELD)
    with pytest.raises(InputError) as info:
        _one(node, tmp_path)
    assert (info.value.file, info.value.field) == ("/etc/cdi/nvidia.yaml", f"{FIELD}.path")
    node = CdiDeviceNode(path="/dev/a", host_path="/dev/b", source="s.yaml", field=FIELD)
    with pytest.raises(InputError) as info:
        _one(node, tmp_path)
    assert info.value.field == f"{FIELD}.hostPath"


def test_symlink_not_followed(tmp_path: Path) -> None:
    root = _root_with_node(tmp_path, "real", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.symlink("real", root / "dev" / "link")
    with pytest.raises(InputError, match="not a device node"):
        _one(CdiDeviceNode(path="/dev/link", source="s", field=FIELD), root)


def test_type_mismatch(tmp_path: Path) -> None:
    root = _root_with_node(tmp_path, "x", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(InputError) as info:
        _one(CdiDeviceNode(path="/dev/x", type="b", source="s", field=FIELD), root)
    assert info.value.field == f"{FIELD}.type"


def test_fifo(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    os.mkfifo(tmp_path / "dev" / "f", 0o600)
    got = _one(CdiDeviceNode(path="/dev/f"), tmp_path)
    assert (got.type, got.major, got.file_mode) == ("p", None, 0o600)
