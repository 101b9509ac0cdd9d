"""The host's device nodes as a decision sees them: accelerators under the driver root, and the
majors and nodes the spec-level allow-list must know.

Rule: numbers come from the host's own nodes (``lstat``, never followed), never guessed; an
unreadable part of the tree is simply not there (the decision gets narrower, never wider).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.core.errors import InputError
from hook.core.plan import Node
from hook.core.requests import is_accelerator

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from hook.adapters.allowlist import HostDevices

__all__ = ["host_devices", "host_node", "node_of", "scan_accelerators"]


def host_node(driver_root: Path, path: str, source: str) -> Node:
    """A plugin DeviceSpec host path: its numbers come from the host node itself, never guessed."""
    host = driver_root / path.lstrip("/")
    try:
        st = os.lstat(host)
    except OSError as exc:
        raise InputError(source, path, f"host device node {host}: {exc.strerror}") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise InputError(source, path, f"{host} is not a device node")
    return node_of(path, st)



def node_of(path: str, st: os.stat_result) -> Node:
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
    """Every accelerator char node under ``<driver-root>/dev`` (two levels: dri/, nvidia-caps/).

    A resident process (``hook.sources.warm`` on) keeps the nodes while every char node's path,
    mode and numbers (each ``lstat``-ed, as before) and the patterns are the same: the nodes are a
    function of those alone, and building them is most of a big node's scan."""
    from hook.sources import warm

    base = os.path.join(driver_root, "dev")
    chars: list[tuple[str, int, int]] = []

    def walk(directory: str, rel: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in entries:
            name = f"{rel}{e.name}"
            if e.is_dir(follow_symlinks=False) and depth < 2:
                walk(e.path, name + "/", depth + 1)
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISCHR(st.st_mode):
                chars.append(("/dev/" + name, st.st_mode, st.st_rdev))

    walk(base, "", 0)
    if not warm.enabled():
        return _accelerators(chars, patterns)
    seen = tuple(chars)
    named = tuple(sorted((vendor, tuple(globs)) for vendor, globs in patterns.items()))
    return warm.remembered(("accelerators", base, named), seen, lambda: _accelerators(seen, patterns))


def _accelerators(chars: Sequence[tuple[str, int, int]], patterns: Any) -> tuple[Node, ...]:
    found = [
        Node(path=path, type="c", major=os.major(rdev), minor=os.minor(rdev), file_mode=stat.S_IMODE(mode))
        for path, mode, rdev in chars
        if is_accelerator(path, patterns)
    ]
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

