"""Fake NVIDIA host trees for tests, examples and live tests: ``make_host_tree(root, topology)``.

Rule: the tree is what a real driver shows under a driver root (procfs files and /dev nodes),
for the named topology; dynamic majors are deliberately not the "usual" numbers so that code
which assumes them fails. With ``mknod=True`` (root only) /dev entries are real character
nodes; with ``mknod=False`` they are plain files (pyfakefs cannot make device nodes).

Topologies: ``1x`` (one H100, MIG off), ``8x`` (8 x H100, MIG off), ``8x-mig`` (seed 000: 8 x H100,
MIG on card 0 only, with a 3g.40gb at GI 1 and a 2g.20gb at GI 2, CI 0 each), ``4x-k8s`` (4 x H100,
index != minor, the Kubernetes live tests' node), ``8x-shuffled``
(what real machines look like and the other fixtures do not: device minors follow the driver's
probe order while indices follow PCI order, so no GPU's index equals its minor; the
``nvidia``, ``nvidia-caps`` and ``nvidia-uvm`` majors are 507, 511 and 509; MIG is on index 2,
minor 6, with a 3g.40gb at GI 1 and a 1g.10gb at GI 5). Code that writes ``/dev/nvidia<index>``,
``195:`` or ``gpu0`` anywhere gets the wrong card on this topology. ``8x-hgx`` is an HGX board
(MIG on card 0, a 3g.40gb at GI 1): each GPU's DRM nodes ``card<index+1>`` and
``renderD<128+index>`` tied to its PCI address in ``sys/class/drm``, the BMC's ``card0`` on a
PCI address no GPU has, four IMEX channels, four NVSwitches with ``nvidia-nvswitchctl``, the
NVLink node and the fabric-mgmt cap (``nvidia-cap0``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "SHUFFLED_MINORS",
    "TOPOLOGIES",
    "GpuSpec",
    "HostSpec",
    "MigSpec",
    "cap_minor",
    "make_host_tree",
    "mig_minors_text",
]

UVM_MAJOR: Final = 511
CAPS_MAJOR: Final = 237
IMEX_MAJOR: Final = 234
DRIVER_VERSION: Final = "550.54.15"
BOOT_ID: Final = "5d1c2f6e-8a3b-4c7d-9e0f-1a2b3c4d5e6f"
CONFIG_MODE: Final = 0o400
READ_MODE: Final = 0o444
NVIDIA_MAJOR: Final = 195
NVLINK_MAJOR: Final = 236
NVSWITCH_MAJOR: Final = 238
DRM_MAJOR: Final = 226
BMC_BUS: Final = "0000:03:00.0"  # the board's BMC VGA (ASPEED): a DRM node of no NVIDIA GPU
ASPEED: Final = "0x1a03"  # PCI vendor ids
NVIDIA_PCI: Final = "0x10de"
IMEX_CHANNELS: Final = 4
NVSWITCHES: Final = 4
FABRIC_MGMT_MINOR: Final = 0  # nv-caps.c: the nvlink table is numbered first


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    index: int
    minor: int
    bus: str  # 0000:18:00.0 form
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MigSpec:
    parent_minor: int
    gi: int
    ci: int
    uuid: str
    profile: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    migs: tuple[MigSpec, ...] = ()
    driver_version: str = DRIVER_VERSION
    boot_id: str = BOOT_ID
    nvidia_major: int = NVIDIA_MAJOR
    uvm_major: int = UVM_MAJOR
    caps_major: int = CAPS_MAJOR
    imex_major: int | None = IMEX_MAJOR
    fabric: bool = False  # an HGX board: DRM nodes, IMEX channels, NVSwitches, NVLink (``_fabric``)


_BUSES: Final = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_UUIDS: Final = (
    "GPU-3f2b9c41-7d0e-4a6b-8c15-2e9f0a7b6d34",
    "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23",
    "GPU-5c7e1d92-0b4a-4f3e-a6d8-91c2b7e4f058",
    "GPU-8e0a4b37-6c2f-4d19-b5e7-3f1a9c8d2e60",
    "GPU-1b9d6f03-2e8c-47a5-9f4b-c6e0d3a7b812",
    "GPU-d4a2e8c6-9f1b-4e37-8a50-7c3e2b1f9d45",
    "GPU-6f3c0a59-4b7d-4c2e-91a8-e5d7f2b0c376",
    "GPU-c08e5b14-7a2d-4f69-b3c1-0d9e6a4f8b27",
)


# index -> device minor on 8x-shuffled: no card has index == minor.
SHUFFLED_MINORS: Final = (3, 0, 6, 1, 7, 2, 5, 4)


def _gpus(
    count: int, mig_on: frozenset[int] = frozenset(), minors: tuple[int, ...] | None = None
) -> tuple[GpuSpec, ...]:
    """GPUs in index (= PCI bus) order; ``mig_on`` holds minors."""
    minor_of = minors or tuple(range(count))
    return tuple(
        GpuSpec(
            index=i,
            minor=minor_of[i],
            bus=f"0000:{_BUSES[i]}:00.0",
            uuid=_UUIDS[i],
            mig_enabled=minor_of[i] in mig_on,
        )
        for i in range(count)
    )


# The Kubernetes live tests' node: NVML index (bus order) is not the minor (index 2 is /dev/nvidia3).
K8S_MINORS: Final = (2, 0, 3, 1)

TOPOLOGIES: Final[dict[str, HostSpec]] = {
    "1x": HostSpec(name="1x", gpus=_gpus(1), imex_major=None),
    "4x-k8s": HostSpec(
        name="4x-k8s",
        gpus=tuple(
            GpuSpec(index=i, minor=m, bus=f"0000:{_BUSES[i]}:00.0", uuid=_UUIDS[i])
            for i, m in enumerate(K8S_MINORS)
        ),
    ),
    "8x": HostSpec(name="8x", gpus=_gpus(8)),
    "8x-mig": HostSpec(
        name="8x-mig",
        gpus=_gpus(8, frozenset({0})),  # index == minor here
        migs=(
            MigSpec(
                parent_minor=0, gi=1, ci=0, uuid="MIG-07ad8e7c-0197-5973-bd05-7fcd18ae754e", profile="3g.40gb"
            ),
            MigSpec(
                parent_minor=0, gi=2, ci=0, uuid="MIG-90825510-8f47-5052-8e15-ead851500769", profile="2g.20gb"
            ),
        ),
    ),
    "8x-hgx": HostSpec(
        name="8x-hgx",
        gpus=_gpus(8, frozenset({0})),
        migs=(
            MigSpec(
                parent_minor=0, gi=1, ci=0, uuid="MIG-07ad8e7c-0197-5973-bd05-7fcd18ae754e", profile="3g.40gb"
            ),
        ),
        fabric=True,
    ),
    "8x-shuffled": HostSpec(
        name="8x-shuffled",
        gpus=_gpus(8, frozenset({6}), SHUFFLED_MINORS),
        migs=(
            MigSpec(
                parent_minor=6, gi=1, ci=0, uuid="MIG-4b1e2c3d-5a6f-5b7c-8d9e-0f1a2b3c4d5e", profile="3g.40gb"
            ),
            MigSpec(
                parent_minor=6, gi=5, ci=0, uuid="MIG-c3d4e5f6-0718-5293-a4b5-c6d7e8f90a1b", profile="1g.10gb"
            ),
        ),
        nvidia_major=507,
        uvm_major=509,
        caps_major=511,
        imex_major=505,
    ),
}


def cap_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """The driver's mig-minors layout: ``gpuG/giI/access`` = 3 + 135*G + 9*I, its ``ciC`` + 1 + C."""
    base = 3 + 135 * gpu + 9 * gi
    return base if ci is None else base + 1 + ci


def mig_minors_text() -> str:
    """The full listing the driver prints: config, monitor and every GI/CI of 32 GPUs."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi)}")
            lines.extend(f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}" for ci in range(8))
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc_devices(spec: HostSpec) -> str:
    chars = [
        "1 mem",
        "4 /dev/vc/0",
        "4 tty",
        "5 /dev/tty",
        "10 misc",
        f"{spec.nvidia_major} nvidia",
        "226 drm",
    ]
    chars += [
        f"{spec.caps_major} nvidia-caps",
        f"{spec.uvm_major} nvidia-uvm",
        f"{NVLINK_MAJOR} nvidia-nvlink",
    ]
    if spec.fabric:  # as the driver registers them: 195 carries three names
        chars += [f"{spec.nvidia_major} nvidia-modeset", f"{spec.nvidia_major} nvidiactl"]
        chars.append(f"{NVSWITCH_MAJOR} nvidia-nvswitch")
    if spec.imex_major is not None:
        chars.append(f"{spec.imex_major} nvidia-caps-imex-channels")
    chars.sort(key=lambda line: int(line.split()[0]))
    blocks = ["7 loop", "8 sd", "9 md", "253 device-mapper", "254 mdp", "259 blkext"]
    return "Character devices:\n" + _columns(chars) + "\nBlock devices:\n" + _columns(blocks)


def _columns(lines: list[str]) -> str:
    return "".join(f"{int(line.split()[0]):>3} {line.split(maxsplit=1)[1]}\n" for line in lines)


def _information(gpu: GpuSpec) -> str:
    rows = [
        ("Model", gpu.name),
        ("IRQ", str(24 + gpu.minor)),
        ("GPU UUID", gpu.uuid),
        ("Video BIOS", "96.00.74.00.0d"),
        ("Bus Type", "PCIe"),
        ("DMA Size", "52 bits"),
        ("DMA Mask", "0xfffffffffffff"),
        ("Bus Location", gpu.bus),
        ("Device Minor", str(gpu.minor)),
        ("GPU Firmware", DRIVER_VERSION),
        ("GPU Excluded", "No"),
    ]
    return "".join(f"{k}:\t\t {v}\n" for k, v in rows)


def _cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _caps(spec: HostSpec) -> list[tuple[str, int, int]]:
    """(capability proc path relative to capabilities/, minor, mode) for every existing cap."""
    caps = [("mig/config", 1, CONFIG_MODE), ("mig/monitor", 2, READ_MODE)]
    for mig in spec.migs:
        gi_dir = f"gpu{mig.parent_minor}/mig/gi{mig.gi}"
        caps.append((f"{gi_dir}/access", cap_minor(mig.parent_minor, mig.gi), READ_MODE))
        caps.append((f"{gi_dir}/ci{mig.ci}/access", cap_minor(mig.parent_minor, mig.gi, mig.ci), READ_MODE))
    return sorted(set(caps))


def _node(path: Path, major: int, minor: int, mode: int, mknod: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if mknod:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    else:
        path.write_text(f"c {major}:{minor}\n")
    os.chmod(path, mode)


def _dev(root: Path, spec: HostSpec, mknod: bool) -> None:
    dev = root / "dev"
    for gpu in spec.gpus:
        _node(dev / f"nvidia{gpu.minor}", spec.nvidia_major, gpu.minor, 0o666, mknod)
    _node(dev / "nvidiactl", spec.nvidia_major, 255, 0o666, mknod)
    _node(dev / "nvidia-modeset", spec.nvidia_major, 254, 0o666, mknod)
    _node(dev / "nvidia-uvm", spec.uvm_major, 0, 0o666, mknod)
    _node(dev / "nvidia-uvm-tools", spec.uvm_major, 1, 0o666, mknod)
    for _path, minor, mode in _caps(spec):
        _node(dev / "nvidia-caps" / f"nvidia-cap{minor}", spec.caps_major, minor, mode, mknod)


def drm_card(gpu: GpuSpec) -> int:
    """The fabric topology's DRM minors: card<index+1> (card0 is the BMC), renderD<128+index>."""
    return gpu.index + 1


def drm_render(gpu: GpuSpec) -> int:
    return 128 + gpu.index


def _fabric(root: Path, spec: HostSpec, mknod: bool) -> None:
    """An HGX board: DRM nodes per GPU plus the BMC's card0 (sysfs ties each to its PCI address),
    IMEX channels, NVSwitches and their control node, the NVLink node, the fabric-mgmt cap."""
    dev, drm = root / "dev", root / "sys/class/drm"
    cards = [("card0", 0, BMC_BUS)]
    for gpu in spec.gpus:
        cards += [
            (f"card{drm_card(gpu)}", drm_card(gpu), gpu.bus),
            (f"renderD{drm_render(gpu)}", drm_render(gpu), gpu.bus),
        ]
    for name, minor, bus in cards:
        _node(dev / "dri" / name, DRM_MAJOR, minor, 0o660, mknod)
        _write(drm / name / "dev", f"{DRM_MAJOR}:{minor}\n")
        (drm / name / "device").symlink_to(f"../../../devices/pci0000:00/{bus}")  # sysfs's own shape
        vendor = ASPEED if bus == BMC_BUS else NVIDIA_PCI
        _write(root / "sys/devices/pci0000:00" / bus / "vendor", vendor + "\n")
    _write(drm / "version", "drm 1.1.0 20060810\n")
    assert spec.imex_major is not None
    for channel in range(IMEX_CHANNELS):
        _node(dev / "nvidia-caps-imex-channels" / f"channel{channel}", spec.imex_major, channel, 0o666, mknod)
    for n in range(NVSWITCHES):
        _node(dev / f"nvidia-nvswitch{n}", NVSWITCH_MAJOR, n, 0o666, mknod)
    _node(dev / "nvidia-nvswitchctl", NVSWITCH_MAJOR, 255, 0o666, mknod)
    _node(dev / "nvidia-nvlink", NVLINK_MAJOR, 0, 0o666, mknod)
    _node(
        dev / "nvidia-caps" / f"nvidia-cap{FABRIC_MGMT_MINOR}",
        spec.caps_major,
        FABRIC_MGMT_MINOR,
        0o400,
        mknod,
    )
    _write(root / "proc/driver/nvidia-caps/nvlink-minors", f"fabric-mgmt {FABRIC_MGMT_MINOR}\n")


def make_host_tree(root: Path, topology: str, *, mknod: bool = True) -> HostSpec:
    """Write the topology's procfs files and /dev nodes under ``root``; return its spec."""
    spec = TOPOLOGIES[topology]
    proc = root / "proc"
    _write(proc / "devices", _proc_devices(spec))
    _write(proc / "sys/kernel/random/boot_id", spec.boot_id + "\n")
    _write(
        proc / "driver/nvidia/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {spec.driver_version}  "
        "Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    )
    for gpu in spec.gpus:
        _write(proc / "driver/nvidia/gpus" / gpu.bus / "information", _information(gpu))
    _write(proc / "driver/nvidia-caps/mig-minors", mig_minors_text())
    for rel, minor, mode in _caps(spec):
        _write(proc / "driver/nvidia/capabilities" / rel, _cap_file(minor, mode))
    _dev(root, spec, mknod)
    if spec.fabric:
        _fabric(root, spec, mknod)
    return spec
