"""The narrowing scope: which nodes a narrowed container keeps, and which vendors' nodes it loses.

Rule: pure. A container keeps what its requests were granted (``Grant``), ``nvidiactl`` and
``nvidia-uvm(-tools)``, the DRM nodes of the GPUs it was granted whole and, in a management pod,
the NVLink/NVSwitch/fabric nodes (``hook.core.devclasses``). The evidence decides which vendors
are narrowed at all: the kubelet's allocation (``bounded``) speaks for every vendor's devices,
since the checkpoint lists every resource; an NVIDIA env, CDI name or DRA claim speaks only for its
own vendor, so another vendor's nodes and every host device keep the privileged semantics.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from fnmatch import fnmatchcase

from hook.core.devclasses import CTL_MINOR, MODESET_MINOR, ClassKind, HostClasses, Key, keeps, whole_gpus
from hook.core.kpath import container_path
from hook.core.plan import Node
from hook.core.record import field, record, replace
from hook.core.requests import DeviceRequest, Kind, is_accelerator
from hook.core.rules import Access, DeviceType, Verdicts

__all__ = [
    "MGMT_ENV",
    "NVIDIA",
    "PROBE_MINOR",
    "Grant",
    "ImexChannels",
    "Scope",
    "IMEX_DEFAULT_COUNT",
    "class_majors_of",
    "imex_channels",
    "narrowing_scope",
    "whole_majors",
]

MGMT_ENV = {Kind.MIG_CONFIG: "NVIDIA_MIG_CONFIG_DEVICES", Kind.MIG_MONITOR: "NVIDIA_MIG_MONITOR_DEVICES"}


@record
class Grant:
    """A node a request needs, with the access it needs on it."""

    node: Node
    access: Access

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.node.type, self.node.major, self.node.minor)


NVIDIA = "nvidia"  # the accelerator_nodes vendor whose nodes the NVIDIA classes also name


@record
class Scope:
    """What narrowing weighs for one container (the module rule); ``vendors`` None: every vendor."""

    allowed: frozenset[Key]
    whole: frozenset[int]
    management: bool
    vendors: frozenset[str] | None
    classes: HostClasses
    patterns: Mapping[str, tuple[str, ...]]
    # each node's ``narrowed`` answer, once per scope: a decision asks it of every candidate node
    # several times (the whole-major probe, the denies, the report), a privileged container on a
    # big node of ~500 nodes; a scope made by ``replace`` must be given a new one
    answers: dict[tuple[str, int, int, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def vendors_of(self, node: Node) -> frozenset[str]:
        """The accelerator vendors a node belongs to: NVIDIA for a class node (a GPU's own DRM
        node too, whatever another vendor's globs say), else the vendors whose globs name it; a
        DRM node whose GPU sysfs does not tell is anyone's."""
        found = self.classes.classify(_key(node))
        if found is not None and found != (ClassKind.DRM, None):
            return frozenset({NVIDIA})
        named: frozenset[str] = frozenset()
        if is_accelerator(node.path, self.patterns):
            name = container_path(node.path)[len("/dev/") :]
            named = frozenset(
                v for v, globs in self.patterns.items() if any(fnmatchcase(name, g) for g in globs)
            )
        return named if found is None else named | {NVIDIA}

    def matters(self, node: Node) -> bool:
        """A node a report of what the container keeps lists: granted, of a class, an accelerator."""
        return _key(node) in self.allowed or bool(self.vendors_of(node))

    def narrowed(self, node: Node) -> bool:
        """An accelerator or NVIDIA-class node of a vendor in scope that this container may not keep."""
        seen = (node.type, node.major, node.minor, node.path)  # the path: a vendor's globs read it
        answer = self.answers.get(seen)
        if answer is None:
            answer = self.answers[seen] = self._narrowed(node)
        return answer

    def _narrowed(self, node: Node) -> bool:
        key = _key(node)
        if key in self.allowed:
            return False
        vendors = self.vendors_of(node)
        if not vendors or (self.vendors is not None and not vendors & self.vendors):
            return False
        found = self.classes.classify(key)
        return found is None or not keeps(found, self.whole, self.management)


def narrowing_scope(
    requests: Iterable[DeviceRequest],
    grants: Mapping[DeviceRequest, tuple[Grant, ...]],
    classes: HostClasses,
    patterns: Mapping[str, tuple[str, ...]],
    bounded: bool,
) -> Scope:
    """The scope of a container granted what ``requests`` resolve to (``grants``); ``bounded``: the
    kubelet's allocation is known and bounds every vendor's accelerators."""
    chosen = list(requests)
    groups: dict[object, list[Grant]] = {}
    for req in chosen:  # linux.devices nodes are one request each: one group, as the engine gave them
        groups.setdefault(req.source if req.kind is Kind.NODE else req, []).extend(grants.get(req, ()))
    within = Scope(
        allowed=frozenset(g.key for gs in groups.values() for g in gs),
        whole=whole_gpus(classes, ([g.key for g in gs] for gs in groups.values())),
        management=any(r.kind in MGMT_ENV for r in chosen),
        vendors=None,
        classes=classes,
        patterns=patterns,
    )
    if bounded:
        return within
    vendors = {NVIDIA for r in chosen if r.kind not in (Kind.CDI, Kind.NODE)}
    vendors |= {v for gs in groups.values() for g in gs for v in within.vendors_of(g.node)}
    return replace(within, vendors=frozenset(vendors), answers={})


# a minor no node of any class has (minors are 20 bits): it stands for "every minor no node names"
PROBE_MINOR = (1 << 20) - 1


def class_majors_of(classes: HostClasses, known: Iterable[Node]) -> tuple[int, ...]:
    """Every NVIDIA-named char major of ``/proc/devices``, and ``drm``'s where NVIDIA GPUs are
    present (a GPU node among ``known``, or a DRM node sysfs ties to one): the majors a container
    could ``mknod`` a class node of whether or not the host has a node there."""
    majors = set(classes.majors.values())
    if classes.drm_major is not None and (
        classes.drm or any(classes.classify(_key(n)) == (ClassKind.GPU, n.minor) for n in known)
    ):
        majors.add(classes.drm_major)
    return tuple(sorted(majors))


def _probes(within: Scope, major: int) -> list[Node]:
    """Minors that stand for what a container keeps of ``major`` without a node: the control nodes'
    fixed minors, the fabric caps', and one no node names."""
    minors = [CTL_MINOR, MODESET_MINOR, PROBE_MINOR]
    if major == within.classes.majors.get("nvidia-caps"):
        minors += sorted(within.classes.fabric)
    return [Node(path="", type="c", major=major, minor=m) for m in minors]


def whole_majors(within: Scope, known: Iterable[Node]) -> tuple[int, ...]:
    """The class majors (``class_majors_of``) of which this container keeps no minor: a class it
    was not given, denied whole (``c M:*``) so that no node of it opens, also one the host has no
    node of yet and one the container makes itself (a privileged container holds CAP_MKNOD). A
    major it keeps some minor of (granted, a control node, kept by policy, another vendor's node
    out of scope) is narrowed node by node: runc cannot re-allow inside a denied wildcard."""
    nodes = list(known)
    held = {k[1] for k in within.allowed if k[0] == "c"}
    held |= {n.major for n in nodes if n.type == "c" and not within.narrowed(n)}
    out = []
    for major in class_majors_of(within.classes, nodes):
        if major not in held and all(within.narrowed(p) for p in _probes(within, major)):
            out.append(major)
    return tuple(out)


IMEX_DEFAULT_COUNT = 2048  # nv-reg.h: NVreg_ImexChannelCount's default
_MINORS = 1 << 20  # the count's documented maximum: a dev_t minor's 20 bits
_RW = (Access.R | Access.W).value


@record
class ImexChannels:
    """The IMEX channels a container keeping some of them is denied (``imex_channels``)."""

    major: int
    minors: tuple[int, ...]  # every channel the driver has that it was not given and its rules open
    assumed: bool  # the driver's count was not known: its documented default stood for it

    def said(self) -> tuple[str, ...]:
        """What ``denied`` lists: one entry for them all (a node each would be thousands)."""
        if not self.minors:
            return ()
        n, lo, hi = len(self.minors), self.minors[0], self.minors[-1]
        return (f"c {self.major}:{lo}-{hi} ({n} IMEX channel(s), node or not)",)

    def warnings(self) -> tuple[str, ...]:
        if not (self.assumed and self.minors):
            return ()
        return (
            "/proc/driver/nvidia/params does not say the driver's ImexChannelCount: IMEX channels "
            f"0-{IMEX_DEFAULT_COUNT - 1} (its default count, {IMEX_DEFAULT_COUNT}) are narrowed; "
            "a channel above them stays open",
        )


def imex_channels(
    within: Scope, known: Iterable[Node], rules: Verdicts, denied: Container[Key]
) -> ImexChannels | None:
    """The IMEX channel major's other channels, for a container that keeps some channel of it
    (so ``whole_majors`` cannot deny it whole): the driver has channels 0..count-1 whether or not
    the host made their nodes (``nv-caps-imex.c`` registers exactly that many minors; a minor from
    the count on has no channel behind it), and a container holding CAP_MKNOD can make any of
    them. The count is the driver's ``ImexChannelCount``; where it is not known, its documented
    default (2048). Only channels ``rules`` open (read or write) and not ``denied`` already are
    listed. None where the container keeps no channel (the major is denied whole)."""
    major = within.classes.majors.get("nvidia-caps-imex-channels")
    if major is None:
        return None
    kept = {k[2] for k in within.allowed if k[0] == "c" and k[1] == major}
    kept |= {n.minor for n in known if n.type == "c" and n.major == major and not within.narrowed(n)}
    if not kept:
        return None
    count = within.classes.imex_count
    top = min(IMEX_DEFAULT_COUNT if count is None else count, _MINORS)
    char = DeviceType.CHAR
    minors = tuple(
        m
        for m in range(top)
        if m not in kept and ("c", major, m) not in denied and rules.access(char, major, m) & _RW
    )
    return ImexChannels(major=major, minors=minors, assumed=count is None)


def _key(node: Node) -> Key:
    return (node.type, node.major, node.minor)
