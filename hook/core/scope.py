"""The narrowing scope: which nodes a narrowed container keeps, and which vendors' nodes it loses.

Rule: pure. A container keeps what its requests were granted (``Grant``), ``nvidiactl`` and
``nvidia-uvm(-tools)``, the DRM nodes of the GPUs it was granted whole and, in a management pod,
the NVLink/NVSwitch/fabric nodes (``hook.core.devclasses``). The evidence decides which vendors
are narrowed at all: the kubelet's allocation (``bounded``) speaks for every vendor's devices,
since the checkpoint lists every resource; an NVIDIA env, CDI name or DRA claim speaks only for its
own vendor, so another vendor's nodes and every host device keep the privileged semantics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from hook.core.devclasses import ClassKind, HostClasses, Key, keeps, whole_gpus
from hook.core.kpath import container_path
from hook.core.plan import Node
from hook.core.record import record, replace
from hook.core.requests import DeviceRequest, Kind, is_accelerator
from hook.core.rules import Access

__all__ = ["MGMT_ENV", "NVIDIA", "Grant", "Scope", "narrowing_scope"]

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
    return replace(within, vendors=frozenset(vendors))


def _key(node: Node) -> Key:
    return (node.type, node.major, node.minor)
