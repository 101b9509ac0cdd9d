"""Whether a spec-level decision still needs the crun guard, answered with ``os`` alone.

Rule: the guard (``hook.routes.crunguard``) protects only a container whose config is about to
reach crun with its systemd cgroup driver. Its load (``json``, the OCI parser, ``pathlib``, ``re``)
is paid only by a start it may refuse: ``needs_guard`` is false exactly where ``crunguard.refusal``
returns None before it looks at the host, and in no other case. It reads the same facts in the
same order (the decision's ``may_widen``; the manager from the wrapper's command line, else the
form of the config's ``linux.cgroupsPath``; the binary the wrapper execs, resolved as its own
``runtime_kind`` resolves it) and reads them fail-closed: no manager named and a path that may be
the systemd form, or no binary named (hooks.d precreate, simulation), or one whose name is not
``runc`` (crun, a front, a wrapper script) all run the guard.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["EXEC_ENV", "MANAGER_ENV", "needs_guard", "resolved_name", "which"]

MANAGER_ENV = "OCI_DEVICE_HOOK_CGROUP_MANAGER"  # the wrapper: the manager the command line names
EXEC_ENV = "OCI_DEVICE_HOOK_RUNTIME_EXEC"  # the wrapper: the runtime binary it execs after the decision


def which(name: str) -> str | None:
    """``shutil.which(name)`` on POSIX (the first executable file of that name on ``PATH``, or the
    name itself when it holds a slash and is one) without importing ``shutil``."""

    def runnable(path: str) -> bool:
        return os.path.exists(path) and os.access(path, os.F_OK | os.X_OK) and not os.path.isdir(path)

    if os.path.dirname(name):
        return name if runnable(name) else None
    path = os.environ.get("PATH")
    if path is None:
        try:
            path = os.confstr("CS_PATH")
        except (AttributeError, ValueError):
            path = None
        path = path or os.defpath
    if not path:  # PATH='' finds nothing (PATH=':' is the current directory)
        return None
    seen: set[str] = set()
    for directory in path.split(os.pathsep):
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, name)
        if runnable(candidate):
            return candidate
    return None


def resolved_name(runtime: str) -> str:
    """The name of the file ``runtime`` (a name on ``PATH`` or a path) runs, symlinks followed."""
    return os.path.basename(os.path.realpath(which(runtime) or runtime))


def needs_guard(may_widen: bool, systemd_path: bool, environ: Mapping[str, str]) -> bool:
    """False only where the guard could not refuse: no rule crun's driver widens, a manager that
    is not systemd, or a runtime that is runc by its resolved name (the module's rule)."""
    if not may_widen:
        return False
    manager = environ.get(MANAGER_ENV) or ("systemd" if systemd_path else "cgroupfs")
    if manager != "systemd":
        return False
    runtime = environ.get(EXEC_ENV, "")
    return not (runtime and resolved_name(runtime) == "runc")
