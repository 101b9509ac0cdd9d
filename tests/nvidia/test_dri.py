"""DRM nodes by PCI bus id: only real char nodes named card*/renderD*, never through a symlink."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.sources.nvidia.dri import dri_nodes

BUS = "0000:2a:00.0"


def _drm(root: Path, bus: str, names: list[str]) -> None:
    (root / "sys/bus/pci/devices" / bus / "drm").mkdir(parents=True)
    for name in names:
        (root / "sys/bus/pci/devices" / bus / "drm" / name).mkdir()


def test_card_and_render_nodes_of_the_bus_only(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, ["card2", "renderD129", "controlD64", "version"])
    _drm(tmp_path, "0000:18:00.0", ["card1"])
    dri = tmp_path / "dev/dri"
    dri.mkdir(parents=True)
    for name, minor in (("card2", 2), ("renderD129", 129), ("card1", 1)):
        os.mknod(dri / name, stat.S_IFCHR | 0o660, os.makedev(226, minor))
        os.chmod(dri / name, 0o660)  # whatever the umask
    nodes = dri_nodes(tmp_path, [BUS])
    assert [(n.path, n.major, n.minor, n.file_mode) for n in nodes] == [
        ("/dev/dri/card2", 226, 2, 0o660),
        ("/dev/dri/renderD129", 226, 129, 0o660),
    ]


def test_not_a_char_node_or_a_symlink_is_skipped(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, ["card2", "renderD129"])
    dri = tmp_path / "dev/dri"
    dri.mkdir(parents=True)
    (dri / "card2").write_text("")  # a regular file
    os.symlink("/dev/null", dri / "renderD129")  # lstat: a link, never followed
    assert dri_nodes(tmp_path, [BUS]) == ()


def test_no_drm_dir_and_odd_bus_ids(tmp_path: Path) -> None:
    assert dri_nodes(tmp_path, [BUS]) == ()
    assert dri_nodes(tmp_path, ["../../etc", "0000:2A:00.0"]) == ()
