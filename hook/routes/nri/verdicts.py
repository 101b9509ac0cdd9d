"""What the daemon answers at CreateContainer and does at StartContainer (or Synchronize), decided on
the same core as every route: NRI's container as a config, then gather, decide, report.

Rule: the two halves split by who acts.
- **Create** only answers: the nodes to add (the runtime creates them and appends an allow rule
  for each, ``rw``, ``rwm`` for a block device) and, where the runtime applies rules from an
  adjustment (NRI >= 0.10, ``Ctx.rules_applied``), the plan's rules with the trims that bring those
  automatic allows down to the plan's access. A ``deny`` verdict is an error status with the one
  line every route prints. NRI cannot remove a device at create (silently dropped in every
  version) and does not carry capabilities, so create assumes ``CAP_SYS_ADMIN`` for management
  caps and start checks it.
- **Start** (and a late narrowing at Synchronize) decides again on the started container with
  the bounding set read from its checked process (``hook.routes.nri.target``); where the config
  that makes (container, bounding, settings) is exactly the one create decided on, no more than
  ``REUSE_SECONDS`` before, create's decision is that decision and is not made twice
  (``Decided``). It refuses a ``deny``
  and applies only what narrows: the deny rules and trims (cgroup v1 writes, v2 eBPF) and the node
  removals, through ``hook.adapters.apply.transaction`` as the live hook does. It never creates
  a node or writes an allow rule: a grant comes only from the create answer, which the runtime
  applies, so a peer posing as the runtime can narrow a container it names truly, never widen one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hook.core.errors import HookError, InputError
from hook.core.escape import clean
from hook.core.plan import Node, Plan, Verdict
from hook.core.record import field, record, replace
from hook.core.rules import Access, DeviceType, Rule
from hook.routes.nri.messages import Container, Pod, adjustment
from hook.routes.nri.spec import SYS_ADMIN, oci_config, parsed_config
from hook.routes.options import Options
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

__all__ = ["Answer", "Ctx", "on_create", "on_start", "trims"]

PERMISSION_DENIED, FAILED_PRECONDITION = 7, 9  # google.rpc.Code
REUSE_SECONDS = 2.0  # a kubelet starts a container right after creating it


@record
class Decided:
    """Create's decision, which start reuses for the same config (see the module rule)."""

    doc: dict[str, Any]  # the config it was made on (the bounding create assumed included)
    settings: Settings
    host_dev: tuple[str, ...]
    plan: Plan
    report: dict[str, Any]  # before create's stage and duration were added
    at: float  # time.monotonic()


@record
class Ctx:
    """What every decision of one session shares."""

    options: Options = field(default_factory=Options)
    rules_applied: bool = False  # the runtime applies device-cgroup rules from an adjustment
    proc: Path = Path("/proc")


@record
class Answer:
    code: int = 0  # google.rpc.Code for the response; 0: OK
    message: str = ""  # the error status's one line
    payload: bytes = b""
    record: dict[str, Any] | None = None  # the log record, unstamped (None: nothing to log)
    settings: Settings | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    cgroups_path: str = ""
    trims: tuple[Rule, ...] = ()  # create: what start must take back from the runtime's allows
    narrows: bool = False  # create: start has something to apply
    decided: Decided | None = None  # create: its decision, for start


def _settings(ctx: Ctx) -> Settings:
    path = ctx.options.settings_file
    return load_settings(path or DEFAULT_PATH, required=path is not None)


def trims(
    create: tuple[Node, ...], config_rules: tuple[Rule, ...], plan_rules: tuple[Rule, ...]
) -> tuple[Rule, ...]:
    """Denies taking back what the runtime's automatic allow for each added node grants beyond
    what the config's rules and the plan's give it (NRI appends ``rw`` for a char node, ``rwm``
    for a block one, whatever its mode, between the two)."""
    from hook.core.rules import evaluate

    out = []
    for n in create:
        kind = DeviceType(n.type)
        auto = Access.R | Access.W | (Access.M if n.type == "b" else Access.NONE)
        added = Rule(allow=True, type=kind, major=n.major, minor=n.minor, access=auto)
        extra = Access.NONE
        for bit in (Access.R, Access.W, Access.M):
            meant = evaluate((*config_rules, *plan_rules), kind, n.major, n.minor, bit)
            if evaluate((*config_rules, added, *plan_rules), kind, n.major, n.minor, bit) and not meant:
                extra |= bit
        if extra:
            out.append(Rule(allow=False, type=kind, major=n.major, minor=n.minor, access=extra))
    return tuple(out)


def _needs_decision(doc: dict[str, Any], settings: Settings) -> bool:
    from hook.routes.fastpath import needs_decision

    return needs_decision(
        doc, doc["annotations"], settings.cdi_annotation_prefixes, settings.volume_mount_root
    )


def _decide(
    pod: Pod, c: Container, bounding: frozenset[str], settings: Settings, ctx: Ctx, source: str,
    doc: dict[str, Any] | None = None,
) -> tuple[Any, Plan, dict[str, Any]]:  # fmt: skip
    from hook.core.decide import decide
    from hook.core.report import build_report
    from hook.routes.gather import inputs_for_config, resolved

    if doc is None:
        doc = oci_config(pod, c, bounding, settings.cdi_annotation_prefixes[0])
    config = parsed_config(doc, c, source)
    options = resolved(replace(ctx.options, settings=settings), settings)
    inputs = inputs_for_config(config, {}, c.id, options)
    plan = decide(inputs)
    return inputs, plan, build_report(inputs, plan)


def _plain(pod: Pod, c: Container, settings: Settings | None) -> bool:
    """The container asks for no device and is not widened under these settings (defaults when
    they do not load: a container like that always starts)."""
    s = settings or Settings()
    return not _needs_decision(oci_config(pod, c, frozenset(), s.cdi_annotation_prefixes[0]), s)


def _where(c: Container, settings: Settings | None) -> dict[str, Any]:
    return {"settings": settings, "annotations": dict(c.annotations), "cgroups_path": c.cgroups_path}


def _error(
    exc: HookError, c: Container, settings: Settings | None, ctx: Ctx, stage: str, **extra: Any
) -> Answer:
    if settings is None:  # the file does not load: its error goes to the log it still names
        from hook.sources.settingsfile import salvage_log

        settings = salvage_log(ctx.options.settings_file or DEFAULT_PATH)
    record = {"verdict": "error", "stage": stage, "container": {"id": c.id}, "error": str(exc), **extra}
    return Answer(
        code=FAILED_PRECONDITION, message=f"oci-device-hook: {exc}", record=record, **_where(c, settings)
    )


def on_create(pod: Pod, c: Container, ctx: Ctx, t0: float | None = None) -> Answer:
    """The CreateContainer answer (see the module rule); ``t0``: when the request arrived (its
    decoding counts in the record's ``duration_ms``)."""
    t0 = time.monotonic() if t0 is None else t0
    settings: Settings | None = None
    try:
        settings = _settings(ctx)
        assumed = frozenset({SYS_ADMIN})
        doc = oci_config(pod, c, assumed, settings.cdi_annotation_prefixes[0])
        if not _needs_decision(doc, settings):  # it reads no capability: one config serves both
            return Answer()
        inputs, plan, report = _decide(pod, c, assumed, settings, ctx, "NRI CreateContainer", doc)
    except HookError as exc:
        if _plain(pod, c, settings):
            return Answer(record=None)
        return _error(exc, c, settings, ctx, "create")
    decided = Decided(doc=doc, settings=settings, host_dev=tuple(inputs.host_dev), plan=plan,
                      report=dict(report), at=time.monotonic())  # fmt: skip
    report["stage"] = "create"
    report["duration_ms"] = round((time.monotonic() - t0) * 1000, 3)
    if plan.verdict is Verdict.DENY:
        line = f"oci-device-hook: deny: {clean(plan.reason)}"
        return Answer(code=PERMISSION_DENIED, message=line, record=report, **_where(c, settings))
    cut = trims(plan.create, inputs.config.resource_rules, plan.rules)
    rules = (*plan.rules, *cut) if ctx.rules_applied else ()
    narrows = bool(plan.remove) or any(not r.allow for r in plan.rules) or bool(cut)
    return Answer(payload=adjustment(plan.create, rules), record=report if plan.changes else None, trims=cut,
                  narrows=narrows, decided=decided, **_where(c, settings))  # fmt: skip


def _reusable(decided: Decided, doc: dict[str, Any], settings: Settings) -> bool:
    """Create's decision is start's: the same config (bounding read from the process included)
    under the same settings, made no more than ``REUSE_SECONDS`` ago."""
    fresh = time.monotonic() - decided.at <= REUSE_SECONDS
    return fresh and decided.settings == settings and decided.doc == doc


def _found_narrowed(applied: Any, narrowing: Plan) -> bool:
    """The container was narrowed before (by this daemon's previous run): the v2 program was ours
    already, or (v1, which cannot be read back) every node to remove was gone. Only the record's
    label depends on it; the narrowing is applied either way."""
    changed = applied.program_ids.get("changed")
    if applied.removed or applied.skipped:
        return False
    return changed is False if changed is not None else bool(narrowing.remove)


def on_start(
    pod: Pod,
    c: Container,
    ctx: Ctx,
    *,
    late: bool = False,
    cut: tuple[Rule, ...] = (),
    t0: float | None = None,
    decided: Decided | None = None,
) -> Answer:
    """Check the process, decide again with its capabilities (or reuse create's ``decided`` for
    the very same config), apply what narrows (module rule)."""
    t0 = time.monotonic() if t0 is None else t0
    settings: Settings | None = None
    stage = "synchronize" if late else "start"
    extra: dict[str, Any] = {"late": True} if late else {}
    source = f"NRI {'Synchronize' if late else 'StartContainer'}"
    try:
        settings = _settings(ctx)
        if _plain(pod, c, settings) and not cut:
            return Answer()
    except HookError as exc:
        if _plain(pod, c, settings):
            return Answer()
        return _error(exc, c, settings, ctx, stage, **extra)
    from hook.routes.nri.target import alive, check_pid

    checked = None
    try:
        if c.pid <= 0:
            raise InputError(source, "pid", "missing: the runtime sent no pid")
        checked = check_pid(c.pid, c.id, c.cgroups_path, source, ctx.proc)
        doc = oci_config(pod, c, checked.bounding, settings.cdi_annotation_prefixes[0])
        if decided is not None and _reusable(decided, doc, settings):
            host_dev, plan, report = decided.host_dev, decided.plan, dict(decided.report)
        else:
            inputs, plan, report = _decide(pod, c, checked.bounding, settings, ctx, source, doc)
            host_dev = tuple(inputs.host_dev)
        report.update(stage=stage, **extra)
        if plan.verdict is Verdict.DENY:
            line = f"oci-device-hook: deny: {clean(plan.reason)}"
            if late:
                raise InputError(
                    source, "verdict", f"started while the daemon was away, and refused now: {plan.reason}"
                )
            return Answer(code=PERMISSION_DENIED, message=line, record=report, **_where(c, settings))
        rules = (*(r for r in plan.rules if not r.allow), *cut)
        narrowing = Plan(verdict=plan.verdict, reason=plan.reason, rules=rules, remove=plan.remove)
        if not narrowing.changes:
            return Answer(record=report if plan.changes else None, **_where(c, settings))
        from hook.adapters.apply.transaction import apply_plan

        applied = apply_plan(
            narrowing,
            checked.pid,
            rootfs=None,
            target=checked.target,
            host_dev=host_dev,
            in_thread=True,  # the daemon is long-lived: a fork per start copies it
        )
        if not alive(checked.pidfd):
            raise InputError(source, "pid", f"{checked.pid} exited while it was narrowed")
        report.update(
            cgroup_version=applied.cgroup_version,
            program_ids=applied.program_ids,
            namespaces=checked.namespaces,
        )
        report["duration_ms"] = round((time.monotonic() - t0) * 1000, 3)
        if late and _found_narrowed(applied, narrowing):
            del report["late"]  # narrowed before this daemon (it restarted): applied again, not late
            report["already_narrowed"] = True
        if plan.create:
            report["warnings"] = [
                *report.get("warnings", ()),
                "nodes to add are added at create only (none at start)",
            ]
        return Answer(record=report, **_where(c, settings))
    except HookError as exc:
        return _error(exc, c, settings, ctx, stage, **extra)
    finally:
        if checked is not None:
            os.close(checked.pidfd)
