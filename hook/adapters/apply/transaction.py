"""Apply one whole Plan to a live container, or leave the container exactly as it was.

Rule: the steps run in a fixed order (locate → device cgroup → device nodes) and each step that
changed something registers how to undo it before the next step starts; if any step fails,
every registered undo runs, newest first, and the caller gets one ``ApplyError`` naming the
step that failed (and any undo that failed too). Nothing here decides anything: the Plan is
complete before ``apply_plan`` is called.
"""

from __future__ import annotations

from hook.adapters.apply import locate
from hook.adapters.apply.cgroup_v1 import CgroupV1
from hook.core.errors import ApplyError, HookError
from hook.core.kpath import container_path
from hook.core.record import field, record, replace

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from os import PathLike
    from typing import Any, Protocol

    from hook.core.plainplan import PlainPlan, PlainRule
    from hook.core.plan import Plan
    from hook.core.rules import Rule
else:
    Protocol = object  # DeviceCgroup is only a type-checking interface

__all__ = ["AppliedInfo", "DeviceCgroup", "apply_plan", "cgroup_adapter"]


class DeviceCgroup(Protocol):
    """What both cgroup writers offer (``CgroupV1``, ``cgroup_v2.CgroupV2``)."""

    def apply(self, rules: tuple[Rule | PlainRule, ...], normalized: bool = False) -> Any: ...

    def rollback(self) -> None: ...


@record
class AppliedInfo:
    """What was applied, for the log line and the report."""

    cgroup_version: int
    cgroup_path: str = ""
    program_ids: dict[str, Any] = field(default_factory=dict)
    created: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (container path, why): node changes left to the cgroup


def cgroup_adapter(target: locate.CgroupTarget) -> DeviceCgroup:
    """The writer for the located cgroup; v2 is imported only when needed (it loads ctypes bpf)."""
    if target.version == 2:
        from hook.adapters.apply.cgroup_v2 import CgroupV2

        return CgroupV2(target.path)
    return CgroupV1(target.path)


def _program_ids(applied: Any) -> dict[str, Any]:
    """The v2 writer's program ids for the log: what it replaced, what is attached now (v1 has none)."""
    if not hasattr(applied, "new_ids"):
        return {}
    return {"replaced": list(applied.old_ids), "attached": list(applied.new_ids), "changed": applied.changed}


def _fail(
    step: str, exc: Exception, undos: list[tuple[str, Callable[[], None]]], where: str = ""
) -> ApplyError:
    """Run every undo (newest first) and build the one error the caller sees.

    The line reads ``<file>: <step>[: <operation>]: <reason>``: the step once, the file (or the
    container path) that failed, and each failed undo after it. An inner error that names no
    path (``bpf(2)``) is put on ``where``, the step's own directory.
    """
    problems = []
    for name, undo in reversed(undos):
        try:
            undo()
        except Exception as undo_exc:  # keep undoing the rest; report all
            problems.append(f"undo {name} failed: {undo_exc}")
    if isinstance(exc, HookError):
        file, detail, reason = exc.file, exc.field, exc.reason
        if where and not file.startswith("/"):
            file, detail = where, " ".join(p for p in (file, detail) if p)
    elif isinstance(exc, OSError):
        file, detail, reason = str(exc.filename or ""), "", exc.strerror or str(exc)
    else:
        file, detail, reason = "", "", str(exc)
    field = f"{step}: {detail}" if detail and detail != step else step
    reason += "".join(f"; {p}" for p in problems)
    return ApplyError(file or step, field if file else "", reason)


def apply_plan(
    plan: Plan | PlainPlan,
    pid: int,
    *,
    proc: str | PathLike[str] = "/proc",
    rootfs: str | None = None,
    target: locate.CgroupTarget | None = None,
    host_dev: Sequence[str] = ("/dev",),
    in_thread: bool = False,
) -> AppliedInfo:
    """Apply ``plan`` to the container whose init is ``pid``; all or nothing. The decision core's
    ``Plan`` and the wire's ``PlainPlan`` (what a decision carries, ``hook.routes.decision``) apply alike.

    ``rootfs`` is the bundle's root path on the host (needed before pivot_root, i.e. for runc
    prestart/createRuntime hooks; see ``devnodes``). ``target`` is the cgroup already located
    (and checked to be the container's, ``locate.find_container``); ``host_dev`` the host's
    ``/dev`` directories, which node changes never touch; ``in_thread``: node changes join the
    container's namespace in a thread, not a forked child (``devnodes``: the per-start hook, hook nri).
    """
    undos: list[tuple[str, Callable[[], None]]] = []
    if target is None:
        try:
            target = locate.find(pid, proc)
        except (HookError, OSError) as exc:
            raise _fail("locate cgroup", exc, undos) from exc
    info: dict[str, Any] = {"cgroup_version": target.version, "cgroup_path": str(target.path)}
    if plan.rules:
        step = f"cgroup v{target.version}"
        try:
            cgroup = cgroup_adapter(target)
            undos.append(("cgroup", cgroup.rollback))
            normal = getattr(plan, "normal", ())  # a PlainPlan's, normalized where it was decided
            if target.version == 2 and normal:
                applied = cgroup.apply(tuple(normal), normalized=True)
            else:
                applied = cgroup.apply(tuple(plan.rules))
            info["program_ids"] = _program_ids(applied)
        except (HookError, OSError, ValueError) as exc:
            raise _fail(step, exc, undos, str(target.path)) from exc
    if plan.create or plan.remove:
        from hook.adapters.apply import devnodes  # _ctypes (setns, openat2): only a plan with nodes

        try:
            # the paths runc created the nodes at: //dev/x is /dev/x (devnodes refuses any other spelling)
            create = [replace(n, path=container_path(n.path)) for n in plan.create]
            remove = [container_path(p) for p in plan.remove]
            undo = devnodes.apply(
                pid, create, remove, rootfs=rootfs, proc=proc, host_dev=host_dev, in_thread=in_thread
            )
        except (HookError, OSError) as exc:
            raise _fail("device nodes", exc, undos) from exc
        undos.append(("device nodes", undo.run))
        info["created"], info["removed"], info["skipped"] = undo.created, undo.removed, undo.skipped
    return AppliedInfo(**info)
