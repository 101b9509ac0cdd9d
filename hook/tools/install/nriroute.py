"""The installer's route choice on a containerd node: the runtime wrapper, the NRI route, or both.

Rule: the default stays the fail-closed route. ``--route nri`` leaves containerd's handlers alone
and relies on ``hook nri`` alone, which is fail-closed only where containerd refuses containers
while the daemon is away: containerd >= 2.2 with ``oci-device-hook`` in the default validator's
``required_plugins`` (``hook.tools.doctornri``). Elsewhere a missing, slow or killed daemon lets
containers start unadjusted until it narrows them late, and the installer registers the NRI route
alone only when the operator says so (``--accept-unadjusted``); ``--route both`` keeps the wrapper
as the backstop. Every route that counts on NRI needs containerd's NRI on and listening where the
daemon connects; the installer never edits containerd's NRI table (its lines are printed instead)
and never starts the daemon (the NRI DaemonSet, or ``oci-device-hook-nri.service``).
"""

from __future__ import annotations

from typing import Any

from hook.tools.doctornri import DEFAULT_SOCKET, TOLERATE, View, containerd_view, version_of
from hook.tools.install.node import InstallError, Node

__all__ = ["ROUTES", "plan", "node_view", "choose"]

ROUTES = ("wrapper", "nri", "both")
NAME = "oci-device-hook"
_ON = '[plugins."io.containerd.nri.v1.nri"] disable = false'
_REQUIRED = (f'[plugins."io.containerd.nri.v1.nri".default_validator] enable = true, required_plugins = '
             f'["{NAME}"], tolerate_missing_plugins_annotation = "{TOLERATE}"')  # fmt: skip


def plan(view: View, route: str, accept_unadjusted: bool, socket: str = DEFAULT_SOCKET) -> tuple[bool, str]:
    """(register the wrapper, '' or why this route cannot be registered on this containerd)."""
    if route == "wrapper":
        return True, ""
    label = f"containerd {'.'.join(map(str, view.version)) or '(version unknown)'}"
    if not view.enabled:
        return False, f"{label} has NRI off: hook nri would never be asked; set {_ON}, restart containerd"
    if view.socket.replace("/var/run/", "/run/", 1) != socket.replace("/var/run/", "/run/", 1):
        return (
            False,
            f"{label} listens for NRI on {view.socket}, hook nri connects to {socket}: set nri_socket",
        )
    if route == "both" or NAME in view.required or accept_unadjusted:
        return route == "both", ""
    how = (f"list it: {_REQUIRED}" if view.version >= (2, 2)
           else "containerd >= 2.2 can refuse them (required_plugins)")  # fmt: skip
    return False, (
        f"{label} lets containers start unadjusted while hook nri is away ({how}): --route both keeps the "
        "wrapper (fail-closed), or --accept-unadjusted registers the NRI route alone"
    )


def node_view(node: Node, config: str) -> View:
    """containerd's NRI as the node's own binary reads ``config`` (its dump, defaults filled in),
    else as the file says with the version unknown (NRI then counts as on only where the file
    says ``disable = false``)."""
    from hook.tools import engines
    from hook.tools.install.containerd import _containerd_binary

    binary = _containerd_binary(node)
    version: tuple[int, ...] = ()
    doc: dict[str, Any] = {}
    if binary:
        version = version_of(node.run([binary, "--version"]).stdout)
        dumped = node.run([binary, "--config", config, "config", "dump"])
        if dumped.returncode == 0:
            doc = engines.parse(dumped.stdout, f"{binary} config dump")
    if not doc:
        path = node.path(config)
        doc = engines.parse(path.read_text(), config) if path.exists() else {}
    return containerd_view(doc, version)


def choose(node: Node, rec: dict[str, Any]) -> bool:
    """Whether to register containerd's handlers for ``--route``; raises when the route cannot be
    registered here; records the route."""
    opts = node.opts
    route = getattr(opts, "route", "wrapper")
    if route != "wrapper":
        view = node_view(node, opts.containerd_config)
        wrapper, why = plan(view, route, getattr(opts, "accept_unadjusted", False))
        if why:
            raise InstallError("--route", route, why)
    else:
        wrapper = True
    rec["route"] = route
    return wrapper
