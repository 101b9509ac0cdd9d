"""The shell around ``decide``: read every file a decision needs, resolve requests to nodes.

Rule: all I/O for a decision happens below this step, once, and only what the container's requests
need: the kubelet's word (``hook.sources.kubelet.view``), the requests resolved to nodes
(``hook.routes.resolver``: no CDI registry for a container that names no CDI device, no inventory
for one that needs no NVIDIA node), and the host's accelerators (``hook.routes.hostscan``) only
when the decision must bound them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hook.core.decide import Inputs
from hook.core.devclasses import HostClasses
from hook.core.hostdev import host_dev_roots
from hook.core.oci import MAX_CONFIG_BYTES, MAX_STATE_BYTES, OciConfig, OciState, parse_config, parse_state
from hook.core.plan import Node
from hook.core.record import replace
from hook.core.requests import (
    collect,
    dra_claim_of,
    injected_keys,
    is_accelerator,
    is_privileged,
    only_injected,
)
from hook.routes.hostscan import host_devices, scan_accelerators
from hook.routes.options import Options, inventory_option, resolved
from hook.routes.resolver import Resolver
from hook.sources.inputfile import read_limited, read_regular
from hook.sources.kubelet.view import kubelet_evidence, kubelet_view
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

__all__ = [
    "Options",
    "read_limited",
    "read_regular",
    "read_state_file",
    "state_from_bundle",
    "resolved",
    "host_devices",
    "scan_accelerators",
    "load_config",
    "load_inputs",
    "inputs_for_config",
    "kubelet_evidence",
    "inventory_option",
]

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def read_state_file(path: Path) -> OciState:
    return parse_state(read_limited(path, MAX_STATE_BYTES, "state"), str(path))


def state_from_bundle(bundle: Path) -> OciState:
    """Simulation's default state: what a runtime would pass for this bundle, without a process."""
    return OciState(
        oci_version="", id=bundle.name, status="creating", pid=None, bundle=str(bundle), annotations={}
    )


def _settings(opts: Options) -> Settings:
    if opts.settings is not None:
        return opts.settings
    if opts.settings_file is not None:
        return load_settings(opts.settings_file, required=True)
    return load_settings(DEFAULT_PATH)


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
    if opts.checkpoint is not None:  # and with it the DRA state's default place, beside it
        settings = replace(settings, kubelet_checkpoint=str(opts.checkpoint))
    opts = resolved(opts, settings)
    warnings: list[str] = []
    annotations = {**config.annotations, **annotations}
    kubelet = kubelet_view(annotations, config.cgroups_path, settings, warnings)
    requests = collect(config, annotations, settings, kubelet)
    resolver = Resolver(opts, settings, config, requests)
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
    classes = HostClasses()
    if requests.bounded or (
        requests.from_plugin and (is_privileged(config.resource_rules) or config.devices)
    ):
        host = scan_accelerators(opts.driver_root or Path("/"), settings.accelerator_nodes)
        from hook.sources.nvidia.classes import host_classes  # only where narrowing may happen

        scanned = frozenset(n.path for n in host)  # class nodes the scan already found are not walked again
        mig = any("nvidia-caps/" in g.node.path for gs in grants.values() for g in gs)
        imex = any("nvidia-caps-imex-channels/" in g.node.path for gs in grants.values() for g in gs)
        classes = host_classes(opts.driver_root or Path("/"), resolver.loaded_inventory, scanned, mig, imex)
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
        classes=classes,
    )
