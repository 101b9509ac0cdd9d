"""``hook doctor``'s kubelet line: where this node's device-plugin checkpoint is, and whether the
hook reads it, so that Kubernetes pods' env requests are checked against the kubelet's word.

Rule: reads only; returns (ok, detail, fix) and never raises. A node with no checkpoint at all
is fine (not a Kubernetes GPU node); a checkpoint in a place the settings do not name is not,
since then every pod's image env is judged without the kubelet.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["kubelet_coverage"]


def _trust(settings: object) -> str:
    names = ", ".join(getattr(settings, "env_trusted_namespaces", ())) or "(none)"
    return f"env_requests: {getattr(settings, 'env_requests', '?')}; env_trusted_namespaces: {names}"


def kubelet_coverage(settings_file: Path, root: Path = Path("/")) -> tuple[bool, str, str]:
    """(ok, detail, fix) for the kubelet checkpoint the settings name, looked up under ``root``."""
    from hook.checkpoint import KNOWN_PATHS, parse_checkpoint
    from hook.errors import InputError
    from hook.requests import gpu_resource
    from hook.settings import Settings, load_settings

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
