"""Which allow rules crun's systemd cgroup driver reads wider than runc and the kernel do.

Rule: pure. crun's systemd driver turns each allow rule into a ``DeviceAllow=`` unit property
(containers/crun ``src/libcrun/cgroup-systemd.c``: ``append_devices``, ``append_device_allow``)
and reads a major or minor ``<= 0`` as a wildcard (``IS_WILDCARD``; an absent number is 0 in its
parsed spec). So ``c 195:0 rw`` (GPU 0) becomes ``char-195`` (every GPU), ``c 511:0`` the whole
``nvidia-uvm`` major, ``c 0:0`` ``char-*``; a ``*:M`` rule with ``M > 0`` is dropped with a
warning (narrower, so harmless here). runc's drivers and the kernel read the same rules exactly.
systemd writes the unit's properties into the cgroup again on every ``daemon-reload``: on cgroup
v1, and on v2 when crun cannot hand systemd its own eBPF program (``BPFProgram``), that is what
the container keeps. A rule is *widened* when crun's reading grants some access on a device that
the whole list, read the runc way, does not grant already (crun's own defaults included: it
appends ``c *:* m``, ``b *:* m``, ``c 5:0`` and ``c 136:*`` to every unit, so ``/dev/tty``'s
``c 5:0`` widens nothing crun does not widen itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hook.core.rules import Access, DeviceType, Rule, evaluate

__all__ = ["crun_reading", "systemd_cgroups_path", "widened", "describe"]

_UNNAMED = 1 << 32  # a device number no rule can name: "some other minor (or major)"
# crun's default devices (cgroup-resources.c ``default_devices``) as its systemd driver reads them
_CRUN_DEFAULTS = (
    Rule(allow=True, type=DeviceType.CHAR, access=Access.M),
    Rule(allow=True, type=DeviceType.BLOCK, access=Access.M),
    Rule(allow=True, type=DeviceType.CHAR, major=5, access=Access.RWM),  # c 5:0 (/dev/tty) -> char-5
    Rule(allow=True, type=DeviceType.CHAR, major=136, access=Access.RWM),
)


def crun_reading(rule: Rule) -> tuple[int | None, int | None] | None:
    """(major, minor) as crun's systemd driver applies ``rule`` (``None``: ``*``), or ``None`` when it
    drops the rule (a wildcard major with an exact minor)."""
    major = None if rule.major is None or rule.major <= 0 else rule.major
    minor = None if rule.minor is None or rule.minor <= 0 else rule.minor
    if major is None and minor is not None:
        return None
    return major, minor


def systemd_cgroups_path(path: str) -> bool:
    """``linux.cgroupsPath`` in the ``slice:prefix:name`` form both runtimes' systemd drivers take
    (engines write it only when they run the runtime with the systemd driver)."""
    return path.count(":") == 2


def widened(
    rules: Sequence[Rule], known: Iterable[tuple[DeviceType, int, int]] | None = None
) -> tuple[Rule, ...]:
    """The allow rules of ``rules`` that crun's systemd driver applies to more devices than the list
    grants when read exactly (the module's rule); ``()`` when there is none.

    ``known``: the devices that exist (the host's nodes, the config's): a rule counts as widened
    only when one of them gains access (``c 511:0`` widened to the ``nvidia-uvm`` major is harmless
    when its other minor, ``nvidia-uvm-tools``, is granted too). When none is known on the numbers
    it widens to (``None``, or an empty scan), any number counts."""
    base = [*rules, *_CRUN_DEFAULTS]
    devices = None if known is None else sorted(set(known))
    out: list[Rule] = []
    for rule in rules:
        if not rule.allow or rule.type is DeviceType.ALL or not rule.access & ~Access.M:
            continue  # `a` allows every device to runc already; `m` alone crun grants everywhere
        reading = crun_reading(rule)
        if reading is None or reading == (rule.major, rule.minor):
            continue
        major, minor = reading
        probes = [(d[1], d[2]) for d in devices or () if d[0] is rule.type and major in (None, d[1])
                  and minor in (None, d[2]) and (d[1], d[2]) != (rule.major, rule.minor)]
        if not probes:  # no device it reaches is known: any number counts (fail closed)
            probes = [(_UNNAMED if major is None else major, _UNNAMED if minor is None else minor)]
        bits = [b for b in (Access.R, Access.W) if b & rule.access]
        if not all(evaluate(base, rule.type, pm, pn, b) for pm, pn in probes for b in bits):
            out.append(rule)
    return tuple(out)


def describe(rule: Rule) -> str:
    """``allow c 195:0 rw (crun's systemd driver: DeviceAllow=char-195)``."""
    reading = crun_reading(rule)
    kind = "char" if rule.type is DeviceType.CHAR else "block"
    major = None if reading is None else reading[0]
    wide = f"{kind}-*" if major is None else f"{kind}-{major}"
    return f"allow {rule.v1_line()} (crun's systemd driver: DeviceAllow={wide})"
