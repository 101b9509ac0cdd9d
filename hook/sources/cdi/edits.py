"""CDI container edits: the values, their merge, and how they change an OCI config.

Rule: edits are applied in the reference order, env → device nodes (+ one cgroup allow rule
per b/c node) → net devices → mounts (replace by destination, then a stable sort by path depth
after a Go-style ``path.Clean``) → hooks (appended to their stage) → intelRdt → additionalGids.
Applying is pure: the input config is never changed, a new dict is returned. No I/O here.
"""

from __future__ import annotations

import copy
from typing import Any

from hook.core.errors import InputError
from hook.core.plan import Node
from hook.core.record import field, record, replace
from hook.core.rules import Access, DeviceType, Rule

__all__ = [
    "CdiDeviceNode",
    "Mount",
    "Hook",
    "NetDevice",
    "IntelRdt",
    "ContainerEdits",
    "HOOK_STAGES",
    "merge",
    "go_clean",
    "cgroup_access",
    "apply_to_config",
    "node_entry",
    "mount_entry",
    "to_nodes_and_rules",
    "with_nodes",
]

HOOK_STAGES: tuple[str, ...] = (
    "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop",
)


@record
class CdiDeviceNode:
    """A CDI ``deviceNodes`` entry; type/major/minor/file_mode may be None until filled."""

    path: str
    host_path: str = ""
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    permissions: str = ""
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    source: str = field(default="", compare=False)  # spec file, for error messages
    field: str = field(default="", compare=False)  # e.g. devices[0].containerEdits.deviceNodes[1]


@record
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""


@record
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@record
class NetDevice:
    host_interface_name: str
    name: str


@record
class IntelRdt:
    clos_id: str = ""
    l3_cache_schema: str = ""
    mem_bw_schema: str = ""
    schemata: tuple[str, ...] = ()
    enable_monitoring: bool = False

    def to_oci(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("closID", self.clos_id), ("l3CacheSchema", self.l3_cache_schema),
                           ("memBwSchema", self.mem_bw_schema), ("schemata", list(self.schemata)),
                           ("enableMonitoring", self.enable_monitoring)):
            if value:
                out[key] = value
        return out


@record
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[CdiDeviceNode, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.net_devices or self.mounts or self.hooks
                    or self.intel_rdt is not None or self.additional_gids)

    def to_json(self) -> dict[str, Any]:
        """The CDI ``containerEdits`` shape (canonical keys, empty parts left out)."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [_node_json(n) for n in self.device_nodes]
        if self.net_devices:
            out["netDevices"] = [{"hostInterfaceName": n.host_interface_name, "name": n.name}
                                 for n in self.net_devices]
        if self.mounts:
            out["mounts"] = [_mount_oci(m, cdi=True) for m in self.mounts]
        if self.hooks:
            out["hooks"] = [{"hookName": h.hook_name, **_hook_oci(h)} for h in self.hooks]
        if self.intel_rdt is not None:
            out["intelRdt"] = self.intel_rdt.to_oci()
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out


def _node_json(n: CdiDeviceNode) -> dict[str, Any]:
    pairs = (("path", n.path), ("hostPath", n.host_path or None), ("type", n.type), ("major", n.major),
             ("minor", n.minor), ("permissions", n.permissions or None), ("fileMode", n.file_mode),
             ("uid", n.uid), ("gid", n.gid))
    return {k: v for k, v in pairs if v is not None}


def merge(*parts: ContainerEdits) -> ContainerEdits:
    """Concatenate edits in order (the reference ``Append``); the last ``intelRdt`` wins."""
    rdt = None
    for part in parts:
        if part.intel_rdt is not None:
            rdt = part.intel_rdt
    return ContainerEdits(
        env=tuple(e for p in parts for e in p.env),
        device_nodes=tuple(d for p in parts for d in p.device_nodes),
        net_devices=tuple(d for p in parts for d in p.net_devices),
        mounts=tuple(m for p in parts for m in p.mounts),
        hooks=tuple(h for p in parts for h in p.hooks),
        intel_rdt=rdt,
        additional_gids=tuple(g for p in parts for g in p.additional_gids),
    )


def go_clean(path: str) -> str:
    """Go's ``path.Clean``: collapse ``//``, drop ``.``, resolve ``..`` lexically; ``""`` → ``"."``."""
    rooted = path.startswith("/")
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not rooted:
                out.append("..")
            continue
        out.append(part)
    text = "/".join(out)
    if rooted:
        return "/" + text
    return text or "."


def cgroup_access(permissions: str) -> str:
    """CDI permissions → cgroup access: ``""`` means ``rwm``, ``"none"`` means no access."""
    if permissions == "":
        return "rwm"
    if permissions == "none":
        return ""
    return permissions


def _section(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        value = {}
        obj[key] = value
    return value


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        value = []
        obj[key] = value
    return value


def _apply_env(config: dict[str, Any], env: tuple[str, ...]) -> None:
    current = _list(_section(config, "process"), "env")
    index = {str(e).partition("=")[0]: i for i, e in enumerate(current)}
    for entry in env:
        key = entry.partition("=")[0]
        if key in index:
            current[index[key]] = entry
        else:
            index[key] = len(current)
            current.append(entry)


def node_entry(config: dict[str, Any], node: CdiDeviceNode) -> dict[str, Any]:
    """The ``linux.devices`` entry applying ``node`` writes (uid/gid default to the process user's)."""
    process = config.get("process")
    user = process.get("user") if isinstance(process, dict) else None
    user = user if isinstance(user, dict) else {}
    uid = node.uid if node.uid is not None else (user.get("uid") or None)
    gid = node.gid if node.gid is not None else (user.get("gid") or None)
    entry = {"path": node.path, "type": node.type, "major": node.major, "minor": node.minor,
             "fileMode": node.file_mode, "uid": uid, "gid": gid}
    return {k: v for k, v in entry.items() if v is not None}


def _apply_device_nodes(config: dict[str, Any], nodes: tuple[CdiDeviceNode, ...]) -> None:
    """The reference's ``RemoveDevice`` (the first same-path entry) then ``AddDevice`` (replace the
    next same-path entry in place, else append)."""
    if not nodes:
        return
    linux = _section(config, "linux")
    for node in nodes:
        entry = node_entry(config, node)
        devices = list(_list(linux, "devices"))
        same = [i for i, d in enumerate(devices) if isinstance(d, dict) and d.get("path") == node.path]
        if same:
            del devices[same[0]]  # RemoveDevice: the first entry at the path
        if len(same) > 1:
            devices[same[1] - 1] = entry  # AddDevice: a second one is replaced in place
        else:
            devices.append(entry)
        linux["devices"] = devices
        if node.type in ("b", "c"):
            rule = {"allow": True, "type": node.type, "major": node.major, "minor": node.minor,
                    "access": cgroup_access(node.permissions)}
            _list(_section(linux, "resources"), "devices").append(rule)


def _mount_oci(m: Mount, *, cdi: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"hostPath": m.host_path, "containerPath": m.container_path} if cdi else {
        "source": m.host_path, "destination": m.container_path}
    if m.options:
        out["options"] = list(m.options)
    if m.type:
        out["type"] = m.type
    return out


def _has_userns(config: dict[str, Any]) -> bool:
    namespaces = config.get("linux", {}).get("namespaces") or []
    return any(isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces)


def mount_entry(config: dict[str, Any], m: Mount) -> dict[str, Any]:
    """The ``mounts`` entry applying ``m`` writes (with a user namespace, bind mounts id-mapped)."""
    entry = _mount_oci(m)
    options = entry.get("options", [])
    if _has_userns(config) and not ({"idmap", "ridmap"} & set(options)):
        if "rbind" in options:  # recursive bind: the recursive id-mapping, never plain idmap
            entry["options"] = [*options, "ridmap"]
        elif m.type == "bind" or "bind" in options:
            entry["options"] = [*options, "idmap"]
    return entry


def _apply_mounts(config: dict[str, Any], mounts: tuple[Mount, ...]) -> None:
    if not mounts:
        return
    current = _list(config, "mounts")
    for m in mounts:
        for i, old in enumerate(current):
            if isinstance(old, dict) and old.get("destination") == m.container_path:
                del current[i]
                break
        current.append(mount_entry(config, m))
    current.sort(key=lambda mt: go_clean(str(mt.get("destination", ""))).count("/"))


def _hook_oci(h: Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"path": h.path}
    if h.args:
        out["args"] = list(h.args)
    if h.env:
        out["env"] = list(h.env)
    if h.timeout is not None:
        out["timeout"] = h.timeout
    return out


def _apply_gids(config: dict[str, Any], gids: tuple[int, ...]) -> None:
    if not gids:
        return
    current = _list(_section(_section(config, "process"), "user"), "additionalGids")
    for gid in gids:
        if gid != 0 and gid not in current:
            current.append(gid)


def apply_to_config(config: dict[str, Any], edits: ContainerEdits) -> dict[str, Any]:
    """A new OCI config with ``edits`` applied in the reference order (``config`` is untouched)."""
    out = copy.deepcopy(config)
    if edits.env:
        _apply_env(out, edits.env)
    _apply_device_nodes(out, edits.device_nodes)
    for net in edits.net_devices:
        _section(_section(out, "linux"), "netDevices")[net.host_interface_name] = {"name": net.name}
    _apply_mounts(out, edits.mounts)
    for hook in edits.hooks:
        _list(_section(out, "hooks"), hook.hook_name).append(_hook_oci(hook))
    if edits.intel_rdt is not None:
        _section(out, "linux")["intelRdt"] = edits.intel_rdt.to_oci()
    _apply_gids(out, edits.additional_gids)
    return out


def to_nodes_and_rules(edits: ContainerEdits) -> tuple[tuple[Node, ...], tuple[Rule, ...]]:
    """Live-plan form: one Node per char/block node, one allow Rule per node with access.

    Nodes must be filled (``hostnodes.fill``); ``u`` counts as a char device, fifos are skipped.
    """
    nodes: list[Node] = []
    rules: list[Rule] = []
    for n in edits.device_nodes:
        if n.type == "p":
            continue
        if n.type not in ("b", "c", "u") or n.major is None or n.minor is None:
            raise InputError(n.source, f"{n.field}.type", f"device node {n.path} has no type/major/minor")
        if not go_clean(n.path).startswith("/dev/"):  # a valid spec may say "dev/x"; we create only in /dev
            raise InputError(n.source, f"{n.field}.path",
                             f"device node {n.path!r}: the hook creates device nodes only under /dev")
        kind = "b" if n.type == "b" else "c"
        nodes.append(Node(path=n.path, type=kind, major=n.major, minor=n.minor,
                          file_mode=0o666 if n.file_mode is None else n.file_mode & 0o7777,
                          uid=n.uid or 0, gid=n.gid or 0))
        access = Access.parse(cgroup_access(n.permissions))
        if access != Access.NONE and n.type in ("b", "c"):
            rules.append(Rule(allow=True, type=DeviceType(kind), major=n.major, minor=n.minor, access=access))
    return tuple(nodes), tuple(rules)


def with_nodes(edits: ContainerEdits, nodes: tuple[CdiDeviceNode, ...]) -> ContainerEdits:
    """``edits`` with its device nodes replaced (used by ``hostnodes.fill``)."""
    return replace(edits, device_nodes=nodes)
