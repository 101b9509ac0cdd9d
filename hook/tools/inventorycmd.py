"""``hook inventory``: the host's NVIDIA inventory as JSON (the ``--inventory`` format) or text.

Rule: the command only reads; it returns the output and an exit code and leaves printing and
error mapping to ``hook.cli`` (a ``HookError`` propagates unchanged).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from hook.core.errors import UsageError
from hook.sources.nvidia import inventory
from hook.sources.nvidia.model import CapNode, Inventory

__all__ = ["cmd_inventory", "render_text"]


def _cap(cap: CapNode | None) -> str:
    return "-" if cap is None else f"nvidia-cap{cap.minor} ({cap.mode:04o})"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_text(inv: Inventory) -> str:
    """A person-readable listing: driver, majors, GPUs with their MIG devices, warnings."""
    m = inv.majors
    lines = [
        f"driver {inv.driver_version} (source: {inv.source})",
        f"majors: nvidia {m.nvidia}, nvidia-uvm {_opt(m.uvm)}, nvidia-caps {_opt(m.caps)}, "
        f"nvidia-caps-imex-channels {_opt(m.imex)}",
        f"mig caps: config {_cap(inv.caps.config)}, monitor {_cap(inv.caps.monitor)}",
    ]
    for gpu in sorted(inv.gpus, key=lambda g: g.index):
        mig = " MIG enabled" if gpu.mig_enabled else ""
        lines.append(f"GPU {gpu.index}: /dev/nvidia{gpu.minor} {gpu.pci_bus_id} {gpu.uuid} {gpu.name}{mig}")
        for dev in sorted((d for d in inv.migs if d.parent_index == gpu.index), key=lambda d: d.index):
            gi = inv.caps.gi.get((dev.parent_minor, dev.gi))
            ci = inv.caps.ci.get((dev.parent_minor, dev.gi, dev.ci))
            lines.append(
                f"  MIG {gpu.index}:{dev.index}: gi {dev.gi} ci {dev.ci} {dev.profile or '-'} "
                f"{dev.uuid or '(uuid unknown)'} caps {_cap(gi)}, {_cap(ci)}"
            )
    if not inv.gpus:
        lines.append("no NVIDIA GPUs")
    lines.extend(f"warning: {w}" for w in inv.warnings)
    return "\n".join(lines) + "\n"


def cmd_inventory(
    driver_root: Path,
    inventory_file: Path | None,
    cache_dir: Path | None,
    fmt: str,
    *,
    nvml_module: ModuleType | Any | None = None,
) -> tuple[str, int]:
    """Load the inventory (MIG UUIDs included) and render it as ``json`` or ``text``; exit 0."""
    if fmt not in ("json", "text"):
        raise UsageError("--format", fmt, "expected json or text")
    inv = inventory.load(driver_root, inventory_file, cache_dir, need_migs=True, nvml_module=nvml_module)
    return (inventory.dumps(inv) if fmt == "json" else render_text(inv)), 0
