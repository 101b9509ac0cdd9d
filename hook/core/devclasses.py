"""NVIDIA device classes: which nodes the NVIDIA driver owns, and which of them a narrowed container keeps.

Rule: a class is a character-device region the driver registers under a name in ``/proc/devices``
(open-gpu-kernel-modules: ``nvidia`` and ``nvidiactl`` on 195 in ``nv.c``, ``nvidia-modeset`` on
195:254, ``nvidia-uvm``, ``nvidia-caps``, ``nvidia-caps-imex-channels`` in ``nv-caps-imex.c``,
``nvidia-nvlink`` in ``nvlink_linux.h``, ``nvidia-nvswitch`` in ``export_nvswitch.h`` with
``nvidia-nvswitchctl`` on minor 255; drivers before 550.40 name 195 ``nvidia-frontend``): no major
is assumed, only the minors the driver fixes (``nvidiactl`` 255, ``nvidia-modeset`` 254). A DRM
node (``/dev/dri/card*``, ``renderD*``) is NVIDIA's when sysfs puts it on the PCI address of a GPU
the driver lists under ``/proc/driver/nvidia/gpus``; it belongs to that GPU. Nothing here reads a
file: ``hook.sources.nvidia.classes`` builds the values.

A narrowed container keeps the node-global control nodes (``nvidiactl``, ``nvidia-uvm(-tools)``
and ``nvidia-modeset``, which no GPU owns), what its allocation grants, the DRM nodes of every GPU
it was allocated whole (a GPU reached through a MIG instance gives none: its DRM node is the whole
card's), and, in a management pod (granted the MIG ``config``/``monitor`` caps by the
``mig_management`` policy), the NVLink, NVSwitch and fabric-management nodes. Every other node of
a class is denied. A node of no class (another vendor's, a host device) is not decided here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from hook.core.plan import Node
from hook.core.record import field, record

__all__ = [
    "CTL_MINOR",
    "MODESET_MINOR",
    "ClassKind",
    "ClassNode",
    "HostClasses",
    "Key",
    "class_majors",
    "keeps",
    "whole_gpus",
]

Key = tuple[str, int, int]


class ClassKind(StrEnum):
    GPU = "gpu"  # /dev/nvidia<N>
    CTL = "ctl"  # /dev/nvidiactl (195:255)
    MODESET = "modeset"  # /dev/nvidia-modeset (195:254)
    UVM = "uvm"  # /dev/nvidia-uvm, /dev/nvidia-uvm-tools
    CAP = "cap"  # /dev/nvidia-caps/nvidia-cap<N>: MIG GI/CI, config, monitor
    FABRIC = "fabric"  # the fabric-mgmt / fabric-imex-mgmt capability nodes (also nvidia-caps)
    IMEX = "imex"  # /dev/nvidia-caps-imex-channels/channel<N>
    NVLINK = "nvlink"  # /dev/nvidia-nvlink
    NVSWITCH = "nvswitch"  # /dev/nvidia-nvswitch<N>, /dev/nvidia-nvswitchctl
    DRM = "drm"  # an NVIDIA GPU's /dev/dri/card<N>, renderD<N>


# /proc/devices name -> the region it names (195 carries several names)
_REGIONS = {
    "nvidia": "nvidia",
    "nvidia-frontend": "nvidia",
    "nvidiactl": "nvidia",
    "nvidia-modeset": "nvidia",
    "nvidia-uvm": "nvidia-uvm",
    "nvidia-caps": "nvidia-caps",
    "nvidia-caps-imex-channels": "nvidia-caps-imex-channels",
    "nvidia-nvlink": "nvidia-nvlink",
    "nvidia-nvswitch": "nvidia-nvswitch",
    "drm": "drm",
}
_BY_MAJOR = {
    "nvidia-uvm": ClassKind.UVM,
    "nvidia-caps-imex-channels": ClassKind.IMEX,
    "nvidia-nvlink": ClassKind.NVLINK,
    "nvidia-nvswitch": ClassKind.NVSWITCH,
}
CTL_MINOR = 255  # nv.c: NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE
_RENDER_BASE = 128  # drm_drv.c: render nodes (renderD<N>) start at DRM minor 128
MODESET_MINOR = 254  # nvidia-modeset-linux.c: NVKMS_RDEV
_ALWAYS = frozenset({ClassKind.CTL, ClassKind.MODESET, ClassKind.UVM})
_MANAGEMENT = frozenset({ClassKind.NVLINK, ClassKind.NVSWITCH, ClassKind.FABRIC})


@record
class ClassNode:
    """A host node of an NVIDIA class; ``gpu`` is the device minor of the GPU a DRM node belongs to."""

    node: Node
    kind: ClassKind
    gpu: int | None = None

    @property
    def key(self) -> Key:
        return (self.node.type, self.node.major, self.node.minor)


_driver_nodes: list[tuple[object, tuple[Node, ...]]] = []  # HostClasses.driver_nodes: the last set's


@record
class HostClasses:
    """The host's NVIDIA classes: region -> major, the DRM nodes of NVIDIA GPUs (key -> GPU minor),
    the minors of the fabric-management caps, and the class nodes under ``/dev`` the host scan of
    ``accelerator_nodes`` did not already find (``nvidiactl``, NVSwitch, NVLink...). A DRM
    node sysfs ties to no other vendor's device is NVIDIA's with an unknown GPU (``gpu`` None):
    where the hook cannot tell, it narrows."""

    majors: Mapping[str, int] = field(default_factory=dict)
    drm: Mapping[Key, int] = field(default_factory=dict)
    fabric: frozenset[int] = frozenset()
    nodes: tuple[ClassNode, ...] = ()
    drm_major: int | None = None  # /proc/devices' "drm"
    foreign: frozenset[Key] = frozenset()  # DRM nodes sysfs puts on another vendor's device
    gpu_minors: frozenset[int] = frozenset()  # every GPU the driver lists, whether /dev has its node or not
    cap_minors: frozenset[int] = frozenset()  # every MIG capability that exists (config, monitor, GI, CI)
    # the driver's IMEX channel count (``ImexChannelCount`` of /proc/driver/nvidia/params): channels
    # 0..count-1 exist, node or not; None where it was not read or did not say
    imex_count: int | None = None

    def driver_nodes(self) -> tuple[Node, ...]:
        """A node for every GPU the driver lists, every MIG capability that exists and every DRM
        node sysfs ties to an NVIDIA GPU (``/dev/nvidia<minor>``,
        ``/dev/nvidia-caps/nvidia-cap<minor>``, ``/dev/dri/card<N>``/``renderD<N>``): one the host
        has not made yet is still one a container holding CAP_MKNOD can make, so narrowing denies
        it too. Made once per distinct set (the last one kept): a resident decider reads the
        same classes anew for every container, and on a big node they are ~520 nodes."""
        key = (tuple(sorted(self.drm.items())), self.majors.get("nvidia"), self.gpu_minors,
               self.majors.get("nvidia-caps"), self.cap_minors)  # fmt: skip
        held = _driver_nodes[-1] if _driver_nodes else None
        if held is not None and held[0] == key:
            return held[1]
        out = [
            Node(
                path=f"/dev/dri/{'card' if k[2] < _RENDER_BASE else 'renderD'}{k[2]}",
                type=k[0],
                major=k[1],
                minor=k[2],
            )
            for k in sorted(self.drm)
        ]
        major = self.majors.get("nvidia")
        if major is not None:
            out += [
                Node(path=f"/dev/nvidia{m}", type="c", major=major, minor=m) for m in sorted(self.gpu_minors)
            ]
        caps = self.majors.get("nvidia-caps")
        if caps is not None:
            out += [
                Node(path=f"/dev/nvidia-caps/nvidia-cap{m}", type="c", major=caps, minor=m)
                for m in sorted(self.cap_minors)
            ]
        _driver_nodes[:] = [(key, tuple(out))]
        return _driver_nodes[-1][1]

    def classify(self, key: Key) -> tuple[ClassKind, int | None] | None:
        """The class of node ``key`` and, for a GPU or DRM node, its GPU's minor; None for a node
        of no NVIDIA class (a block node, another vendor's, a host device)."""
        kind, major, minor = key
        if kind != "c":
            return None
        if major == self.majors.get("nvidia"):
            if minor == CTL_MINOR:
                return ClassKind.CTL, None
            return (ClassKind.MODESET, None) if minor == MODESET_MINOR else (ClassKind.GPU, minor)
        if major == self.majors.get("nvidia-caps"):
            return (ClassKind.FABRIC if minor in self.fabric else ClassKind.CAP), None
        for region, cls in _BY_MAJOR.items():
            if major == self.majors.get(region):
                return cls, None
        gpu = self.drm.get(key)
        if gpu is not None or (major == self.drm_major and key not in self.foreign):
            return ClassKind.DRM, gpu
        return None


def class_majors(text: str) -> dict[str, int]:
    """``/proc/devices``' character section: each NVIDIA region's major (its first line wins), and
    ``drm``'s."""
    found: dict[str, int] = {}
    chars = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            chars = stripped == "Character devices:"
            continue
        number, _, name = stripped.partition(" ")
        region = _REGIONS.get(name.strip())
        if chars and region is not None and number.isdigit():
            found.setdefault(region, int(number))
    return found


def whole_gpus(classes: HostClasses, grants: Iterable[Iterable[Key]]) -> frozenset[int]:
    """Device minors of the GPUs a request was granted whole: one request's grants hold the GPU's
    node and no MIG capability node (a MIG instance's hold its parent's node and its GI/CI caps)."""
    out: set[int] = set()
    for keys in grants:
        kinds = [(k, classes.classify(k)) for k in keys]
        if any(c is not None and c[0] is ClassKind.CAP for _k, c in kinds):
            continue
        out |= {c[1] for _k, c in kinds if c is not None and c[0] is ClassKind.GPU and c[1] is not None}
    return frozenset(out)


def keeps(found: tuple[ClassKind, int | None], whole: Iterable[int], management: bool) -> bool:
    """Whether a narrowed container keeps a class node beyond its grants (the module rule)."""
    kind, gpu = found
    return (
        kind in _ALWAYS
        or (kind is ClassKind.DRM and gpu in frozenset(whole))
        or (management and kind in _MANAGEMENT)
    )


def by_key(nodes: Iterable[ClassNode]) -> Mapping[Key, ClassNode]:
    return {n.key: n for n in nodes}
