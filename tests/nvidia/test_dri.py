"""DRM nodes by PCI bus id: sysfs's ``class/drm/<name>`` ties numbers to an address; only real
char nodes under /dev/dri count, never through a symlink, whatever their name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.sources.nvidia.dri import dri_nodes, drm_devices, pci_vendor

BUS = "0000:2a:00.0"


def _drm(root: Path, bus: str, entries: dict[str, int], vendor: str = "0x10de") -> None:
    """sysfs as the kernel lays it out: ``class/drm/<name>/{dev,device}``, the device's ``vendor``."""
    device = root / "sys/devices/pci0000:00" / bus
    device.mkdir(parents=True, exist_ok=True)
    (device / "vendor").write_text(vendor + "\n")
    for name, minor in entries.items():
        entry = root / "sys/class/drm" / name
        entry.mkdir(parents=True)
        (entry / "dev").write_text(f"226:{minor}\n")
        (entry / "device").symlink_to(f"../../../devices/pci0000:00/{bus}")


def _node(root: Path, name: str, minor: int) -> None:
    dri = root / "dev/dri"
    dri.mkdir(parents=True, exist_ok=True)
    os.mknod(dri / name, stat.S_IFCHR | 0o660, os.makedev(226, minor))
    os.chmod(dri / name, 0o660)  # whatever the umask


def test_card_and_render_nodes_of_the_bus_only(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, {"card2": 2, "renderD129": 129})
    _drm(tmp_path, "0000:18:00.0", {"card1": 1})
    (tmp_path / "sys/class/drm/card2-DP-1").mkdir()  # a connector: no dev file, no device
    (tmp_path / "sys/class/drm/version").write_text("drm 1.1.0 20060810\n")
    for name, minor in (("card2", 2), ("renderD129", 129), ("card1", 1)):
        _node(tmp_path, name, minor)
    nodes = dri_nodes(tmp_path, [BUS])
    assert [(n.path, n.major, n.minor, n.file_mode) for n in nodes] == [
        ("/dev/dri/card2", 226, 2, 0o660),
        ("/dev/dri/renderD129", 226, 129, 0o660),
    ]


def test_the_numbers_decide_not_the_name_in_dev(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, {"card2": 2})
    _node(tmp_path, "card1", 2)  # /dev's name for sysfs's card2
    assert [(n.path, n.minor) for n in dri_nodes(tmp_path, [BUS])] == [("/dev/dri/card1", 2)]


def test_not_a_char_node_or_a_symlink_is_skipped(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, {"card2": 2, "renderD129": 129})
    dri = tmp_path / "dev/dri"
    dri.mkdir(parents=True)
    (dri / "card2").write_text("")  # a regular file
    os.symlink("/dev/null", dri / "renderD129")  # lstat: a link, never followed
    assert dri_nodes(tmp_path, [BUS]) == ()


def test_no_drm_dir_and_odd_bus_ids(tmp_path: Path) -> None:
    assert dri_nodes(tmp_path, [BUS]) == ()
    assert dri_nodes(tmp_path, ["../../etc", "0000:2A:00.0"]) == ()


def test_each_drm_node_names_its_address_and_vendor(tmp_path: Path) -> None:
    _drm(tmp_path, BUS, {"card1": 1})
    _drm(tmp_path, "0000:03:00.0", {"card0": 0}, vendor="0x1a03")
    entry = tmp_path / "sys/class/drm/card9"
    entry.mkdir()
    (entry / "dev").write_text("226:9\n")
    (entry / "device").symlink_to("../../../devices/pci0000:00/not-a-bus")
    assert drm_devices(tmp_path) == {("c", 226, 0): ("0000:03:00.0", "card0"), ("c", 226, 1): (BUS, "card1")}
    assert (pci_vendor(tmp_path, "card0"), pci_vendor(tmp_path, "card1")) == ("0x1a03", "0x10de")
    assert pci_vendor(tmp_path, "card9") == ""  # its device link leads nowhere
