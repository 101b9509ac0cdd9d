"""Requests resolved to the device nodes they grant: CDI specs, the NVIDIA inventory, plugin device specs.

Rule: each source is loaded lazily and at most once per decision: no CDI registry for a container
that names no CDI device, no inventory for one that needs no NVIDIA node, and NVML only when
/proc, the cache and the snapshot cannot answer. On a node without the NVIDIA driver, a request
nothing backs starts without a GPU (a warning); one a plugin or CDI allocation made is an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from hook.core.decide import Grant
from hook.core.errors import InputError
from hook.core.oci import OciConfig
from hook.core.plan import Node
from hook.core.requests import DeviceRequest, Kind, Requests, dra_claim_label, dra_claim_of
from hook.core.rules import Access
from hook.core.settings import Settings
from hook.routes.hostscan import host_node
from hook.routes.options import Options

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from hook.sources.cdi.registry import Registry
    from hook.sources.nvidia.model import Gpu, Inventory, MigDevice

__all__ = ["JIT_PREFIX", "Resolver"]

JIT_PREFIX = "runtime.nvidia.com/gpu="  # NVIDIA's jit-cdi names: resolved from the inventory


class Resolver:
    """Lazily loads the CDI registry and the NVIDIA inventory, each at most once."""

    def __init__(self, opts: Options, settings: Settings, config: OciConfig, requests: Requests) -> None:
        self.opts, self.settings, self.config, self.requests = opts, settings, config, requests
        self.driver_root = opts.driver_root or Path("/")
        self._registry: Registry | None = None
        self._inventory: Inventory | None = None
        self.specific_mig = False
        self.warnings: list[str] = []
        self._has_specs: bool | None = None  # asked once per NVIDIA request; scanned once
        self._driver: bool | None = None
        self.no_driver_for: list[str] = []  # "source=value" of requests left unserved: no driver

    def registry(self) -> Registry:
        if self._registry is None:
            from hook.sources import warm
            from hook.sources.cdi.registry import Registry, spec_files

            cache = Path(self.settings.cache_dir) if self.opts.use_cache else None
            dirs = list(self.opts.spec_dirs)
            # the decider keeps the registry while every spec file (and the set of them) is the same
            key = warm.identities(p for p, _ in spec_files(dirs)) if warm.enabled() else None
            self._registry = warm.remembered(
                ("cdi", tuple(map(str, dirs)), str(cache)), key, lambda: Registry.load(dirs, cache)
            )
            for path, problems in sorted(self._registry.errors.items()):
                self.warnings += [f"CDI spec skipped: {problem}" for problem in problems[:3]]
                if len(problems) > 3:
                    self.warnings.append(f"CDI spec skipped: {path}: and {len(problems) - 3} more problem(s)")
        return self._registry

    def has_specs(self) -> bool:
        """Whether any spec dir holds a spec file: spares importing the CDI engine on CDI-less nodes."""
        if self._has_specs is None:
            self._has_specs = any(_holds_spec(d) for d in self.opts.spec_dirs)
        return self._has_specs

    def no_driver(self, req: DeviceRequest) -> tuple[Grant, ...] | None:
        """On a node without the NVIDIA kernel driver (a CPU node with the package installed):
        ``None`` when a driver is loaded (or an ``--inventory`` stands in for it); else no grants
        and a warning for a request nothing backs (``none``, an env value without plugin
        evidence, MIG management), and an error for one a plugin or CDI allocation made."""
        if self._driver is None:
            loaded = (self.driver_root / "proc/driver/nvidia").is_dir()
            self._driver = loaded or self.opts.inventory_file is not None
        if self._driver:
            return None
        if req.from_plugin and req.kind is not Kind.NO_GPU and req.value.lower() != "none":
            raise InputError(
                req.source, req.value, "allocated, but this node has no NVIDIA driver (/proc/driver/nvidia)"
            )
        self.warnings.append(
            f"{req.source}={req.value}: no NVIDIA driver on this node: the container starts without a GPU"
        )
        self.no_driver_for.append(f"{req.source}={req.value}")
        return ()

    @property
    def loaded_inventory(self) -> Inventory | None:
        """The inventory if a request needed it (never loaded for this alone)."""
        return self._inventory

    def inventory(self, fresh: bool = False) -> Inventory:
        if self._inventory is None or fresh:
            from hook.sources.nvidia.inventory import load

            cache = Path(self.settings.cache_dir) if self.opts.use_cache else None
            # MIG UUIDs and NVML's G:M order are what /proc lacks; "all" and GPU IDs don't need them.
            need_migs = any(r.kind is Kind.NVIDIA and _is_mig_id(r.value) for r in self.requests.items)
            self._inventory = load(self.driver_root, self.opts.inventory_file, cache, need_migs, fresh=fresh)
        return self._inventory

    def resolve(self, value: str, source: str) -> tuple[Gpu | MigDevice, ...]:
        """The devices ``value`` names; a MIG UUID the cached inventory does not know is looked for
        once more from /proc and NVML (an instance made since the cache was written) before it is
        refused. An instance that is gone is never granted: its UUID is in neither."""
        from hook.sources.nvidia.ids import resolve

        try:
            return resolve(self.inventory(), [value], source=source)
        except InputError:
            if self.inventory().source != "cache" or not value.strip().lower().startswith("mig-"):
                raise
            return resolve(self.inventory(fresh=True), [value], source=source)

    def access_for(self, node: Node, default: Access) -> Access:
        if node.path.startswith("/dev/nvidia-caps/"):
            return Access.parse(self.settings.cap_access)
        return default

    def grants(self, nodes: tuple[Node, ...], default: Access = Access.R | Access.W) -> tuple[Grant, ...]:
        return tuple(Grant(node=n, access=self.access_for(n, default)) for n in nodes)

    def control(self) -> tuple[Grant, ...]:
        from hook.sources.nvidia.nodes import control_nodes

        return self.grants(control_nodes(self.inventory(), self.capabilities()))

    def capabilities(self) -> frozenset[str]:
        from hook.sources.nvidia.nodes import SUPPORTED_CAPABILITIES, parse_driver_capabilities

        if self.requests.legacy_image:
            return SUPPORTED_CAPABILITIES
        return parse_driver_capabilities(self.requests.driver_capabilities or None)

    def cdi(self, names: list[str]) -> tuple[Grant, ...]:
        from hook.sources.cdi.edits import to_nodes_and_rules
        from hook.sources.cdi.hostnodes import fill

        nodes, rules = to_nodes_and_rules(fill(self.registry().resolve(names), self.driver_root))
        access = {(str(r.type), r.major, r.minor): r.access for r in rules}
        return tuple(
            Grant(node=n, access=self.access_for(n, access.get((n.type, n.major, n.minor), Access.RWM)))
            for n in nodes
            if (n.type, n.major, n.minor) in access
        )

    def nvidia(self, req: DeviceRequest) -> tuple[Grant, ...]:
        name = f"{self.settings.default_cdi_kind}={req.value}"
        self.specific_mig |= _is_mig_id(req.value)  # also when the CDI spec, not the inventory, resolves it
        if self.has_specs() and name in self.registry().devices:
            return self.cdi([name])
        missing = self.no_driver(req)
        return self.from_inventory(req.value, req.source) if missing is None else missing

    def from_inventory(self, value: str, source: str) -> tuple[Grant, ...]:
        """An NVIDIA device ID resolved against the host inventory, with its control and DRM nodes."""
        from hook.sources.nvidia.dri import GRAPHICS_CAPABILITIES, dri_nodes
        from hook.sources.nvidia.model import Gpu, MigDevice
        from hook.sources.nvidia.nodes import device_nodes

        self.specific_mig |= _is_mig_id(value)
        if value.lower() == "none":
            return self.control()
        devices = self.resolve(value, source)
        if value.lower() != "all" and any(isinstance(d, MigDevice) for d in devices):
            self.specific_mig = True
        grants = self.grants(device_nodes(self.inventory(), devices)) + self.control()
        if self.capabilities() & GRAPHICS_CAPABILITIES:
            buses = [d.pci_bus_id for d in devices if isinstance(d, Gpu)]
            grants += self.grants(dri_nodes(self.driver_root, buses))
        return grants

    def cdi_or_jit(self, req: DeviceRequest) -> tuple[Grant, ...]:
        if self.is_jit(req.value):
            missing = self.no_driver(req)
            if missing is not None:
                return missing
            return self.from_inventory(req.value[len(JIT_PREFIX) :], req.source)
        return self.cdi([req.value])

    def is_jit(self, name: str) -> bool:
        """A ``runtime.nvidia.com/gpu=`` name with no spec on disk (NVIDIA makes them on the fly)."""
        return name.startswith(JIT_PREFIX) and not (self.has_specs() and name in self.registry().devices)

    def no_gpu(self, req: DeviceRequest) -> tuple[Grant, ...]:
        missing = self.no_driver(req)
        return self.control() if missing is None else missing

    def mgmt(self, req: DeviceRequest) -> tuple[Grant, ...]:
        missing = self.no_driver(req)
        if missing is not None:
            return missing
        from hook.sources.nvidia.nodes import mig_mgmt_nodes

        nodes = mig_mgmt_nodes(self.inventory(), req.kind is Kind.MIG_CONFIG, req.kind is Kind.MIG_MONITOR)
        return self.grants(nodes)

    def node(self, req: DeviceRequest) -> tuple[Grant, ...]:
        if req.node is not None:
            d = req.node
            node = Node(
                path=d.path, type=d.type, major=d.major, minor=d.minor, file_mode=d.file_mode or 0o666
            )
            rules = [
                r for r in self.config.resource_rules if r.allow and r.major == d.major and r.minor == d.minor
            ]
            access = Access.NONE
            for r in rules:
                access |= r.access
            return (Grant(node=node, access=access or Access.R | Access.W),)
        return self.grants((host_node(self.driver_root, req.value, req.source),))

    def imex(self, req: DeviceRequest) -> tuple[Grant, ...]:
        major = self.inventory().majors.imex
        if major is None or not req.value.isdigit():
            raise InputError(req.source, "imex", f"IMEX channel {req.value!r} unavailable on this host")
        path = f"/dev/nvidia-caps-imex-channels/channel{req.value}"
        return self.grants((Node(path=path, type="c", major=major, minor=int(req.value)),))

    def claims_resolve(self, items: tuple[DeviceRequest, ...]) -> None:
        """A DRA claim's device that no CDI spec defines (its driver's claim spec gone) stops the
        privileged container it would narrow: one line naming the claim and the device."""
        for r in items:
            claim = dra_claim_of(r)
            if claim and r.value not in self.registry().devices:
                raise InputError(
                    f"DRA claim {dra_claim_label(self.requests.kubelet, claim)}",
                    r.value,
                    "no CDI spec defines this device (the driver's claim spec is gone?): "
                    "the privileged container cannot be narrowed to its claims",
                )
            if claim and "-mig-" in r.value.partition("=")[2]:
                self.specific_mig = True  # NVIDIA's DRA driver: <claim>-gpu-<minor>-mig-<profile>-...

    def resolve_all(self) -> dict[DeviceRequest, tuple[Grant, ...]]:
        items = self.requests.items
        self.claims_resolve(items)
        cdi_names = [r.value for r in items if r.kind is Kind.CDI and not self.is_jit(r.value)]
        if cdi_names:
            self.registry().resolve_devices(cdi_names)  # one error naming every unresolvable device
        kind = self.settings.default_cdi_kind + "="
        self.specific_mig |= any(n.startswith(kind) and _is_mig_id(n[len(kind) :]) for n in cdi_names)
        handlers: dict[Kind, Callable[[DeviceRequest], tuple[Grant, ...]]] = {
            Kind.CDI: self.cdi_or_jit,
            Kind.NVIDIA: self.nvidia,
            Kind.NO_GPU: self.no_gpu,
            Kind.MIG_CONFIG: self.mgmt,
            Kind.MIG_MONITOR: self.mgmt,
            Kind.NODE: self.node,
            Kind.IMEX: self.imex,
        }
        return {r: handlers[r.kind](r) for r in items}


def _is_mig_id(value: str) -> bool:
    """``MIG-<uuid>``, ``MIG-GPU-<uuid>/<gi>/<ci>`` or ``<gpu>:<mig>`` (the MIG forms NVIDIA's
    container toolkit documents for ``NVIDIA_VISIBLE_DEVICES``)."""
    gpu, sep, mig = value.partition(":")
    return value.upper().startswith("MIG-") or (bool(sep) and gpu.isdigit() and mig.isdigit())


def _holds_spec(directory: Path) -> bool:
    try:
        return any(e.name.endswith((".json", ".yaml")) for e in os.scandir(directory))
    except OSError:
        return False


