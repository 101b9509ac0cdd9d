"""The identity of everything an inventory load reads from a driver root, as one value.

Rule: a resident process (``hook serve``, ``hook nri``) keeps the whole loaded inventory while this
value is unchanged (``hook.sources.nvidia.inventory``), instead of rebuilding it per container from
per-file views. It is taken with one system call per file the load reads, and before the load (a
change during it makes the next call load again, never keeps a stale one):

- the small procfs files whose identity says nothing when their text changes (boot id, driver
  version, ``/proc/devices``: procfs reports size 0 and the inode's own times): their text;
- every GPU's ``information`` file and every capability file under ``capabilities/`` (the names
  found, each with ``(dev, inode, size, mtime_ns, ctime_ns)``: the identity the per-file views and
  the inventory cache's incarnations already use);
- every entry of ``/dev/nvidia-caps`` (name, mode, owner, numbers, inode, ctime, never followed),
  but for a minor a capability file already describes (the load never reads that node: only its
  name is kept), and none without mig-minors (no MIG support: the load reads none);
- the inventory cache file's identity.

Anything that cannot be read is part of the value as such (``None``), so a file appearing later
changes it; entries are in the order the directory lists them (another order only loads again).
Off (``None``) while ``hook.sources.warm`` is off: the per-start hook pays nothing.
"""

from __future__ import annotations

import os
import stat

from hook.sources.nvidia.migminors import CAPS_DEV_DIR, CAPS_PROC_DIR

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["fingerprint"]

_SMALL = ("proc/sys/kernel/random/boot_id", "proc/driver/nvidia/version", "proc/devices")
_GPUS = "proc/driver/nvidia/gpus"


def _text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return None


def _id(path: str) -> tuple[int, int, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _dirs(path: str, prefix: str = "") -> list[str]:
    try:
        with os.scandir(path) as it:
            return [e.name for e in it if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return []


def _caps(base: str, minor_of: Mapping[str, int], covered: set[int]) -> Iterator[object]:
    """``mig/{config,monitor}`` and ``gpuN/mig/giI[/ciC]/access``, as ``procfs`` walks them; the
    minor of each regular file mig-minors lists goes into ``covered``."""

    def file(name: str, path: str) -> object:
        found = _id(path)
        if found is not None and stat.S_ISREG(found[0]) and name in minor_of:
            covered.add(minor_of[name])
        return name, found

    for name in ("config", "monitor"):
        yield file(name, f"{base}/mig/{name}")
    for gpu in _dirs(base, "gpu"):
        mig = f"{base}/{gpu}/mig"
        for gi in _dirs(mig, "gi"):
            yield file(f"{gpu}/{gi}/access", f"{mig}/{gi}/access")
            for ci in _dirs(f"{mig}/{gi}", "ci"):
                yield file(f"{gpu}/{gi}/{ci}/access", f"{mig}/{gi}/{ci}/access")


def _dev_caps(path: str, covered: set[int]) -> Iterator[object]:
    """Each ``nvidia-capN`` node's lstat, but for a minor a capability file already describes:
    the load reads a node only for a listed minor no file describes (``build_cap_table``)."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        yield None
        return
    for e in entries:
        suffix = e.name.removeprefix("nvidia-cap")
        if suffix.isdigit() and int(suffix) in covered:
            yield e.name
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            yield e.name, None
            continue
        yield e.name, st.st_mode, st.st_uid, st.st_gid, st.st_rdev, st.st_ino, st.st_ctime_ns


def fingerprint(
    driver_root: str, cache_file: str | None, minor_of: Mapping[str, int] | None
) -> tuple[object, ...] | None:
    """The value (see the module rule); ``None`` while warm views are off. ``minor_of``: the
    mig-minors table of this boot and driver build (``None``: no MIG support, and no node read)."""
    from hook.sources import warm

    if not warm.enabled():
        return None
    root = str(driver_root)
    gpus = os.path.join(root, _GPUS)
    covered: set[int] = set()
    return (
        tuple(_text(os.path.join(root, p)) for p in _SMALL),
        tuple((b, _id(f"{gpus}/{b}/information")) for b in _dirs(gpus)),
        minor_of is not None,
        tuple(_caps(os.path.join(root, CAPS_PROC_DIR), minor_of or {}, covered)),
        tuple(_dev_caps(os.path.join(root, CAPS_DEV_DIR), covered)) if minor_of is not None else (),
        None if cache_file is None else _id(cache_file),
    )
