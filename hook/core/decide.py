"""The decision: one pure function from resolved inputs to one Plan.

Rule: nothing here reads a file or a clock. ``gather`` resolves every request to the nodes it
needs (``Grant``) and lists the host's accelerator nodes; ``decide`` only compares sets:
what the container asked for, what it may have, and what the engine already gave it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hook.core.devclasses import HostClasses
from hook.core.hostdev import HOST_DEV, shared_mount, shares_host_dev
from hook.core.kubelet import SANDBOX, UNTRUSTED
from hook.core.oci import LinuxDevice, OciConfig
from hook.core.plan import Node, Plan, Verdict
from hook.core.record import field, last, record
from hook.core.requests import (
    DeviceRequest,
    Requests,
    dra_claim_label,
    dra_claim_of,
    has_sys_admin,
    is_privileged,
)
from hook.core.rules import Access, DeviceType, Rule, Verdicts
from hook.core.scope import MGMT_ENV, PROBE_MINOR, Grant, Scope, imex_channels, narrowing_scope, whole_majors
from hook.core.settings import MigManagement, Policy, Settings

__all__ = ["Grant", "Inputs", "Facts", "container_facts", "decide"]


@record
class Inputs:
    container_id: str
    config: OciConfig
    settings: Settings
    requests: Requests
    grants: Mapping[DeviceRequest, tuple[Grant, ...]]
    host_accelerators: tuple[Node, ...] = ()
    specific_mig: bool = False
    warnings: tuple[str, ...] = field(default=())
    host_dev: tuple[str, ...] = (HOST_DEV,)  # the host's /dev directories (hostdev.host_dev_roots)
    no_driver_for: tuple[str, ...] = ()  # "source=value" of requests no driver on this node could serve
    classes: HostClasses = field(default_factory=HostClasses)  # the host's NVIDIA device classes


@record
class Facts:
    privileged: bool
    sys_admin: bool
    widened: bool
    extra_accelerators: tuple[Node, ...]  # accelerator nodes in linux.devices that no request accounts for


def _key(node: Node) -> tuple[str, int, int]:
    return (node.type, node.major, node.minor)


_node_of: dict[int, tuple[LinuxDevice, Node]] = {}  # one per device value, by the id of the device held


def _node(d: LinuxDevice) -> Node:  # hook nri parses each distinct device once: its node is made once
    held = _node_of.get(id(d))
    if held is None or held[0] is not d:
        if len(_node_of) >= 4096:
            _node_of.clear()
        node = Node(path=d.path, type=d.type, major=d.major, minor=d.minor, file_mode=d.file_mode or 0o666)
        held = _node_of[id(d)] = (d, node)
    return held[1]


def _nodes_of(config: OciConfig) -> tuple[Node, ...]:
    return tuple(_node(d) for d in config.devices if d.type in ("c", "b"))


_config_nodes = last(_nodes_of)  # decide, its narrowing and the report ask: built once


_RW = (Access.R | Access.W).value


def _rules_open(rules: Verdicts, node: Node) -> bool:
    """The container's own rules let it read or write ``node`` (``m`` alone opens nothing)."""
    return bool(rules.access(DeviceType(node.type), node.major, node.minor) & _RW)


def scope(inputs: Inputs, requests: Iterable[DeviceRequest]) -> Scope:
    """The narrowing scope of this container granted what ``requests`` resolve to."""
    return narrowing_scope(
        requests, inputs.grants, inputs.classes, inputs.settings.accelerator_nodes, inputs.requests.bounded
    )


def container_facts(inputs: Inputs) -> Facts:
    return _facts(inputs)


def _container_facts(inputs: Inputs) -> Facts:
    config = inputs.config
    privileged = is_privileged(config.resource_rules)
    within = scope(inputs, inputs.requests.items)
    found: dict[tuple[str, int, int], Node] = {}
    for n in _config_nodes(config):
        if within.narrowed(n):
            found.setdefault(_key(n), n)
    if inputs.requests.bounded and not privileged:  # also what linux.resources.devices allows
        own = Verdicts(config.resource_rules)
        majors = {r.major for r in config.resource_rules if r.allow}  # no allow naming its major: closed
        for n in (
            *inputs.host_accelerators,
            *(c.node for c in inputs.classes.nodes),
            *inputs.classes.driver_nodes(),
        ):
            if (None in majors or n.major in majors) and _rules_open(own, n) and within.narrowed(n):
                found.setdefault(_key(n), n)
    extra = tuple(found.values())
    return Facts(
        privileged=privileged,
        sys_admin=has_sys_admin(config),
        widened=privileged or bool(extra),
        extra_accelerators=extra,
    )


_facts = last(_container_facts)


def _mgmt_refusal(inputs: Inputs, facts: Facts) -> str:
    """Why MIG management caps cannot be granted, or "" when they can (seed 001's rules)."""
    asked = [MGMT_ENV[r.kind] for r in inputs.requests.items if r.kind in MGMT_ENV]
    if not asked:
        return ""
    names = " and ".join(dict.fromkeys(asked))
    mode = inputs.settings.mig_management
    if mode is MigManagement.NEVER:
        return (
            f"{names}=all refused: this node's settings disable MIG management caps (mig_management: never)"
        )
    if mode is MigManagement.PRIVILEGED and not facts.privileged:
        return f"{names}=all refused: this node grants MIG management caps to privileged containers only"
    if mode is MigManagement.REQUIRE_SYS_ADMIN and not facts.sys_admin:
        return (
            f"{names}=all needs CAP_SYS_ADMIN in the container's bounding set: add SYS_ADMIN to "
            f"securityContext.capabilities.add, or unset {names}"
        )
    if inputs.specific_mig:
        return (
            f"{names}=all refused: specific MIG devices are selected, and management caps would "
            "expose their sibling instances; select NVIDIA_VISIBLE_DEVICES=all or drop the MIG env"
        )
    return ""


def _grants(inputs: Inputs, pred: Iterable[DeviceRequest]) -> dict[tuple[str, int, int], Grant]:
    out: dict[tuple[str, int, int], Grant] = {}
    for req in pred:
        for g in inputs.grants.get(req, ()):
            prev = out.get(g.key)
            out[g.key] = g if prev is None else Grant(node=prev.node, access=prev.access | g.access)
    return out


def _rule(node: Node, allow: bool, access: Access = Access.RWM) -> Rule:
    return Rule(allow=allow, type=DeviceType(node.type), major=node.major, minor=node.minor, access=access)


def _additions(
    config: OciConfig, wanted: Mapping[tuple[str, int, int], Grant]
) -> tuple[list[Rule], list[Node], list[str]]:
    """Allow rules and nodes a container lacks for what it may have; nothing it already has.

    A node is already there only when the first ``linux.devices`` entry at its path (the one runc
    creates) is that very device; another device at the path is replaced (its path is the third
    value: removed, then the node created), as the CDI reference library replaces it."""
    present: dict[str, tuple[str, int, int]] = {}
    for d in config.devices:
        present.setdefault(d.path, (d.type, d.major, d.minor))
    rules, create, replace = [], [], []
    own = Verdicts(config.resource_rules)
    for key in sorted(wanted, key=lambda k: (k[1], k[2], k[0])):
        g = wanted[key]
        if not own.allows(DeviceType(g.node.type), g.node.major, g.node.minor, g.access):
            rules.append(_rule(g.node, True, g.access))
        there = present.get(g.node.path)
        if there != _key(g.node):
            create.append(g.node)
            if there is not None:
                replace.append(g.node.path)
    return rules, create, replace


def _narrowing(
    inputs: Inputs, within: Scope, privileged: bool, warnings: list[str]
) -> tuple[list[Rule], list[str], list[str]]:
    """Deny every accelerator and NVIDIA-class node outside the scope, and remove the ones the
    engine put in the container. The third value names what was denied, so the log says it.

    A class major the container keeps no minor of is denied whole (``c M:*``) where its rules open
    it (a privileged container, a wildcard allow): a node the host does not have yet, or one the
    container makes itself, opens nothing. Every other node gets one exact rule (v1 cannot
    re-allow inside a denied wildcard, and runc refuses to punch such a hole); in a privileged
    container the whole major's deny replaces its nodes' rules.

    An unprivileged container is denied ``rw`` only: runc's default ``c *:* m`` keeps ``m`` on
    every char device in a v1 cgroup, so a ``rwm`` deny could never take full effect there."""
    access = Access.RWM if privileged else Access.R | Access.W
    candidates = [
        *inputs.host_accelerators,
        *(c.node for c in inputs.classes.nodes),
        *_config_nodes(inputs.config),
        *inputs.classes.driver_nodes(),  # a GPU, cap or DRM node the driver has, made on the host or not
    ]
    rules_now = Verdicts(inputs.config.resource_rules)
    whole = {
        m
        for m in whole_majors(within, candidates)
        if _rules_open(rules_now, Node(path="", type="c", major=m, minor=PROBE_MINOR))
    }
    deny: dict[tuple[str, int, int], Node] = {}
    for n in candidates:
        if within.narrowed(n):
            deny.setdefault(_key(n), n)
    rules = [Rule(allow=False, type=DeviceType.CHAR, major=m, minor=None, access=access) for m in whole]
    # a privileged cgroup allows by default, so ``c M:*`` closes every minor; an unprivileged one
    # keeps its exact allows past a wildcard deny on v1 (the kernel edits only the same entry)
    subsumed = whole if privileged else set()
    rules += [_rule(deny[k], False, access) for k in deny if not (k[0] == "c" and k[1] in subsumed)]
    # a container keeping an IMEX channel keeps the major: every other channel the driver has is denied
    imex = imex_channels(within, candidates, rules_now, deny)
    if imex is not None:
        rules += [
            Rule(allow=False, type=DeviceType.CHAR, major=imex.major, minor=m, access=access)
            for m in imex.minors
        ]
        warnings += imex.warnings()
    rules.sort(key=lambda r: (r.major or 0, -1 if r.minor is None else r.minor, str(r.type)))
    remove = sorted({d.path for d in inputs.config.devices if (d.type, d.major, d.minor) in deny})
    said = imex.said() if imex is not None else ()
    return rules, remove, sorted({*(deny[k].path for k in deny), *(f"c {m}:*" for m in whole), *said})


def _off_host_dev(
    inputs: Inputs, create: list[Node], remove: list[str], warnings: list[str]
) -> tuple[list[Node], list[str]]:
    """Drop node changes that would land on the host's own /dev (a bind mount of it): there the
    cgroup rules alone narrow, and ``warnings`` says which mount made it so."""
    config = inputs.config
    dropped, labels = dict[int, int](), dict[int, str]()
    shared = any(shares_host_dev(m, inputs.host_dev, config.bundle) for m in config.mounts)  # else none is

    def on_host(path: str) -> bool:
        found = shared_mount(config.mounts, path, inputs.host_dev, config.bundle) if shared else None
        if found is None:
            return False
        i, m = found
        dropped[i] = dropped.get(i, 0) + 1
        labels[i] = f"mounts[{i}] {m.type or 'bind'} {m.source or m.type} at {m.destination}"
        return True

    kept_create = [n for n in create if not on_host(n.path)]
    kept_remove = [p for p in remove if not on_host(p)]
    for i in sorted(dropped):
        warnings.append(
            f"{config.source}: {labels[i]} is the host's /dev: narrowing there is cgroup-only, "
            f"{dropped[i]} node(s) left as they are"
        )
    return kept_create, kept_remove


_NOTHING_ALLOCATED = {
    UNTRUSTED: "(none: no trusted pod identity, so nothing is allocated)",
    SANDBOX: "(none: a pod's sandbox container is allocated no device)",
}


def _allocation_names(requests: Requests) -> str:
    vals = [f"{r.value} ({r.source})" for r in requests.items if r.from_plugin and not dra_claim_of(r)]
    if not vals:
        state = requests.kubelet.state if requests.kubelet is not None else ""
        if state in ("absent", "unreadable", "corrupt"):  # no word of the kubelet either way
            return f"(unknown: the kubelet's checkpoint is {state})"
        return _NOTHING_ALLOCATED.get(state, "(none: the kubelet allocated this container no GPU)")
    return ", ".join(vals[:4]) + (f" and {len(vals) - 4} more" if len(vals) > 4 else "")


def _allocation(requests: Requests) -> str:
    """What bounds the container, as a person finds it: its plugin allocation, its DRA claims
    (``namespace/name (dra-claim:<uid>)``, with the devices each names), or both."""
    claims: dict[str, list[str]] = {}
    for r in requests.items:
        if r.from_plugin and (uid := dra_claim_of(r)):
            name = dra_claim_label(requests.kubelet, uid).removesuffix(f" ({uid})")  # namespace/name
            claims.setdefault(f"{name} ({r.source})", []).append(r.value)
    if not claims:
        return f"plugin allocation {_allocation_names(requests)}"
    named = "; ".join(f"{label}: {', '.join(values)}" for label, values in sorted(claims.items()))
    said = f"DRA claim{'s' if len(claims) > 1 else ''} {named}"
    if any(r.from_plugin and not dra_claim_of(r) for r in requests.items):
        return f"plugin allocation {_allocation_names(requests)} and {said}"
    return said


def _plan(verdict: Verdict, reason: str, warnings: Sequence[str], **kw: object) -> Plan:
    return Plan(verdict=verdict, reason=reason, warnings=tuple(dict.fromkeys(warnings)), **kw)  # type: ignore[arg-type]


def decide(inputs: Inputs) -> Plan:
    """The whole policy: management caps, then privileged widening, then plain grants."""
    facts = container_facts(inputs)
    warnings = [*inputs.config.warnings, *inputs.requests.warnings, *inputs.warnings]
    refusal = _mgmt_refusal(inputs, facts)
    if refusal:
        return _plan(Verdict.DENY, refusal, warnings)
    reqs = inputs.requests
    plugin_widened = (reqs.from_plugin or reqs.bounded) and facts.widened
    # A privileged pod with no allocation (DinD, tooling) has all devices on purpose; one with no
    # trusted identity is a pod the kubelet allocated nothing, never freer than a trusted one.
    untrusted = reqs.kubelet is not None and reqs.kubelet.state == UNTRUSTED
    if facts.privileged and not reqs.from_plugin and not untrusted:
        return _plan(
            Verdict.NONE,
            "privileged container without a plugin allocation: all devices on purpose, left alone",
            warnings,
        )
    if plugin_widened and inputs.settings.privileged_allocation is Policy.REJECT:
        return _plan(
            Verdict.DENY,
            f"container is widened beyond its {_allocation(reqs)} (policy: reject)",
            warnings,
        )
    keep = [r for r in reqs.items if r.from_plugin or r.kind in MGMT_ENV or not plugin_widened]
    wanted = _grants(inputs, keep)
    rules, create, replaced = _additions(inputs.config, wanted)
    remove: list[str] = []
    denied: list[str] = []
    if plugin_widened:
        deny_rules, remove, denied = _narrowing(inputs, scope(inputs, keep), facts.privileged, warnings)
        if inputs.settings.privileged_allocation is Policy.AUDIT:
            warnings.append(
                f"audit: would deny {len(deny_rules)} accelerator node(s) outside "
                f"{_allocation(reqs).removeprefix('plugin allocation ')}"
            )
            remove = []  # audit changes nothing: the removals are part of what it only reports
        else:
            rules += deny_rules
    remove = sorted({*remove, *replaced})
    create, remove = _off_host_dev(inputs, create, remove, warnings)
    if not (rules or create or remove):
        if plugin_widened and inputs.settings.privileged_allocation is Policy.AUDIT:
            why = f"widened beyond its {_allocation(reqs)}; left as is (policy: audit)"
        elif plugin_widened:
            why = f"widened beyond its {_allocation(reqs)}; no accelerator node outside it is on this node"
        elif not reqs.items and reqs.ignored_env:
            why = f"no device requested: {' and '.join(reqs.ignored_env)} is no request here (see warnings)"
        elif not reqs.items:
            why = "no device requested"
        elif inputs.no_driver_for:
            asked = ", ".join(inputs.no_driver_for[:4]) + (" ..." if len(inputs.no_driver_for) > 4 else "")
            why = (
                f"no NVIDIA driver on this node: the container starts without the GPU it asked for ({asked})"
            )
        else:
            why = "the container already has exactly what it asked for"
        return _plan(Verdict.NONE, why, warnings, denied=tuple(denied))
    reason = _reason(facts, plugin_widened, reqs, rules, create, remove, replaced)
    return _plan(
        Verdict.APPLY,
        reason,
        warnings,
        rules=tuple(rules),
        create=tuple(create),
        remove=tuple(remove),
        denied=tuple(denied),
    )


def _reason(
    facts: Facts,
    narrowed: bool,
    reqs: Requests,
    rules: list[Rule],
    create: list[Node],
    remove: list[str],
    replaced: Sequence[str] = (),
) -> str:
    denied = sum(not r.allow for r in rules)
    allowed = len(rules) - denied
    parts = []
    if narrowed:
        shape = "privileged" if facts.privileged else "widened"
        parts.append(
            f"narrowed a {shape} container to its {_allocation(reqs)}: "
            f"denied {denied} accelerator node(s), removed {sum(p not in replaced for p in remove)}"
        )
    if allowed or create:
        parts.append(f"allowed {allowed} and created {len(create)} node(s) it requested")
    if replaced:
        parts.append(f"{', '.join(replaced)}: another device at that path, replaced")
    return "; ".join(parts)
