"""Which parts of a container's ``/dev`` are the host's own ``/dev``, read from config.json's mounts.

Rule: a device node may only be created or removed on a ``/dev`` that belongs to this container
alone. A plugin or monitoring pod with a ``hostPath: /dev`` volume (or ``/dev/nvidia-caps``, or
one node) bind-mounts the host's tree: unlinking "its" ``/dev/nvidia0`` would remove the host's.
This module only answers "is container path P on a host mount?" from the mount list, so
``decide`` can make narrowing cgroup-only there; ``apply.devnodes`` checks the same thing again
on the live filesystem (``st_dev``, no mount crossing), because a source path can hide the host's
``/dev`` behind a symlink or another bind that no config text reveals.

A mount shares the host's ``/dev`` when it is a bind of a path at or below one of the host's
``/dev`` directories (``/dev``, and ``<driver-root>/dev`` for a containerised driver), or a
``devtmpfs`` mount (the kernel has one devtmpfs: mounting it again shows the host's nodes). The
mount that governs a path is the last one in the list at that path or above it, as the runtime
mounts them in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hook.core.kpath import container_path, host_source, lexical
from hook.core.oci import Mount

__all__ = ["HOST_DEV", "host_dev_roots", "shared_mount", "shares_host_dev"]

HOST_DEV = "/dev"


def host_dev_roots(driver_root: str) -> tuple[str, ...]:
    """The host's ``/dev`` directories as a mount source would name them."""
    extra = lexical("/" + driver_root + "/dev")
    return (HOST_DEV,) if extra == HOST_DEV else (HOST_DEV, extra)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _is_bind(m: Mount) -> bool:
    return m.type == "bind" or "bind" in m.options or "rbind" in m.options


def shares_host_dev(m: Mount, roots: Iterable[str], bundle: str = "") -> bool:
    """The mount shows (part of) the host's ``/dev`` inside the container. Paths are compared as
    the kernel resolves them (``//dev`` is ``/dev``; ``hook.core.kpath``); a relative source the hook
    cannot place (no bundle) counts as the host's ``/dev``: narrowing there is then cgroup-only."""
    if m.type == "devtmpfs":
        return True
    if not _is_bind(m):
        return False
    source = host_source(m.source, bundle)
    return source is None or any(_under(source, lexical(root)) for root in roots)


def shared_mount(
    mounts: Sequence[Mount], path: str, roots: Iterable[str], bundle: str = ""
) -> tuple[int, Mount] | None:
    """The host ``/dev`` mount (index, mount) that governs container ``path``, or None. A relative
    destination is below ``/``, as runc mounts it."""
    path = container_path(path)
    roots = tuple(roots)
    for i in range(len(mounts) - 1, -1, -1):
        if _under(path, container_path(mounts[i].destination)):
            return (i, mounts[i]) if shares_host_dev(mounts[i], roots, bundle) else None
    return None
