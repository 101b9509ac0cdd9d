"""``hook doctor``'s crun line: where crun, the systemd cgroup driver and a minor-0 accelerator meet.

Rule: a warning (``!``), never a failure: crun's systemd driver reads a 0 in a device rule as a
wildcard (``hook.core.crunsd``), so on such a node the engine's own rule for GPU 0 (``c 195:0``)
becomes ``DeviceAllow=char-195`` and the hook refuses spec-level configs that would carry one
(``hook.routes.crunguard``). The three facts are read from the node as it is: a ``crun`` binary
(the usual paths, or the ``runtime`` setting), systemd as init (engines then default to its
driver), and an accelerator node (the ``accelerator_nodes`` globs) with minor 0 under the
driver root's ``/dev``. Which engine runs which runtime with which driver is not read here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hook.tools.checks import Check

__all__ = ["check_crun_systemd"]

NAME = "crun systemd driver"
CRUN_PATHS = ("usr/bin/crun", "usr/local/bin/crun", "bin/crun", "usr/sbin/crun")
FIX = ("run GPU containers with runc, or with crun's cgroupfs driver (--cgroup-manager=cgroupfs), "
       "or use crun 1.23+ on cgroup v2, whose systemd driver hands systemd its own eBPF program")


def _minor_zero_accelerators(driver_root: Path, patterns: dict[str, tuple[str, ...]]) -> list[str]:
    from hook.core.requests import is_accelerator

    found: list[str] = []
    dev = driver_root / "dev"

    def walk(directory: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for e in sorted(entries, key=lambda e: e.name):
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 2:
                walk(Path(e.path), depth + 1)
            elif stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == 0:
                path = "/dev/" + str(Path(e.path).relative_to(dev))
                if is_accelerator(path, patterns):
                    found.append(f"{path} ({os.major(st.st_rdev)}:0)")

    walk(dev, 0)
    return found


def check_crun_systemd(driver_root: Path, host_root: Path = Path("/"), runtime: str = "runc",
                       patterns: dict[str, tuple[str, ...]] | None = None) -> Check:
    """``!`` when crun, systemd and a minor-0 accelerator node are all on this node, else ``✓``."""
    from hook.core.settings import Settings

    crun = [f"/{p}" for p in CRUN_PATHS if (host_root / p).is_file()]
    if os.path.basename(runtime) == "crun":
        crun.insert(0, f"{runtime} (the runtime setting)")
    if not crun:
        return Check(NAME, True, "no crun on this node")
    if not (host_root / "run/systemd/system").is_dir():
        return Check(NAME, True, f"{crun[0]}, but systemd is not init here: no systemd cgroup driver")
    nodes = _minor_zero_accelerators(driver_root, dict(patterns or Settings().accelerator_nodes))
    if not nodes:
        return Check(NAME, True, f"{crun[0]} with systemd, and no accelerator node with minor 0")
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    detail = (f"{crun[0]} with systemd as init and {shown}: crun's systemd cgroup driver reads minor 0 "
              "as every minor (c 195:0 becomes DeviceAllow=char-195: every GPU); the hook refuses "
              "spec-level configs that would carry such a rule for crun, and an engine's own rule for "
              "GPU 0 opens every GPU")
    return Check(NAME, True, detail, FIX, warn=True)


def crun_line(driver_root: Path, host_root: Path, settings_file: Path) -> Check:
    """``check_crun_systemd`` with the node's settings (``runtime``, ``accelerator_nodes``), or the
    defaults when they do not load (the settings line reports why)."""
    from hook.core.errors import HookError
    from hook.sources.settingsfile import load_settings

    try:
        settings = load_settings(settings_file, required=False)
    except HookError:
        return check_crun_systemd(driver_root, host_root)
    return check_crun_systemd(driver_root, host_root, settings.runtime, dict(settings.accelerator_nodes))
