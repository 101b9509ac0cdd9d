"""``hook doctor``'s kubelet lines: where this node's device-plugin checkpoint and DRA state are,
and whether the hook reads them, so that Kubernetes pods' env requests are checked against the
kubelet's word and privileged pods with DRA claims are narrowed to them.

Rule: reads only; returns (ok, detail, fix) and never raises. A node with no checkpoint at all
is fine (not a Kubernetes GPU node); a checkpoint in a place the settings do not name is not,
since then every pod's image env is judged without the kubelet.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["kubelet_coverage", "dra_coverage"]


def _trust(settings: object) -> str:
    names = ", ".join(getattr(settings, "env_trusted_namespaces", ())) or "(none)"
    return f"env_requests: {getattr(settings, 'env_requests', '?')}; env_trusted_namespaces: {names}"


def kubelet_coverage(settings_file: Path, root: Path = Path("/")) -> tuple[bool, str, str]:
    """(ok, detail, fix) for the kubelet checkpoint the settings name, looked up under ``root``."""
    from hook.core.errors import InputError
    from hook.core.requests import gpu_resource
    from hook.sources.kubelet.checkpoint import KNOWN_PATHS, parse_checkpoint
    from hook.sources.settingsfile import Settings, load_settings

    try:
        settings = load_settings(settings_file)
    except InputError:
        settings = Settings()  # the settings line reports the error; judge the defaults here
    trust = _trust(settings)
    configured = settings.kubelet_checkpoint
    on_host = root / configured.lstrip("/")
    if on_host.is_file():
        try:
            allocs = parse_checkpoint(on_host.read_bytes(), configured)
        except (OSError, InputError) as exc:
            return (
                False,
                f"{exc}: pods' env requests count only when corroborated; {trust}",
                "the kubelet rewrites the checkpoint on its next allocation; check the kubelet's log",
            )
        pods = len({a.pod_uid for a in allocs})
        gpus = sum(gpu_resource(a.resource, settings) for a in allocs)
        return (
            True,
            f"{configured}: {len(allocs)} allocation(s) of {pods} pod(s), {gpus} of a GPU resource; "
            f"pods on this node are covered; {trust}",
            "",
        )
    others = [p for p in KNOWN_PATHS if p != configured and (root / p.lstrip("/")).is_file()]
    if others:
        return (
            False,
            f"kubelet_checkpoint {configured} is absent but {others[0]} exists: pods on this node are "
            f"not covered (an image's NVIDIA_VISIBLE_DEVICES counts only when corroborated); {trust}",
            f"set kubelet_checkpoint: {others[0]} in {settings_file}",
        )
    return (
        True,
        f"no kubelet checkpoint at {configured} nor at the k3s, rke2 or microk8s paths: not a Kubernetes "
        f"GPU node (a kubelet run with --root-dir DIR keeps it in DIR/device-plugins/); {trust}",
        "",
    )


def dra_coverage(settings_file: Path, root: Path = Path("/")) -> tuple[bool, str, str]:
    """(ok, detail, fix) for the kubelet's DRA state (``dra_manager_state``) the hook reads: found
    where the settings say (or beside the checkpoint's ``device-plugins/``), and readable, so that
    privileged pods whose GPUs came from DRA claims are narrowed to them."""
    from hook.core.errors import InputError
    from hook.routes.gather import read_regular
    from hook.sources.kubelet import dra
    from hook.sources.kubelet.checkpoint import KNOWN_PATHS
    from hook.sources.settingsfile import Settings, load_settings

    try:
        settings = load_settings(settings_file)
    except InputError:
        settings = Settings()
    configured = settings.dra_state_path
    try:
        data = read_regular(root / configured.lstrip("/"), dra.MAX_BYTES, "kubelet DRA state")
    except FileNotFoundError:
        data = None
    except InputError as exc:
        return (
            False,
            f"{configured}: {exc.reason}: privileged pods with DRA claims are left alone",
            "the kubelet rewrites it when it prepares a claim; check the kubelet's log",
        )
    if data is not None:
        try:
            state = dra.parse_state(data, configured)
        except InputError as exc:
            return (
                False,
                f"{exc}: nothing is decided from it, privileged pods with DRA claims are left alone",
                "the kubelet rewrites it when it prepares a claim; check the kubelet's log",
            )
        pods = {p for c in state.claims for p in c.pod_uids}
        drivers = sorted({d.driver for c in state.claims for d in c.devices})
        ids = sum(len(d.cdi_ids) for c in state.claims for d in c.devices)
        how = "checksum verified" if state.verified else "Kubernetes 1.30 format, checksum not verified"
        return (
            True,
            f"{configured}: {len(state.claims)} claim(s) of {len(pods)} pod(s), {ids} CDI device(s) "
            f"(drivers: {', '.join(drivers) or 'none'}; {how}); "
            "privileged pods with claims are narrowed to them",
            "",
        )
    known = [dra.default_path(p) for p in KNOWN_PATHS]
    others = [p for p in known if p != configured and (root / p.lstrip("/")).is_file()]
    if others:
        return (
            False,
            f"kubelet DRA state {configured} is absent but {others[0]} exists: privileged pods with DRA "
            "claims on this node are not narrowed",
            f"set kubelet_dra_state: {others[0]} in {settings_file}",
        )
    return (
        True,
        f"no kubelet DRA state at {configured} nor at the k3s, rke2 or microk8s paths: "
        "no DRA claims on this node",
        "",
    )
