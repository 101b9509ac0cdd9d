"""The decision object: the contract's JSON (interface.md) and its rendering for a person.

Rule: the JSON keys are the contract; add keys, never rename. Every collection is already
sorted by ``decide`` so reports are byte-stable and examples can have golden outputs.
"""

from __future__ import annotations

import json

from hook.core.decide import Inputs, container_facts, scope
from hook.core.escape import clean
from hook.core.kubelet import SANDBOX
from hook.core.plan import Node, Plan, Verdict
from hook.core.rules import Access, DeviceType, Verdicts
from hook.core.scope import PROBE_MINOR, class_majors_of

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["build_report", "render_json", "render_text"]


def build_report(inputs: Inputs, plan: Plan) -> dict[str, Any]:
    facts = container_facts(inputs)
    return {
        "verdict": str(plan.verdict),
        "reason": plan.reason,
        "container": {
            "id": inputs.container_id,
            "privileged": facts.privileged,
            "sys_admin": facts.sys_admin,
            "widened": facts.widened,
        },
        "requests": [r.to_json() for r in inputs.requests.items],
        "plugin_allocation": inputs.requests.from_plugin,
        "evidence": list(inputs.requests.evidence),
        "cgroup": [r.to_json() for r in plan.rules],
        "nodes": {"create": [n.to_json() for n in plan.create], "remove": list(plan.remove)},
        "warnings": list(plan.warnings),
        "denied": list(plan.denied),
        "kubernetes": _kubernetes(inputs),
        "keeps": _keeps(inputs, plan),
    }


def _access(rules: Verdicts, node: Node) -> str:
    bits = rules.access(DeviceType(node.type), node.major, node.minor)
    return "".join(str(a) for a in (Access.R, Access.W, Access.M) if bits & a.value)


def _keeps(inputs: Inputs, plan: Plan) -> list[dict[str, Any]]:
    """The device nodes that matter here (accelerators, NVIDIA classes, what was granted) the
    container holds once the plan is applied and its rules open for reading or writing, each with
    the access the rules give; none for a container that does not start."""
    if plan.verdict is Verdict.DENY:
        return []
    rules = Verdicts([*inputs.config.resource_rules, *plan.rules])  # one pass, then a lookup per node
    within = scope(inputs, inputs.requests.items)
    removed = set(plan.remove)
    held: dict[str, Node] = {}
    for d in inputs.config.devices:
        if d.type in ("c", "b") and d.path not in removed:
            held.setdefault(d.path, Node(path=d.path, type=d.type, major=d.major, minor=d.minor))
    held.update((n.path, n) for n in plan.create)
    out = []
    for n in sorted(held.values(), key=lambda n: (n.major, n.minor, n.path)):
        access = _access(rules, n)
        if within.matters(n) and ("r" in access or "w" in access):
            out.append({"path": n.path, "type": n.type, "major": n.major, "minor": n.minor, "access": access})
    # a class major whose rules still open minors no node names (the container can mknod one):
    # one entry for the rest of the major, path "*" and minor null
    known = [*inputs.host_accelerators, *(c.node for c in inputs.classes.nodes), *held.values()]
    for major in class_majors_of(inputs.classes, known):
        access = _access(rules, Node(path="", type="c", major=major, minor=PROBE_MINOR))
        if "r" in access or "w" in access:
            out.append({"path": "*", "type": "c", "major": major, "minor": None, "access": access})
    # a type-wide allow (a privileged container's allow-all) still opening devices of no class
    for kind in (DeviceType.CHAR, DeviceType.BLOCK):
        access = _access(rules, Node(path="", type=str(kind), major=_NO_MAJOR, minor=PROBE_MINOR))
        if "r" in access or "w" in access:
            out.append({"path": "*", "type": str(kind), "major": None, "minor": None, "access": access})

    def order(e: dict[str, Any]) -> tuple[int, int, str, str]:
        major = _NO_MAJOR + 1 if e["major"] is None else e["major"]
        return (major, PROBE_MINOR if e["minor"] is None else e["minor"], e["type"], e["path"])

    out.sort(key=order)
    return out


_NO_MAJOR = (1 << 12) - 1  # a major no driver registers (majors are 12 bits): "any other device"


def _kubernetes(inputs: Inputs) -> dict[str, Any] | None:
    """The kubelet evidence this decision used (None outside Kubernetes): which pod, which
    checkpoint and what it said, and whether the allocation bounded the container's accelerators."""
    k = inputs.requests.kubelet
    if k is None:
        return None
    settings = inputs.settings
    return {
        "namespace": k.pod.namespace,
        "pod": k.pod.name,
        "pod_uid": k.pod.uid,
        "container": k.pod.container,
        "checkpoint": k.checkpoint,
        "checkpoint_state": k.state,
        "allocation": sorted({a.resource for a in k.allocations}),
        "trusted_namespace": bool(k.pod.namespace) and k.pod.namespace in settings.env_trusted_namespaces,
        "env_requests": str(settings.env_requests),
        "bounded": inputs.requests.bounded,
        "dra_claims": k.dra,
        "dra": _dra(inputs),
        "engine": k.engine,
        "identity_problem": k.problem,
    }


def _dra(inputs: Inputs) -> dict[str, Any] | None:
    """The kubelet's DRA state as this decision read it: the file, how it read, the pod's claims,
    and which of them decided (narrowed this container); None when no DRA state was looked at."""
    from hook.core.requests import dra_claim_label, dra_claim_of

    view = inputs.requests.kubelet.dra_view if inputs.requests.kubelet is not None else None
    if view is None:
        return None
    kubelet = inputs.requests.kubelet
    decided = sorted({dra_claim_label(kubelet, c) for r in inputs.requests.items if (c := dra_claim_of(r))})
    return {**view.to_json(), "decided": decided}


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, sort_keys=True, indent=2) + "\n"


def _rule_text(r: dict[str, Any]) -> str:
    major = "*" if r["major"] is None else r["major"]
    minor = "*" if r["minor"] is None else r["minor"]
    return f"{'allow' if r['allow'] else 'deny '} {r['type']} {major}:{minor} {r['access']}"


GIVEN = "linux.devices"  # the source of nodes the engine put in the config with their own allow rule


def _absent(report: dict[str, Any], k: dict[str, Any]) -> list[str]:
    """One line per piece of kubelet evidence that gave no word, saying what its absence meant."""
    out = []
    if k.get("identity_problem"):
        out.append(
            "evidence absent: the kubelet's files were not consulted: no allocation of this pod counts"
        )
    elif k["checkpoint_state"] not in ("read", SANDBOX):  # a sandbox is given nothing, whatever the files say
        absent = k["checkpoint_state"] == "absent"
        hint = " (simulation: --kubelet-checkpoint FILE reads one)" if absent else ""
        out.append(
            f"evidence absent: the device-plugin checkpoint is {k['checkpoint_state']}: no device-plugin "
            "allocation of this pod is known, so the checkpoint bounds none of its devices, and its env "
            "counts only if a plugin corroborates it"
            + hint
        )
    d = k.get("dra")
    if d and d["state"] not in ("read", "unverified"):
        reading = (
            "no DRA claim of this pod is known, so no claim narrows it "
            "(simulation: --kubelet-dra-state FILE reads a node's state)"
            if d["state"] == "absent"
            else "nothing is decided from it: the pod may hold claims, so the checkpoint does not bound it"
        )
        out.append(f"evidence absent: the kubelet's DRA state is {d['state']}: {reading}")
    if out and report["verdict"] == "none" and report["container"]["privileged"] and not report["evidence"]:
        out.append(
            "evidence absent: so nothing the kubelet wrote bounds this privileged container: "
            "it keeps every device"
        )
    return out


def _claim_names(k: dict[str, Any] | None) -> dict[str, str]:
    """Claim UID -> ``namespace/name``, from the DRA state this decision read."""
    d = (k or {}).get("dra") or {}
    return {c["uid"]: f"{c['namespace']}/{c['name']}" for c in d.get("claims", [])}


def _keeps_text(report: dict[str, Any]) -> list[str]:
    """What the container keeps, node by node with the access its rules give (verdict ``deny``:
    it does not start)."""
    if report["verdict"] == "deny":
        return ["keeps:    nothing (the container does not start)"]
    keeps = report.get("keeps") or []
    if report["container"]["privileged"] and not any(not r["allow"] for r in report["cgroup"]):
        return ["keeps:    every device (its rules allow all, and nothing was narrowed)"]
    if not keeps:
        return (
            ["keeps:    no accelerator node"] if report["requests"] or report["container"]["widened"] else []
        )
    out = ["keeps:"]
    for n in keeps:
        whole = n["minor"] is None
        major = "*" if n["major"] is None else n["major"]
        numbers = f"{n['type']} {major}:{'*' if whole else n['minor']}"
        path = clean(n["path"])
        if whole:
            path = "(every other device)" if n["major"] is None else "(every minor no node names)"
        out.append(f"  {path:<44} {numbers:<12} {n['access']}")
    return out


def render_text(report: dict[str, Any]) -> str:
    """The report for a terminal: every string that came from the container is escaped (``clean``)."""
    c = report["container"]
    flags = [name for name in ("privileged", "sys_admin", "widened") if c[name]]
    lines = [
        f"container {clean(c['id']) or '(no id)'}" + (f" [{', '.join(flags)}]" if flags else ""),
        f"verdict:  {report['verdict']}",
        f"why:      {clean(report['reason'])}",
    ]
    asked = [r for r in report["requests"] if r["source"] != GIVEN]
    if asked:
        lines.append("asked for:")
        names = _claim_names(report.get("kubernetes"))
        for r in asked:
            origin = "plugin" if r["from_plugin"] else "not a plugin"
            uid = r["source"].removeprefix("dra-claim:") if r["source"].startswith("dra-claim:") else ""
            if uid:  # a DRA request speaks of its claim, by the name a person finds it under
                origin = f"DRA claim {names.get(uid, uid)}"
            lines.append(f"  {clean(r['value']):<44} from {clean(r['source'])} ({clean(origin)})")
    given = [clean(r["value"]) for r in report["requests"] if r["source"] == GIVEN]
    if given:
        lines.append(
            f"given already: {len(given)} node(s) in {GIVEN} with their own allow rules, as the engine or a "
            "runtime put them there (kept as given; not GPUs the kubelet allocated):"
        )
        lines += [f"  {' '.join(given[i : i + 4])}" for i in range(0, len(given), 4)]
    k = report.get("kubernetes")
    if k:
        alloc = f"allocated {clean(', '.join(k['allocation']) or 'nothing')}"
        if k["checkpoint_state"] in ("absent", "unreadable", "corrupt"):  # the kubelet's word is missing
            alloc = f"allocation unknown (checkpoint {k['checkpoint_state']})"
        trust = " (trusted namespace)" if k["trusted_namespace"] else ""
        pod = clean(f"{k['namespace'] or '?'}/{k['pod'] or k['pod_uid']}")
        if k.get("identity_problem"):
            lines.append(f"kubernetes: no trusted pod identity: {clean(k['identity_problem'])}")
        elif k["checkpoint_state"] == SANDBOX:
            lines.append(f"kubernetes: pod {pod} sandbox (pause) container: the kubelet allocates it nothing")
        else:
            lines.append(
                f"kubernetes: pod {pod}{trust} container {clean(k['container'])}; "
                f"checkpoint {k['checkpoint']} {k['checkpoint_state']}, {alloc}"
            )
        d = k.get("dra")
        if d:
            claims = ", ".join(
                f"{c['namespace']}/{c['name']} ({', '.join(c['cdi_ids']) or 'no CDI devices'})"
                for c in d["claims"]
            )
            decided = f"; decided by {clean(', '.join(d['decided']))}" if d["decided"] else ""
            known = clean(claims) or "none of this pod" if d["state"] in ("read", "unverified") else "unknown"
            lines.append(f"kubernetes DRA: {clean(d['state_file'])} {d['state']}; claims {known}{decided}")
        lines += _absent(report, k)
    if report["evidence"]:
        lines.append(f"plugin allocation evidence: {clean(', '.join(report['evidence']))}")
    if report["cgroup"]:
        lines.append("device cgroup rules to add:")
        lines += [f"  {_rule_text(r)}" for r in report["cgroup"]]
    for n in report["nodes"]["create"]:
        lines.append(
            f"create    {clean(n['path'])} ({n['type']} {n['major']}:{n['minor']} mode {n['fileMode']:o})"
        )
    for p in report["nodes"]["remove"]:
        lines.append(f"remove    {clean(p)}")
    lines += _keeps_text(report)
    lines += [f"warning:  {clean(w)}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"
