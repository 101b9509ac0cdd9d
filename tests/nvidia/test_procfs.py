"""procfs parsers and readers (hook.sources.nvidia.procfs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hook.core.errors import InputError
from hook.sources.nvidia import procfs
from hook.sources.nvidia.model import CapNode, Majors

DEVICES = """Character devices:
  1 mem
195 nvidia
237 nvidia-caps
234 nvidia-caps-imex-channels
236 nvidia-nvlink
508 nvidia-uvm

Block devices:
  8 sd
254 nvidia-uvm
"""


def test_proc_devices_character_section_exact_names() -> None:
    assert procfs.parse_proc_devices(DEVICES) == Majors(nvidia=195, uvm=508, caps=237, imex=234)


def test_proc_devices_block_section_is_ignored() -> None:
    text = "Character devices:\n195 nvidia\n\nBlock devices:\n238 nvidia-caps\n507 nvidia-uvm\n"
    assert procfs.parse_proc_devices(text) == Majors(nvidia=195)


def test_proc_devices_older_frontend_name() -> None:
    assert procfs.parse_proc_devices("Character devices:\n195 nvidia-frontend\n509 nvidia-uvm\n").uvm == 509
    text = "Character devices:\n196 nvidia-frontend\n\n"
    assert procfs.parse_proc_devices(text).nvidia == 196


def test_proc_devices_frontend_never_overrides_nvidia() -> None:
    text = "Character devices:\n195 nvidia\n196 nvidia-frontend\n"
    assert procfs.parse_proc_devices(text).nvidia == 195


def test_proc_devices_prefix_names_do_not_match() -> None:
    text = "Character devices:\n240 nvidia-uvm-extra\n241 nvidia-caps-imex-channels\n242 xnvidia-caps\n"
    assert procfs.parse_proc_devices(text) == Majors(imex=241)


def test_proc_devices_bad_major() -> None:
    with pytest.raises(InputError) as info:
        procfs.parse_proc_devices("Character devices:\nabc nvidia-uvm\n", "/h/proc/devices")
    assert (info.value.file, info.value.field) == ("/h/proc/devices", "nvidia-uvm")


def test_cap_file_fields() -> None:
    text = (
        "DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 1\nDeviceFileUID: 7\nDeviceFileGID: 44\n"
    )
    assert procfs.parse_cap_file(text, "f") == CapNode(minor=13, mode=0o444, uid=7, gid=44)
    assert procfs.parse_cap_file("DeviceFileMinor: 1\nDeviceFileMode: 256\n", "f") == CapNode(
        minor=1, mode=0o400
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("DeviceFileMode: 256\n", "DeviceFileMinor"),
        ("DeviceFileMinor: 1\nDeviceFileMode: rw\n", "DeviceFileMode"),
    ],
    ids=["no minor", "bad mode"],
)
def test_cap_file_errors(text: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        procfs.parse_cap_file(text, "/proc/cap")
    assert (info.value.file, info.value.field) == ("/proc/cap", field)


INFO = (
    "Model:\t\t NVIDIA H100 80GB HBM3\nGPU UUID:\t\t GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23\n"
    "Bus Location:\t\t 0000:2A:00.0\nDevice Minor:\t\t 1\n"
)


def test_gpu_information() -> None:
    info = procfs.parse_gpu_information(INFO, "i", "0000:2a:00.0")
    assert info == procfs.GpuInfo(
        pci_bus_id="0000:2a:00.0",
        minor=1,
        uuid="GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23",
        model="NVIDIA H100 80GB HBM3",
    )


def test_gpu_information_hidden_uuid_and_dir_bus() -> None:
    info = procfs.parse_gpu_information("GPU UUID: ??\nDevice Minor: 4\n", "i", "0000:9a:00.0")
    assert info.uuid is None and info.pci_bus_id == "0000:9a:00.0" and info.minor == 4


@pytest.mark.parametrize(
    ("text", "field"),
    [("GPU UUID: GPU-x\n", "Device Minor"), ("Device Minor: 0\nBus Location: zz\n", "Bus Location")],
    ids=["no minor", "bad bus"],
)
def test_gpu_information_errors(text: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        procfs.parse_gpu_information(text, "/p/information", "0000:18:00.0")
    assert (info.value.file, info.value.field) == ("/p/information", field)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
            "535.104.05",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n", "550.54.15"),
    ],
    ids=["proprietary", "open"],
)
def test_driver_version(text: str, version: str) -> None:
    assert procfs.parse_driver_version(text) == version


def test_driver_version_missing() -> None:
    with pytest.raises(InputError) as info:
        procfs.parse_driver_version("GCC version: 12\n", "/v")
    assert (info.value.file, info.value.field) == ("/v", "NVRM version")


def test_readers_on_8x_mig(fake_host) -> None:
    root, spec = fake_host("8x-mig")
    assert procfs.read_majors(root) == Majors(nvidia=195, uvm=511, caps=237, imex=234)
    assert procfs.read_driver_version(root) == "550.54.15"
    assert procfs.read_boot_id(root) == spec.boot_id
    assert procfs.list_gpu_bus_ids(root) == tuple(g.bus for g in spec.gpus)
    infos = procfs.read_gpu_infos(root)
    assert infos is not None and [(i.minor, i.uuid) for i in infos] == [(g.minor, g.uuid) for g in spec.gpus]
    table, warnings = procfs.read_cap_table(root)
    assert warnings == ()
    assert table.config == CapNode(minor=1, mode=0o400) and table.monitor == CapNode(minor=2, mode=0o444)
    assert dict(table.gi) == {(0, 1): CapNode(minor=12), (0, 2): CapNode(minor=21)}
    assert dict(table.ci) == {(0, 1, 0): CapNode(minor=13), (0, 2, 0): CapNode(minor=22)}


def test_missing_required_file_names_it(fs) -> None:
    with pytest.raises(InputError) as info:
        procfs.read_majors(Path("/nowhere"))
    assert info.value.file == "/nowhere/proc/devices" and "not found" in info.value.reason


def test_optional_files_absent(fs) -> None:
    root = Path("/empty")
    root.mkdir()
    assert procfs.read_driver_version(root) is None
    assert procfs.read_boot_id(root) is None
    assert procfs.list_gpu_bus_ids(root) is None and procfs.read_gpu_infos(root) is None
    assert procfs.read_mig_minors(root) is None
    assert procfs.read_cap_table(root) == (procfs.CapTable(), ())


def test_missing_information_file_is_an_error(fake_host) -> None:
    root, _ = fake_host("1x")
    (root / "proc/driver/nvidia/gpus/0000:18:00.0/information").unlink()
    with pytest.raises(InputError) as info:
        procfs.read_gpu_infos(root)
    assert info.value.file.endswith("gpus/0000:18:00.0/information")


def test_cap_with_only_a_dev_node_counts(real_host) -> None:
    root, _ = real_host("8x-mig")
    os.unlink(root / "proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access")
    os.chmod(root / "dev/nvidia-caps/nvidia-cap22", 0o440)
    table, _ = procfs.read_cap_table(root)
    assert table.ci[(0, 2, 0)] == CapNode(minor=22, mode=0o440)


def test_cap_with_neither_file_nor_node_is_absent(real_host) -> None:
    root, _ = real_host("8x-mig")
    os.unlink(root / "proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access")
    os.unlink(root / "dev/nvidia-caps/nvidia-cap22")
    table, _ = procfs.read_cap_table(root)
    assert (0, 2, 0) not in table.ci and table.instances() == ((0, 1, 0),)


def test_stray_nodes_in_dev_caps_without_a_number_are_skipped(real_host) -> None:
    """``nvidia-cap`` and ``nvidia-cap-old`` are no cap minors, even as character nodes."""
    root, _ = real_host("8x-mig")
    caps = root / "dev/nvidia-caps"
    for name in ("nvidia-cap", "nvidia-cap-old"):
        os.mknod(caps / name, stat.S_IFCHR | 0o444, os.makedev(511, 99))
    table, _ = procfs.read_cap_table(root)
    assert dict(table.ci) == {(0, 1, 0): CapNode(minor=13), (0, 2, 0): CapNode(minor=22)}


def test_plain_file_in_dev_caps_is_not_a_node(fake_host) -> None:
    root, _ = fake_host("8x-mig")
    os.unlink(root / "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access")
    table, _ = procfs.read_cap_table(root)
    assert (0, 1) not in table.gi
