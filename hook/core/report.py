"""The decision object: the contract's JSON (interface.md) and its rendering for a person.

Rule: the JSON keys are the contract; add keys, never rename. Every collection is already
sorted by ``decide`` so reports are byte-stable and examples can have golden outputs.
"""

from __future__ import annotations

import json

from hook.core.decide import Inputs, container_facts
from hook.core.escape import clean
from hook.core.plan import Plan

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
    }


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


def render_text(report: dict[str, Any]) -> str:
    """The report for a terminal: every string that came from the container is escaped (``clean``)."""
    c = report["container"]
    flags = [name for name in ("privileged", "sys_admin", "widened") if c[name]]
    lines = [
        f"container {clean(c['id']) or '(no id)'}" + (f" [{', '.join(flags)}]" if flags else ""),
        f"verdict:  {report['verdict']}",
        f"why:      {clean(report['reason'])}",
    ]
    if report["requests"]:
        lines.append("asked for:")
        for r in report["requests"]:
            origin = "plugin" if r["from_plugin"] else "not a plugin"
            lines.append(f"  {clean(r['value']):<44} from {clean(r['source'])} ({origin})")
    k = report.get("kubernetes")
    if k:
        alloc = ", ".join(k["allocation"]) or "nothing"
        trust = " (trusted namespace)" if k["trusted_namespace"] else ""
        pod = clean(f"{k['namespace'] or '?'}/{k['pod'] or k['pod_uid']}")
        if k.get("identity_problem"):
            lines.append(f"kubernetes: no trusted pod identity: {clean(k['identity_problem'])}")
        else:
            lines.append(
                f"kubernetes: pod {pod}{trust} container {clean(k['container'])}; "
                f"checkpoint {k['checkpoint']} {k['checkpoint_state']}, allocated {clean(alloc)}"
            )
        d = k.get("dra")
        if d and d["state"] != "absent":
            claims = ", ".join(
                f"{c['namespace']}/{c['name']} ({', '.join(c['cdi_ids']) or 'no CDI devices'})"
                for c in d["claims"]
            )
            decided = f"; decided by {clean(', '.join(d['decided']))}" if d["decided"] else ""
            lines.append(
                f"kubernetes DRA: {d['state_file']} {d['state']}; "
                f"claims {clean(claims) or 'none of this pod'}{decided}"
            )
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
    lines += [f"warning:  {clean(w)}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"
