"""Fill CDI device nodes from the host: type, major/minor and file mode by ``lstat``.

Rule: the host node is ``driver_root / (hostPath or path)``, looked at with ``lstat`` (a
symlink is never followed, so it is "not a device node"). A node that already names its type
and major (or is a fifo) is "minimal": a missing host node is then fine. Otherwise a missing
node, a non-device or a type mismatch is an InputError naming the spec file and the field (a
``u`` node without a major always mismatches: lstat reports ``c``, as in the reference).
A set major keeps the spec's major/minor; an unset (0 or absent) major takes both from the host.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.errors import InputError
from hook.core.record import replace as _replace
from hook.sources.cdi.edits import CdiDeviceNode, ContainerEdits, with_nodes

__all__ = ["fill", "fill_node"]

_HOST_TYPES = ((stat.S_ISBLK, "b"), (stat.S_ISCHR, "c"), (stat.S_ISFIFO, "p"))


def _host_file(driver_root: Path, node: CdiDeviceNode) -> Path:
    return driver_root / (node.host_path or node.path).lstrip("/")


def _is_minimal(node: CdiDeviceNode) -> bool:
    return bool(node.type) and (bool(node.major) or node.type == "p")


def fill_node(node: CdiDeviceNode, driver_root: Path) -> CdiDeviceNode:
    """One node with its missing details taken from the host node."""
    host = _host_file(driver_root, node)
    field = f"{node.field}.{'hostPath' if node.host_path else 'path'}"
    try:
        st = os.lstat(host)
    except OSError as exc:
        if _is_minimal(node):
            return node
        raise InputError(node.source, field, f"host device node {host} not found: {exc.strerror}") from exc
    file_mode = node.file_mode if node.file_mode is not None else stat.S_IMODE(st.st_mode)
    if _is_minimal(node):
        return _replace(node, file_mode=file_mode)
    host_type = next((t for test, t in _HOST_TYPES if test(st.st_mode)), None)
    if host_type is None:
        raise InputError(node.source, field, f"{host} is not a device node")
    if node.type and node.type != host_type:  # "u" too: a host node is never "u" (the reference's check)
        raise InputError(node.source, f"{node.field}.type",
                         f"type {node.type!r} does not match host node {host} (type {host_type!r})")
    node_type = node.type or host_type
    if host_type == "p":
        return _replace(node, type=node_type, file_mode=file_mode)
    if node.major:
        return _replace(node, type=node_type, file_mode=file_mode)
    return _replace(node, type=node_type, file_mode=file_mode,
                    major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))


def fill(edits: ContainerEdits, driver_root: Path) -> ContainerEdits:
    """``edits`` with every device node filled from ``driver_root`` (see the module rule)."""
    return with_nodes(edits, tuple(fill_node(n, driver_root) for n in edits.device_nodes))
