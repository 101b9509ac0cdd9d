"""The shell around ``decide``: read every file a decision needs, resolve requests to nodes.

Rule: all I/O for a decision happens here, once, and only what the container's requests need:
no CDI registry for a container that names no CDI device, no inventory for one that needs no
NVIDIA node, and NVML only when /proc, the cache and the snapshot cannot answer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from hook.core.decide import Grant, Inputs
from hook.core.errors import InputError
from hook.core.hostdev import host_dev_roots
from hook.core.oci import MAX_CONFIG_BYTES, MAX_STATE_BYTES, OciConfig, OciState, parse_config, parse_state
from hook.core.plan import Node
from hook.core.record import field, record, replace
from hook.core.requests import (
    DeviceRequest,
    Kind,
    Requests,
    collect,
    dra_claim_label,
    dra_claim_of,
    injected_keys,
    is_accelerator,
    is_privileged,
    only_injected,
)
from hook.core.rules import Access
from hook.sources.kubelet import checkpoint as ckpt
from hook.sources.kubelet.podid import identify
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

    from hook.adapters.allowlist import HostDevices
    from hook.sources.cdi.registry import Registry
    from hook.sources.kubelet.dra import DraView
    from hook.sources.nvidia.model import Inventory

__all__ = [
    "Options",
    "read_limited",
    "read_regular",
    "read_state_file",
    "state_from_bundle",
    "resolved",
    "host_devices",
    "load_config",
    "load_inputs",
    "inputs_for_config",
    "kubelet_evidence",
    "inventory_option",
]

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
JIT_PREFIX = "runtime.nvidia.com/gpu="  # NVIDIA's jit-cdi names: resolved from the inventory


@record
class Options:
    """Where a decision reads the host. ``None``/``()`` mean "the settings' ``driver_root`` /
    ``cdi_spec_dirs``": a command-line option wins over the settings file, which wins over the default."""

    driver_root: Path | None = None
    spec_dirs: tuple[Path, ...] = ()
    inventory_file: Path | None = None
    settings_file: Path | None = None
    use_cache: bool = True  # simulation never writes caches
    dra_state: Path | None = None  # simulation's --kubelet-dra-state: wins over kubelet_dra_state
    settings: Settings | None = field(default=None, compare=False)


def inventory_option(path: Path | None) -> Path | None:
    """``--inventory`` as given: a file that is not there is an error, never "no inventory" (a
    missing one would otherwise pass for a driver on a CPU node, or go unread without a word)."""
    if path is not None and not path.is_file():
        why = "not a regular file" if path.exists() else "no such file"
        raise InputError(str(path), "", f"{why} (--inventory)")
    return path


def read_limited(path: Path, limit: int, what: str) -> bytes:
    """Read a whole file, refusing one over ``limit`` before reading it all."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(str(path), "", f"no such file ({what})") from None
    except OSError as exc:
        raise InputError(str(path), "", exc.strerror or str(exc)) from None
    if len(data) > limit:
        raise InputError(str(path), "", f"larger than {limit} bytes")
    return data


def read_state_file(path: Path) -> OciState:
    return parse_state(read_limited(path, MAX_STATE_BYTES, "state"), str(path))


def state_from_bundle(bundle: Path) -> OciState:
    """Simulation's default state: what a runtime would pass for this bundle, without a process."""
    return OciState(
        oci_version="", id=bundle.name, status="creating", pid=None, bundle=str(bundle), annotations={}
    )


def resolved(opts: Options, settings: Settings) -> Options:
    """``opts`` with the driver root and spec dirs made concrete (options, else settings)."""
    return replace(
        opts,
        driver_root=opts.driver_root if opts.driver_root is not None else Path(settings.driver_root),
        spec_dirs=opts.spec_dirs or tuple(Path(d) for d in settings.cdi_spec_dirs),
    )


def _settings(opts: Options) -> Settings:
    if opts.settings is not None:
        return opts.settings
    if opts.settings_file is not None:
        return load_settings(opts.settings_file, required=True)
    return load_settings(DEFAULT_PATH)


MAX_CHECKPOINT_BYTES = 64 << 20


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """A whole regular file of at most ``limit`` bytes, opened so that nothing there can block or
    redirect the read: ``O_NONBLOCK`` (a FIFO never hangs a container's start), ``O_NOFOLLOW``
    (a symlink is refused) and the regular-file check on the open descriptor.

    ``FileNotFoundError`` when there is no file; every other problem is an ``InputError``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputError(str(path), "", f"{exc.strerror or exc} ({what})") from None
    except ValueError:
        raise InputError(str(path), "", f"path contains a NUL byte ({what})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(str(path), "", f"not a regular file ({what})")
        if st.st_size > limit:
            raise InputError(str(path), "", f"larger than {limit} bytes ({what})")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(str(path), "", f"{exc.strerror or exc} ({what})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise InputError(str(path), "", f"larger than {limit} bytes ({what})")
    return b"".join(chunks)


def _kubelet(
    annotations: dict[str, str], cgroups_path: str, settings: Settings, warnings: list[str]
) -> ckpt.Kubelet | None:
    """What the kubelet's checkpoint and DRA state say about this container; None outside Kubernetes.

    Never raises: a missing, unreadable or corrupt file is a state the decision weighs (and a
    warning), so a container that asks for no device always starts. A pod identity that is not
    its engine's own (``hook.sources.kubelet.podid``) consults neither: state ``untrusted``.
    """
    ident = identify(annotations, cgroups_path)
    if ident.pod is None:
        if not ident.problem:
            return None
        consequence = "no allocation counts and env requests are ignored"
        warnings.append(f"no trusted pod identity: {ident.problem}; {consequence}")
        anonymous = ckpt.Pod(uid="", container="", namespace="", name="")
        checkpoint = settings.kubelet_checkpoint
        return ckpt.Kubelet(pod=anonymous, checkpoint=checkpoint, state="untrusted", problem=ident.problem)
    pod, engine = ident.pod, ident.engine
    from hook.sources import warm

    # the decider keeps this pod's view while both kubelet files keep their identity
    key = (warm.identity(settings.kubelet_checkpoint), warm.identity(settings.dra_state_path))
    found: list[str] = []
    files = (settings.kubelet_checkpoint, settings.dra_state_path)
    slot = ("kubelet", *files, pod.uid, pod.container, pod.namespace, pod.name, engine)
    view, said = warm.remembered(
        slot, key, lambda: (_read_kubelet(pod, engine, settings, found), tuple(found))
    )
    warnings += said
    return view


def _read_kubelet(pod: ckpt.Pod, engine: str, settings: Settings, warnings: list[str]) -> ckpt.Kubelet:
    path = Path(settings.kubelet_checkpoint)
    dra_view = _dra(pod, settings, warnings)

    def view(state: str, allocs: tuple[ckpt.Allocation, ...] = ()) -> ckpt.Kubelet:
        return ckpt.Kubelet(
            pod=pod,
            checkpoint=str(path),
            state=state,
            allocations=allocs,
            dra_view=dra_view,
            engine=engine,
        )

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the container's start
            raise InputError(str(path), "", "not a regular file")
        data = read_limited(path, MAX_CHECKPOINT_BYTES, "kubelet checkpoint")
    except FileNotFoundError:
        return view("absent")
    except OSError as exc:
        warnings.append(f"{path}: {exc.strerror or exc}; using the other evidence")
        return view("unreadable")
    except InputError as exc:
        if os.path.lexists(path):
            warnings.append(f"{exc}; using the other evidence")
            return view("unreadable")
        return view("absent")
    try:
        return view("read", ckpt.parse_checkpoint(data, str(path), (pod.uid, pod.container)))
    except InputError as exc:
        warnings.append(f"{exc}; using the other evidence")
    except Exception as exc:  # a decoder bug must not stop a container: the file is then "corrupt"
        warnings.append(f"{path}: cannot decode ({type(exc).__name__}); using the other evidence")
    return view("corrupt")


def kubelet_evidence(
    annotations: Mapping[str, str], cgroups_path: str, settings: Settings
) -> ckpt.Kubelet | None:
    """The kubelet's word on this container exactly as a decision reads it (its warnings dropped):
    what the precreate marker binds, gathered again by the stage that checks the marker."""
    return _kubelet(dict(annotations), cgroups_path, settings, [])


def _dra(pod: ckpt.Pod, settings: Settings, warnings: list[str]) -> DraView:
    """The kubelet's DRA state about this pod (hook.sources.kubelet.dra): a missing file is no DRA on
    this node;
    one that cannot be read or trusted is a warning naming it, and nothing is decided from it."""
    from hook.sources.kubelet import dra  # Kubernetes pods only
    from hook.sources.kubelet.dra import DraView

    path = settings.dra_state_path
    try:
        data = read_regular(Path(path), dra.MAX_BYTES, "kubelet DRA state")
    except FileNotFoundError:
        return DraView(path=path, state="absent")
    except InputError as exc:
        warnings.append(f"{exc}; nothing decided from the kubelet's DRA state")
        return DraView(path=path, state="unreadable")
    try:
        state = dra.parse_state(data, path, pod.uid)
    except InputError as exc:
        warnings.append(f"{exc}; nothing decided from the kubelet's DRA state")
        return DraView(path=path, state="corrupt")
    except Exception as exc:  # a parser bug must not stop a container
        warnings.append(
            f"{path}: cannot decode ({type(exc).__name__}); nothing decided from the kubelet's DRA state"
        )
        return DraView(path=path, state="corrupt")
    return DraView(
        path=path, state="read" if state.verified else "unverified", claims=dra.claims_of(state, pod.uid)
    )


class _Resolver:
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

    def inventory(self) -> Inventory:
        if self._inventory is None:
            from hook.sources.nvidia.inventory import load

            cache = Path(self.settings.cache_dir) if self.opts.use_cache else None
            # MIG UUIDs and NVML's G:M order are what /proc lacks; "all" and GPU IDs don't need them.
            need_migs = any(r.kind is Kind.NVIDIA and _is_mig_id(r.value) for r in self.requests.items)
            self._inventory = load(self.driver_root, self.opts.inventory_file, cache, need_migs)
        return self._inventory

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
        from hook.sources.nvidia.ids import resolve
        from hook.sources.nvidia.model import Gpu, MigDevice
        from hook.sources.nvidia.nodes import device_nodes

        self.specific_mig |= _is_mig_id(value)
        if value.lower() == "none":
            return self.control()
        devices = resolve(self.inventory(), [value], source=source)
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
        return self.grants((_host_node(self.driver_root, req.value, req.source),))

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


def _host_node(driver_root: Path, path: str, source: str) -> Node:
    """A plugin DeviceSpec host path: its numbers come from the host node itself, never guessed."""
    host = driver_root / path.lstrip("/")
    try:
        st = os.lstat(host)
    except OSError as exc:
        raise InputError(source, path, f"host device node {host}: {exc.strerror}") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise InputError(source, path, f"{host} is not a device node")
    return _node(path, st)


def _node(path: str, st: os.stat_result) -> Node:
    """A container-path Node with the type, numbers and mode of a host node's lstat."""
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
    return Node(
        path=path,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=stat.S_IMODE(st.st_mode),
    )


def scan_accelerators(driver_root: Path, patterns: dict[str, tuple[str, ...]] | Any) -> tuple[Node, ...]:
    """Every accelerator char node under ``<driver-root>/dev`` (two levels: dri/, nvidia-caps/)."""
    base = driver_root / "dev"
    found: list[Node] = []

    def walk(directory: Path, rel: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in entries:
            name = f"{rel}{e.name}"
            if e.is_dir(follow_symlinks=False) and depth < 2:
                walk(Path(e.path), name + "/", depth + 1)
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISCHR(st.st_mode) and is_accelerator("/dev/" + name, patterns):
                found.append(_node("/dev/" + name, st))

    walk(base, "", 0)
    return tuple(sorted(found, key=lambda n: (n.major, n.minor, n.path)))


def host_devices(driver_root: Path) -> HostDevices:
    """``<driver-root>/proc/devices`` and every device node two levels under ``<driver-root>/dev``,
    for the spec-level allow-list; an unreadable part is simply unknown (the list gets narrower)."""
    from hook.adapters.allowlist import HostDevices, parse_device_majors
    from hook.core.rules import DeviceType

    try:
        majors = parse_device_majors((driver_root / "proc/devices").read_text(errors="replace"))
    except OSError:
        majors = {}
    nodes: list[tuple[DeviceType, int, int]] = []

    def walk(directory: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 2:
                walk(Path(e.path), depth + 1)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                kind = DeviceType.CHAR if stat.S_ISCHR(st.st_mode) else DeviceType.BLOCK
                nodes.append((kind, os.major(st.st_rdev), os.minor(st.st_rdev)))

    walk(driver_root / "dev", 0)
    return HostDevices(majors=majors, nodes=tuple(sorted(set(nodes))))


def load_config(state: OciState) -> OciConfig:
    bundle = Path(state.bundle)
    path = bundle / "config.json"
    return parse_config(read_limited(path, MAX_CONFIG_BYTES, "config.json"), str(path), str(bundle))


def load_inputs(state: OciState, opts: Options, config: OciConfig | None = None) -> Inputs:
    """Everything ``decide`` needs for this container, or one ``InputError``."""
    config = config if config is not None else load_config(state)
    return inputs_for_config(config, state.annotations, state.id, opts)


def inputs_for_config(
    config: OciConfig, annotations: Mapping[str, str], container_id: str, opts: Options
) -> Inputs:
    """The decision's inputs from a config alone (``hook precreate``: no state, pid or bundle yet)."""
    settings = _settings(opts)
    if opts.dra_state is not None:
        settings = replace(settings, kubelet_dra_state=str(opts.dra_state))
    opts = resolved(opts, settings)
    warnings: list[str] = []
    annotations = {**config.annotations, **annotations}
    kubelet = _kubelet(annotations, config.cgroups_path, settings, warnings)
    requests = collect(config, annotations, settings, kubelet)
    resolver = _Resolver(opts, settings, config, requests)
    grants = resolver.resolve_all()
    if any(dra_claim_of(r) for r in requests.items):
        patterns = settings.accelerator_nodes
        accel = {
            r: frozenset(g.key for g in gs if is_accelerator(g.node.path, patterns))
            for r, gs in grants.items()
        }
        requests = only_injected(requests, accel, injected_keys(config.resource_rules))
        grants = {r: grants[r] for r in requests.items}
    host: tuple[Node, ...] = ()
    if requests.bounded or (
        requests.from_plugin and (is_privileged(config.resource_rules) or config.devices)
    ):
        host = scan_accelerators(opts.driver_root or Path("/"), settings.accelerator_nodes)
    return Inputs(
        container_id=container_id,
        config=config,
        settings=settings,
        requests=requests,
        grants=grants,
        host_accelerators=host,
        specific_mig=resolver.specific_mig,
        host_dev=host_dev_roots(str(opts.driver_root)),
        warnings=(*warnings, *resolver.warnings),
        no_driver_for=tuple(dict.fromkeys(resolver.no_driver_for)),
    )
