"""The driver's procfs files under a driver root: majors, capability files, GPU information.

Rule: parsers take text and a ``source`` label and return values or raise ``InputError`` naming
that file and field; the ``read_*`` wrappers are the only I/O. A missing required file is an
``InputError`` naming it; a missing optional one is ``None`` (or empty), never a guess.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from hook.core.errors import InputError
from hook.core.record import record
from hook.sources.nvidia.ids import normalize_bus_id
from hook.sources.nvidia.migminors import (
    CAPS_DEV_DIR,
    CAPS_PROC_DIR,
    MIG_MINORS_PATH,
    MigMinors,
    build_cap_table,
    parse_mig_minors,
    proc_cap_path,
)
from hook.sources.nvidia.model import NVIDIA_MAJOR, CapNode, CapTable, Majors

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "BOOT_ID_PATH",
    "DEVICES_PATH",
    "GPUS_DIR",
    "VERSION_PATH",
    "GpuInfo",
    "list_gpu_bus_ids",
    "parse_cap_file",
    "parse_driver_version",
    "parse_gpu_information",
    "parse_proc_devices",
    "read_boot_id",
    "read_cap_table",
    "read_driver_version",
    "read_gpu_infos",
    "read_majors",
    "read_mig_minors",
    "read_text",
]

DEVICES_PATH: Final = "proc/devices"
VERSION_PATH: Final = "proc/driver/nvidia/version"
GPUS_DIR: Final = "proc/driver/nvidia/gpus"
BOOT_ID_PATH: Final = "proc/sys/kernel/random/boot_id"

# /proc/devices name → Majors field; exact names (NMU requires the whole name).
_MAJOR_NAMES: Final = {
    "nvidia": "nvidia",
    "nvidia-frontend": "nvidia",  # drivers before 550.40
    "nvidia-uvm": "uvm",
    "nvidia-caps": "caps",
    "nvidia-caps-imex-channels": "imex",
}
_VERSION_RE: Final = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


@record
class GpuInfo:
    """One ``gpus/<bus>/information`` file; ``uuid`` is ``None`` when the driver hides it."""

    pci_bus_id: str
    minor: int
    uuid: str | None
    model: str


def parse_proc_devices(text: str, source: str = DEVICES_PATH) -> Majors:
    """Majors from the ``Character devices:`` section only (block majors can collide)."""
    found: dict[str, int] = {}
    in_chars = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            in_chars = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if not in_chars or len(parts) != 2 or parts[1] not in _MAJOR_NAMES:
            continue
        if not parts[0].isdigit():
            raise InputError(source, parts[1], f"major {parts[0]!r} is not a number")
        if parts[1] == "nvidia-frontend" and "nvidia" in found:
            continue
        found[_MAJOR_NAMES[parts[1]]] = int(parts[0])
    return Majors(
        nvidia=found.get("nvidia", NVIDIA_MAJOR),
        uvm=found.get("uvm"),
        caps=found.get("caps"),
        imex=found.get("imex"),
    )


def _key_values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def _int_field(values: dict[str, str], key: str, source: str, *, default: int | None = None) -> int:
    raw = values.get(key)
    if raw is None:
        if default is None:
            raise InputError(source, key, "missing")
        return default
    try:
        return int(raw, 10)
    except ValueError:
        raise InputError(source, key, f"expected an integer, got {raw!r}") from None


def parse_cap_file(text: str, source: str) -> CapNode:
    """A capability file: ``DeviceFileMinor`` (required), ``DeviceFileMode`` (decimal), UID/GID."""
    values = _key_values(text)
    return CapNode(
        minor=_int_field(values, "DeviceFileMinor", source),
        mode=_int_field(values, "DeviceFileMode", source, default=0o444) & 0o777,
        uid=_int_field(values, "DeviceFileUID", source, default=0),
        gid=_int_field(values, "DeviceFileGID", source, default=0),
    )


def parse_gpu_information(text: str, source: str, bus_dir: str) -> GpuInfo:
    """``Device Minor`` is required; ``GPU UUID`` counts only in its ``GPU-…`` form."""
    values = _key_values(text)
    uuid = values.get("GPU UUID", "")
    bus = values.get("Bus Location") or bus_dir
    try:
        pci_bus_id = normalize_bus_id(bus)
    except ValueError as exc:
        raise InputError(source, "Bus Location", str(exc)) from None
    return GpuInfo(
        pci_bus_id=pci_bus_id,
        minor=_int_field(values, "Device Minor", source),
        uuid=uuid if uuid.upper().startswith("GPU-") else None,
        model=values.get("Model", ""),
    )


def parse_driver_version(text: str, source: str = VERSION_PATH) -> str:
    match = _VERSION_RE.search(text)
    if match is None:
        raise InputError(source, "NVRM version", "no kernel module version found")
    return match[1]


def read_text(driver_root: Path, rel: str, *, required: bool) -> str | None:
    """Read ``driver_root/rel``; a missing required file is an ``InputError`` naming it.

    A string path, not ``driver_root / rel``: a 254-GPU host reads ~260 files per start.
    """
    path = os.path.join(driver_root, rel)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        if required:
            raise InputError(path, "", "file not found (is the NVIDIA driver loaded?)") from None
        return None
    except OSError as exc:
        raise InputError(path, "", f"cannot read: {exc.strerror or exc}") from None


def read_majors(driver_root: Path) -> Majors:
    text = read_text(driver_root, DEVICES_PATH, required=True)
    assert text is not None
    return parse_proc_devices(text, str(driver_root / DEVICES_PATH))


def read_driver_version(driver_root: Path) -> str | None:
    text = read_text(driver_root, VERSION_PATH, required=False)
    return None if text is None else parse_driver_version(text, str(driver_root / VERSION_PATH))


def read_boot_id(driver_root: Path) -> str | None:
    text = read_text(driver_root, BOOT_ID_PATH, required=False)
    return text.strip() or None if text is not None else None


def list_gpu_bus_ids(driver_root: Path) -> tuple[str, ...] | None:
    """Directory names under ``gpus/`` as found (sorted); ``None`` if the directory is absent."""
    try:
        return tuple(sorted(entry.name for entry in os.scandir(driver_root / GPUS_DIR) if entry.is_dir()))
    except FileNotFoundError:
        return None


def read_gpu_infos(driver_root: Path) -> tuple[GpuInfo, ...] | None:
    """Every GPU's information file, in PCI bus order; ``None`` if the list is unavailable."""
    bus_dirs = list_gpu_bus_ids(driver_root)
    if bus_dirs is None:
        return None
    from hook.sources import warm

    infos = []
    for bus in bus_dirs:  # the decider keeps each parsed file while its identity holds (hook.sources.warm)
        path = os.path.join(driver_root, GPUS_DIR, bus, "information")
        infos.append(warm.remembered(("gpu-info", path), warm.identity(path), _gpu_info(driver_root, bus)))
    return tuple(sorted(infos, key=lambda i: i.pci_bus_id))


def _gpu_info(driver_root: Path, bus: str) -> Callable[[], GpuInfo]:
    def load() -> GpuInfo:
        rel = f"{GPUS_DIR}/{bus}/information"
        text = read_text(driver_root, rel, required=True)
        assert text is not None
        return parse_gpu_information(text, os.path.join(driver_root, rel), bus)

    return load


def read_mig_minors(driver_root: Path) -> MigMinors | None:
    text = read_text(driver_root, MIG_MINORS_PATH, required=False)
    return None if text is None else parse_mig_minors(text, str(driver_root / MIG_MINORS_PATH))


def _subdirs(path: str, prefix: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return [e.name for e in it if e.name.startswith(prefix) and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _existing_cap_names(caps_dir: Path) -> list[str]:
    """Walk ``capabilities/`` for ``mig/{config,monitor}`` and ``gpuN/mig/giI[/ciC]/access``.

    Plain string paths and ``os.scandir``: one syscall per directory and file, no path objects
    (a 224-instance host has ~500 of them on every container start).
    """
    base = str(caps_dir)
    names = [n for n in ("config", "monitor") if _is_file(f"{base}/mig/{n}")]
    for gpu in _subdirs(base, "gpu"):
        mig = f"{base}/{gpu}/mig"
        for gi in _subdirs(mig, "gi"):
            if _is_file(f"{mig}/{gi}/access"):
                names.append(f"{gpu}/{gi}/access")
            names.extend(
                f"{gpu}/{gi}/{ci}/access"
                for ci in _subdirs(f"{mig}/{gi}", "ci")
                if _is_file(f"{mig}/{gi}/{ci}/access")
            )
    return names


def _read_proc_caps(driver_root: Path, wanted: Mapping[str, int] | set[str]) -> dict[str, CapNode]:
    from hook.sources import warm

    out: dict[str, CapNode] = {}
    root = str(driver_root)
    for name in _existing_cap_names(driver_root / CAPS_PROC_DIR):
        if name in wanted:  # the decider keeps each parsed file while its identity holds (hook.sources.warm)
            path = os.path.join(root, proc_cap_path(name))
            load = _cap_file(driver_root, name, path)
            out[name] = warm.remembered(("cap-file", path), warm.identity(path), load)
    return out


def _cap_file(driver_root: Path, name: str, path: str) -> Callable[[], CapNode]:
    def load() -> CapNode:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text: str | None = f.read()
        except OSError:
            text = read_text(driver_root, proc_cap_path(name), required=True)  # names the error
        assert text is not None
        return parse_cap_file(text, path)

    return load


def _read_dev_caps(driver_root: Path) -> dict[int, CapNode]:
    """``/dev/nvidia-caps/nvidia-capN`` character nodes (mode and owner from the node)."""
    out: dict[int, CapNode] = {}
    try:
        entries = list(os.scandir(driver_root / CAPS_DEV_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        suffix = entry.name.removeprefix("nvidia-cap")
        if suffix == entry.name or not suffix.isdigit():
            continue
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISCHR(st.st_mode):
            out[int(suffix)] = CapNode(
                minor=int(suffix), mode=st.st_mode & 0o777, uid=st.st_uid, gid=st.st_gid
            )
    return out


def read_cap_table(
    driver_root: Path, minors: MigMinors | bool | None = True
) -> tuple[CapTable, tuple[str, ...]]:
    """The MIG capabilities that exist; an absent mig-minors file means no MIG support.

    ``minors`` is the parsed mig-minors file when the caller has it (``hook.sources.nvidia.inventory``
    caches it per boot and driver build), ``None`` when it is absent, ``True`` to read it here.
    """
    if minors is True:
        minors = read_mig_minors(driver_root)
    if minors is None or minors is False:
        return CapTable(), ()
    proc_caps = _read_proc_caps(driver_root, minors.names())
    table, warnings = build_cap_table(minors, proc_caps, _read_dev_caps(driver_root))
    return table, minors.warnings + warnings
