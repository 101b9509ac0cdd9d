"""What part of a CDI edit an OCI config does not already hold, exactly.

Rule: a CDI-aware engine (CRI-O, containerd with CDI on) applies the edits itself, and applying
them again would repeat mounts, hooks and cgroup rules; an engine that did not leaves them to us.
"Already there" is read the way the reference library would overwrite it: a node is there only
when the first ``linux.devices`` entry at its path is the same entry (type, major, minor, and the
``fileMode``, ``uid`` and ``gid`` the edit writes: the reference replaces the node whole; the
first is also the one runc creates, a later one fails with EEXIST and is ignored), a mount only
when the first entry at its destination has the same source, options and type. Anything else is
applied, which replaces that entry (the reference's ``RemoveDevice``/``AddDevice``,
``RemoveMount``/``AddMount``). Pure; no I/O.
"""

from __future__ import annotations

from typing import Any

from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits, Mount, mount_entry, node_entry

__all__ = ["pending"]


# what the reference's AddDevice writes: the whole entry replaces the config's (nothing of the old
# node is kept), so a config node that differs in any of these is not "already there"
NODE_FIELDS = ("type", "major", "minor", "fileMode", "uid", "gid")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _same(key: str, old: Any, new: Any) -> bool:
    """One field of two device entries; ``u`` (unbuffered) is a char device to runc, as ``c``."""
    if key == "type":
        old, new = ("c" if v == "u" else v for v in (old, new))
    return bool(old == new)


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _first(items: Any, key: str, value: str) -> dict[str, Any] | None:
    """The first entry whose ``key`` is ``value``: the one the reference library replaces (and, for
    ``linux.devices``, the one runc creates: a later node at the same path fails with EEXIST, ignored)."""
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get(key) == value:
            return item
    return None


def pending(config: dict[str, Any], edits: ContainerEdits) -> ContainerEdits:
    """The part of ``edits`` the config does not already hold exactly (the module's rule)."""
    process, linux = _dict(config.get("process")), _dict(config.get("linux"))
    env = {e for e in _items(process.get("env")) if isinstance(e, str)}
    devices, mounts = linux.get("devices"), config.get("mounts")

    def node_there(n: CdiDeviceNode) -> bool:
        old, new = _first(devices, "path", n.path), node_entry(config, n)
        return old is not None and all(_same(k, old.get(k), new.get(k)) for k in NODE_FIELDS)

    def mount_there(m: Mount) -> bool:
        old, new = _first(mounts, "destination", m.container_path), mount_entry(config, m)
        return old is not None and all(
            (old.get(k) or None) == (new.get(k) or None) for k in ("source", "options", "type")
        )

    hooks = {  # as text: a config's values may be of any JSON type (unhashable ones too)
        repr((stage, h.get("path"), h.get("args") or []))
        for stage, items in _dict(config.get("hooks")).items() if isinstance(items, list)
        for h in items if isinstance(h, dict)
    }
    user = _dict(process.get("user"))
    gids = {g for g in _items(user.get("additionalGids")) if isinstance(g, int)}
    nets = _dict(linux.get("netDevices"))
    rdt = edits.intel_rdt
    return ContainerEdits(
        env=tuple(e for e in edits.env if e not in env),
        device_nodes=tuple(n for n in edits.device_nodes if not node_there(n)),
        net_devices=tuple(
            d for d in edits.net_devices if nets.get(d.host_interface_name) != {"name": d.name}
        ),
        mounts=tuple(m for m in edits.mounts if not mount_there(m)),
        hooks=tuple(h for h in edits.hooks if repr((h.hook_name, h.path, list(h.args))) not in hooks),
        intel_rdt=None if rdt is None or linux.get("intelRdt") == rdt.to_oci() else rdt,
        additional_gids=tuple(g for g in edits.additional_gids if g != 0 and g not in gids),
    )
