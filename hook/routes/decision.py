"""What a route decided for one container, as one value: built in-process or by the decider, acted
on by ``hook.routes.act`` alone.

Rule: a decision holds everything the hook needs to act and log without deciding again or reading
the node: the log record (not yet stamped: the hook stamps it when it writes it), where the log
goes, the exit status, the stderr text before and after acting, and either the plan and where it
applies (live) or the config to hand the runtime (spec level). It crosses the wire as JSON
(``to_wire``/``from_wire``); the in-process path passes its value through the same JSON form
(``normalized``), so both paths act on equal values and write equal lines.

Decoding imports only ``hook.routes.fastpath`` (its ``loads``) and the plan's plain values
(``hook.core.plainplan``): a served start loads neither ``enum`` nor the decision core.
"""

from __future__ import annotations

from _thread import _local

from hook.core.record import field, record

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from hook.core.plainplan import PlainPlan
    from hook.core.plan import Plan

    D = TypeVar("D", "Live", "Spec")

__all__ = ["Live", "LogTo", "Spec", "from_wire", "normalized", "to_wire", "wire_of"]

_made = _local()  # per thread (the decider answers from several): the last normalized and its JSON


@record
class LogTo:
    """The log file and its rotation size, from the settings the decision ran under."""

    file: str = "/var/log/oci-device-hook.log"
    max_bytes: int = 10 << 20


@record
class Live:
    """A live (prestart/createRuntime) decision."""

    code: int
    record: dict[str, Any] = field(default_factory=dict)  # the log record, unstamped
    log: LogTo = field(default_factory=LogTo)
    annotations: dict[str, str] = field(default_factory=dict)  # what the stamp reads (pod, engine)
    cgroups_path: str = ""
    before: str = ""  # stderr before acting
    after: str = ""  # stderr after logging (a deny's line)
    # rules and nodes to apply to the container (None: nothing to apply); from the wire, plain values
    plan: Plan | PlainPlan | None = None
    rootfs: str = ""
    host_dev: tuple[str, ...] = ()
    container: str = ""


@record
class Spec:
    """A spec-level (precreate, runtime wrapper) decision."""

    code: int
    out: bytes | None = None  # the config to hand on; None: the input, unchanged
    record: dict[str, Any] | None = None  # None: nothing is logged
    log: LogTo = field(default_factory=LogTo)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroups_path: str = ""
    before: str = ""
    after: str = ""
    runtime_log: str = ""  # a refusal's line for the engine (the runtime's --log)
    may_widen: bool = False  # an allow rule crun's systemd driver may widen: the hook checks it
    systemd_path: bool = True  # the config's linux.cgroupsPath may be the systemd driver's form


def _plan_doc(given: Plan | PlainPlan) -> dict[str, Any]:
    from hook.core.plainplan import PlainPlan

    if not isinstance(given, PlainPlan):  # the core's Plan: its rules normalized here, once
        from hook.core.plan import plain

        given = plain(given)
    plan = given
    return {
        "verdict": plan.verdict,
        "reason": plan.reason,
        "rules": [[r.allow, r.type, r.major, r.minor, r.access] for r in plan.rules],
        "normal": [[r.allow, r.type, r.major, r.minor, r.access] for r in plan.normal],
        "create": [n.to_json() for n in plan.create],
        "remove": list(plan.remove),
        "warnings": list(plan.warnings),
        "denied": list(plan.denied),
    }


def _plan(doc: dict[str, Any]) -> PlainPlan:
    """The plan in plain values (``hook.core.plainplan``): applying it loads no ``enum``."""
    from hook.core.plainplan import VERDICTS, Node, PlainPlan, PlainRule

    def node(d: dict[str, Any]) -> Node:
        return Node(path=d["path"], type=d["type"], major=d["major"], minor=d["minor"],
                    file_mode=d["fileMode"], uid=d["uid"], gid=d["gid"])  # fmt: skip

    # ``normal`` holds the same rules as ``rules`` in another order (``normalize``): each rule read
    # once serves both lists. Only a row of the exact JSON types is kept (a key of 0 would find
    # False's rule); any other row is read on its own, as before.
    seen: dict[tuple[Any, ...], PlainRule] = {}

    def rules(rows: list[Any]) -> tuple[PlainRule, ...]:
        out = []
        for a, t, ma, mi, acc in rows:
            exact = (
                type(a) is bool
                and type(t) is str
                and type(ma) in _NUMBER
                and type(mi) in _NUMBER
                and type(acc) is str
            )
            rule = seen.get((a, t, ma, mi, acc)) if exact else None
            if rule is None:
                rule = PlainRule.parse(a, t, ma, mi, acc)
                if exact:
                    seen[(a, t, ma, mi, acc)] = rule
            out.append(rule)
        return tuple(out)

    if doc["verdict"] not in VERDICTS:
        raise ValueError(f"{doc['verdict']!r} is not a verdict")
    return PlainPlan(
        verdict=doc["verdict"],
        reason=doc["reason"],
        rules=rules(doc["rules"]),
        normal=rules(doc["normal"]),
        create=tuple(node(n) for n in doc["create"]),
        remove=tuple(doc["remove"]),
        warnings=tuple(doc["warnings"]),
        denied=tuple(doc["denied"]),
    )


_NUMBER = (int, type(None))  # a rule's major and minor as the wire's JSON gives them


def to_wire(decision: Live | Spec) -> bytes:
    """The decision as JSON text (the decider's answer)."""
    import json

    doc: dict[str, Any] = {
        "kind": "live" if isinstance(decision, Live) else "spec",
        "code": decision.code,
        "record": decision.record,
        "log": [decision.log.file, decision.log.max_bytes],
        "annotations": decision.annotations,
        "cgroups_path": decision.cgroups_path,
        "before": decision.before,
        "after": decision.after,
    }
    if isinstance(decision, Live):
        doc["plan"] = None if decision.plan is None else _plan_doc(decision.plan)
        doc.update(rootfs=decision.rootfs, host_dev=list(decision.host_dev), container=decision.container)
    else:
        doc["out"] = None if decision.out is None else decision.out.decode("utf-8", "surrogateescape")
        doc["runtime_log"] = decision.runtime_log
        doc["may_widen"] = decision.may_widen
        doc["systemd_path"] = decision.systemd_path
    return json.dumps(doc, default=str, ensure_ascii=True).encode()


def from_wire(data: bytes) -> Live | Spec:
    """``to_wire``'s value back; ``ValueError`` (or ``KeyError``/``TypeError``) on anything else."""
    from hook.routes.fastpath import loads

    doc = loads(data)
    common: dict[str, Any] = {
        "code": _int(doc["code"]),
        "log": LogTo(file=_text(doc["log"][0]), max_bytes=_int(doc["log"][1])),
        "annotations": {_text(k): _text(v) for k, v in doc["annotations"].items()},
        "cgroups_path": _text(doc["cgroups_path"]),
        "before": _text(doc["before"]),
        "after": _text(doc["after"]),
    }
    if doc["kind"] == "live":
        if not isinstance(doc["record"], dict):
            raise ValueError("a live decision without a record")
        plan = doc["plan"]
        return Live(
            record=doc["record"],
            plan=None if plan is None else _plan(plan),
            rootfs=_text(doc["rootfs"]),
            host_dev=tuple(_text(d) for d in doc["host_dev"]),
            container=_text(doc["container"]),
            **common,
        )
    if doc["kind"] != "spec" or not (doc["record"] is None or isinstance(doc["record"], dict)):
        raise ValueError("not a decision")
    out = doc["out"]
    return Spec(
        out=None if out is None else _text(out).encode("utf-8", "surrogateescape"),
        record=doc["record"],
        runtime_log=_text(doc["runtime_log"]),
        may_widen=doc["may_widen"] is True,
        systemd_path=doc["systemd_path"] is not False,  # fail-closed: only an explicit no clears it
        **common,
    )


def normalized(decision: D) -> D:
    """The decision as the hook gets it from the decider (tuples as lists, enums as text): the
    in-process path acts on this, so served and in-process lines are equal by construction."""
    data = to_wire(decision)
    out = from_wire(data)
    _made.last = (out, data)
    return out  # type: ignore[return-value]


def wire_of(decision: Live | Spec) -> bytes:
    """``to_wire(decision)``; for the value ``normalized`` just returned in this thread, the JSON it
    was read back from, which is the same value (the decider answers without a second encoding,
    and the hook reads exactly what the in-process path acts on)."""
    last = getattr(_made, "last", None)
    if last is not None and last[0] is decision:
        return last[1]  # type: ignore[no-any-return]
    return to_wire(decision)


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("expected an integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value
