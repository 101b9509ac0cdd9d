"""``/proc/driver/nvidia-caps/mig-minors``: which cap minor each MIG capability would use.

Rule: the file lists every *possible* capability (32 GPUs), so a capability counts only when its
capability file or its ``/dev/nvidia-caps`` node exists. ``gpuG`` is the GPU device minor. An
unknown line is skipped with a warning that is returned, never printed. Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from hook.errors import InputError
from hook.nvidia.model import CapNode, CapTable

__all__ = [
    "MIG_MINORS_PATH",
    "MigMinors",
    "build_cap_table",
    "ci_cap_name",
    "dev_cap_path",
    "gi_cap_name",
    "parse_mig_minors",
    "proc_cap_path",
]

MIG_MINORS_PATH: Final = "proc/driver/nvidia-caps/mig-minors"
CAPS_PROC_DIR: Final = "proc/driver/nvidia/capabilities"
CAPS_DEV_DIR: Final = "dev/nvidia-caps"

_GI: Final = re.compile(r"gpu(\d+)/gi(\d+)/access")
_CI: Final = re.compile(r"gpu(\d+)/gi(\d+)/ci(\d+)/access")
_GLOBAL: Final = ("config", "monitor")


@dataclass(frozen=True, slots=True, kw_only=True)
class MigMinors:
    config: int | None = None
    monitor: int | None = None
    gi: Mapping[tuple[int, int], int] = field(default_factory=dict)
    ci: Mapping[tuple[int, int, int], int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def names(self) -> dict[str, int]:
        """Every listed capability name (``config``, ``gpu0/gi1/access``, ...) → its minor."""
        out: dict[str, int] = {}
        if self.config is not None:
            out["config"] = self.config
        if self.monitor is not None:
            out["monitor"] = self.monitor
        out.update((gi_cap_name(*key), minor) for key, minor in self.gi.items())
        out.update((ci_cap_name(*key), minor) for key, minor in self.ci.items())
        return out


def gi_cap_name(gpu_minor: int, gi: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/access"


def ci_cap_name(gpu_minor: int, gi: int, ci: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"


def proc_cap_path(name: str) -> str:
    """Driver-root-relative capability file: ``gpu0/gi1/access`` → ``…/gpu0/mig/gi1/access``."""
    if name in _GLOBAL:
        return f"{CAPS_PROC_DIR}/mig/{name}"
    gpu, _, rest = name.partition("/")
    return f"{CAPS_PROC_DIR}/{gpu}/mig/{rest}"


def dev_cap_path(minor: int) -> str:
    return f"{CAPS_DEV_DIR}/nvidia-cap{minor}"


def parse_mig_minors(text: str, source: str = MIG_MINORS_PATH) -> MigMinors:
    """Parse the file's ``<name> <minor>`` lines; a duplicate name is an error, junk a warning."""
    globals_: dict[str, int] = {}
    gi: dict[tuple[int, int], int] = {}
    ci: dict[tuple[int, int, int], int] = {}
    warnings: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            warnings.append(f"{source}: line {lineno}: skipped unexpected line {line!r}")
            continue
        name, minor = parts[0], int(parts[1])
        key: tuple[int, ...] | str
        if name in _GLOBAL:
            key, table = name, globals_
        elif m := _CI.fullmatch(name):
            key, table = (int(m[1]), int(m[2]), int(m[3])), ci
        elif m := _GI.fullmatch(name):
            key, table = (int(m[1]), int(m[2])), gi
        else:
            warnings.append(f"{source}: line {lineno}: skipped unknown capability line {line!r}")
            continue
        if key in table:
            raise InputError(source, f"line {lineno}", f"capability {name!r} is listed twice")
        table[key] = minor  # type: ignore[index]
    return MigMinors(
        config=globals_.get("config"), monitor=globals_.get("monitor"), gi=gi, ci=ci, warnings=tuple(warnings)
    )


def build_cap_table(
    minors: MigMinors, proc_caps: Mapping[str, CapNode], dev_caps: Mapping[int, CapNode]
) -> tuple[CapTable, tuple[str, ...]]:
    """Keep the listed capabilities that exist.

    ``proc_caps`` maps a capability name to the node its capability file describes;
    ``dev_caps`` maps a minor to the node found under ``/dev/nvidia-caps``. The capability file
    wins (it carries the driver's mode); a minor that disagrees with mig-minors is a warning.
    """
    warnings: list[str] = []
    found: dict[str, CapNode] = {}
    for name, minor in minors.names().items():
        node = proc_caps.get(name)
        if node is not None and node.minor != minor:
            warnings.append(
                f"{proc_cap_path(name)}: DeviceFileMinor {node.minor} differs from mig-minors ({minor}); "
                "using the capability file"
            )
        found_node = node if node is not None else dev_caps.get(minor)
        if found_node is not None:
            found[name] = found_node
    table = CapTable(
        config=found.get("config"),
        monitor=found.get("monitor"),
        gi={key: found[gi_cap_name(*key)] for key in minors.gi if gi_cap_name(*key) in found},
        ci={key: found[ci_cap_name(*key)] for key in minors.ci if ci_cap_name(*key) in found},
    )
    return table, tuple(warnings)
