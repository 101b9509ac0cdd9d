"""Which device nodes a container needs for the NVIDIA devices it was given.

Rule: a GPU is ``/dev/nvidia<minor>`` (195:minor); a MIG device is its parent's node plus its GI
and CI capability nodes (major ``nvidia-caps``, mode from the capability file). Control nodes
follow NVIDIA_DRIVER_CAPABILITIES (``nvidia-uvm*`` need ``compute``, ``nvidia-modeset`` needs
``display``). Majors and minors come from the Inventory, never from constants. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from hook.core.errors import InputError
from hook.core.plan import Node
from hook.sources.nvidia.migminors import MIG_MINORS_PATH, ci_cap_name, gi_cap_name
from hook.sources.nvidia.model import CapNode, Gpu, Inventory, MigDevice

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "CTL_MINOR",
    "DEFAULT_CAPABILITIES",
    "MODESET_MINOR",
    "SUPPORTED_CAPABILITIES",
    "control_nodes",
    "device_nodes",
    "mig_mgmt_nodes",
    "parse_driver_capabilities",
]

SUPPORTED_CAPABILITIES: Final = frozenset(
    {"compute", "compat32", "graphics", "utility", "video", "display", "ngx"}
)
DEFAULT_CAPABILITIES: Final = frozenset({"utility", "compute"})
CTL_MINOR: Final = 255
MODESET_MINOR: Final = 254
UVM_MINOR: Final = 0
UVM_TOOLS_MINOR: Final = 1
CONTROL_MODE: Final = 0o666
ENV_CAPS: Final = "NVIDIA_DRIVER_CAPABILITIES"


def parse_driver_capabilities(value: str | None, *, legacy_image: bool = False) -> frozenset[str]:
    """NVIDIA_DRIVER_CAPABILITIES → capability set.

    Unset or empty: ``utility,compute`` (every capability for a legacy CUDA image); ``all``:
    every capability; otherwise a comma list of supported names, anything else an InputError.
    """
    items = [item.strip().lower() for item in (value or "").split(",") if item.strip()]
    if not items:
        return SUPPORTED_CAPABILITIES if legacy_image and value is None else DEFAULT_CAPABILITIES
    if "all" in items:
        return SUPPORTED_CAPABILITIES
    unknown = sorted(set(items) - SUPPORTED_CAPABILITIES)
    if unknown:
        raise InputError(ENV_CAPS, ", ".join(unknown), f"unsupported driver capability; use {_supported()}")
    return frozenset(items)


def _supported() -> str:
    return ", ".join(sorted(SUPPORTED_CAPABILITIES))


def _gpu_node(inv: Inventory, minor: int) -> Node:
    return Node(
        path=f"/dev/nvidia{minor}", type="c", major=inv.majors.nvidia, minor=minor, file_mode=CONTROL_MODE
    )


def _cap_node(inv: Inventory, cap: CapNode | None, name: str, who: str) -> Node:
    if inv.majors.caps is None:
        raise InputError("/proc/devices", "nvidia-caps", f"{who}: no nvidia-caps major (module not loaded)")
    if cap is None:
        raise InputError(MIG_MINORS_PATH, name, f"{who}: capability not present on the host")
    return Node(
        path=f"/dev/nvidia-caps/nvidia-cap{cap.minor}",
        type="c",
        major=inv.majors.caps,
        minor=cap.minor,
        file_mode=cap.mode,
        uid=cap.uid,
        gid=cap.gid,
    )


def _mig_nodes(inv: Inventory, mig: MigDevice) -> tuple[Node, ...]:
    who = mig.uuid or f"MIG {mig.parent_index}:{mig.index} (gpu{mig.parent_minor} gi{mig.gi} ci{mig.ci})"
    gi_name = gi_cap_name(mig.parent_minor, mig.gi)
    ci_name = ci_cap_name(mig.parent_minor, mig.gi, mig.ci)
    return (
        _gpu_node(inv, mig.parent_minor),
        _cap_node(inv, inv.caps.gi.get((mig.parent_minor, mig.gi)), gi_name, who),
        _cap_node(inv, inv.caps.ci.get((mig.parent_minor, mig.gi, mig.ci)), ci_name, who),
    )


def _sorted_unique(nodes: Iterable[Node]) -> tuple[Node, ...]:
    unique = {node.path: node for node in nodes}
    return tuple(sorted(unique.values(), key=lambda n: (n.major, n.minor, n.path)))


def device_nodes(inv: Inventory, devices: Iterable[Gpu | MigDevice]) -> tuple[Node, ...]:
    """Nodes for the given GPUs and MIG devices, de-duplicated, sorted by major:minor."""
    nodes: list[Node] = []
    for device in devices:
        if isinstance(device, Gpu):
            nodes.append(_gpu_node(inv, device.minor))
        else:
            nodes.extend(_mig_nodes(inv, device))
    return _sorted_unique(nodes)


def control_nodes(inv: Inventory, capabilities: Iterable[str]) -> tuple[Node, ...]:
    """``nvidiactl`` always; ``nvidia-uvm``/``-tools`` with compute; ``nvidia-modeset`` with display."""
    caps = frozenset(capabilities)
    nvidia = inv.majors.nvidia
    nodes = [Node(path="/dev/nvidiactl", type="c", major=nvidia, minor=CTL_MINOR, file_mode=CONTROL_MODE)]
    if "compute" in caps and inv.majors.uvm is not None:
        uvm = inv.majors.uvm
        nodes.append(
            Node(path="/dev/nvidia-uvm", type="c", major=uvm, minor=UVM_MINOR, file_mode=CONTROL_MODE)
        )
        nodes.append(
            Node(
                path="/dev/nvidia-uvm-tools",
                type="c",
                major=uvm,
                minor=UVM_TOOLS_MINOR,
                file_mode=CONTROL_MODE,
            )
        )
    if "display" in caps:
        nodes.append(
            Node(
                path="/dev/nvidia-modeset",
                type="c",
                major=nvidia,
                minor=MODESET_MINOR,
                file_mode=CONTROL_MODE,
            )
        )
    return _sorted_unique(nodes)


def mig_mgmt_nodes(inv: Inventory, config: bool, monitor: bool) -> tuple[Node, ...]:
    """The global ``mig/config`` / ``mig/monitor`` capability nodes (``nvidia-cap1``/``2`` usually)."""
    nodes = []
    if config:
        nodes.append(_cap_node(inv, inv.caps.config, "config", "NVIDIA_MIG_CONFIG_DEVICES"))
    if monitor:
        nodes.append(_cap_node(inv, inv.caps.monitor, "monitor", "NVIDIA_MIG_MONITOR_DEVICES"))
    return _sorted_unique(nodes)
