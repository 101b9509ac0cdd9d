"""Spec level where the real runtime may be crun with its systemd cgroup driver: refuse what it widens.

Rule: a config the hook hands a runtime (``hook precreate``, the runtime wrapper, simulation's
``--output-config``) never holds an allow rule crun's systemd driver would apply to more devices
than the rules grant (``hook.core.crunsd``: ``c 195:0`` becomes ``DeviceAllow=char-195``, every
GPU). No spelling keeps such a rule exact under that driver, and leaving it hands the container
every device of the major at start (cgroup v1; v2 without crun's ``BPFProgram``, which crun
only uses from 1.23) or at the next ``daemon-reload``. So the container is refused with one line
naming the rule and what to change. Checked in the hook's own process, on the config about to
leave it (the decider's answer included), so the facts below never cross the decider's wire.
The driver "may apply" unless the hook knows better: the manager is systemd when the runtime's
command line says so (the wrapper reads ``--systemd-cgroup``/``--cgroup-manager``) or, with no
command line (hooks.d precreate, simulation), when ``linux.cgroupsPath`` has the
``slice:prefix:name`` form engines write for that driver; the runtime is crun unless the binary
the wrapper execs is runc (its name, else what its ``--version`` prints). The probe runs only
when a rule would be widened, so other containers pay nothing; and this module is loaded only where
``hook.routes.crungate`` says it could refuse (its facts read the same way, fail-closed), so a
start it cannot protect (runc, crun's cgroupfs driver, no rule it widens) never imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from hook.core.crunsd import describe, systemd_cgroups_path, widened
from hook.core.errors import HookError
from hook.core.oci import parse_rule
from hook.core.record import replace
from hook.core.rules import DeviceType, Rule
from hook.routes.crungate import EXEC_ENV as EXEC_ENV
from hook.routes.crungate import MANAGER_ENV as MANAGER_ENV
from hook.routes.crungate import needs_guard, resolved_name, which

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

    from hook.routes.decision import Spec

Device = tuple[DeviceType, int, int]
__all__ = ["MANAGER_ENV", "EXEC_ENV", "check_config", "guarded", "refusal", "runtime_kind"]

FIELD = "linux.resources.devices"


def runtime_kind(runtime: str) -> str:
    """``runc``, ``crun`` or ``unknown`` for the binary ``runtime`` (a name on PATH or a path): its
    resolved name, else the first of ``crun version``/``runc version`` that its ``--version`` prints
    (a front such as nvidia-container-runtime prints the runtime it hands the line to)."""
    import subprocess

    found = which(runtime) or runtime
    name = resolved_name(runtime)  # hook.routes.crungate skips the guard on this very name
    if name in ("runc", "crun"):
        return name
    try:
        proc = subprocess.run([found, "--version"], capture_output=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = proc.stdout.decode(errors="replace")
    if "crun version" in text:
        return "crun"
    return "runc" if "runc version" in text else "unknown"


def refusal(
    rules: Sequence[Rule],
    cgroups_path: str,
    environ: Mapping[str, str],
    known: Callable[[], Iterable[Device]] | None = None,
) -> str | None:
    """Why a config with these rules must not reach the runtime, or None (the module's rule).
    ``known`` lists the devices that exist (asked only when a rule would be widened at all): a
    widening that reaches none of them beyond what is granted anyway is let through."""
    if not needs_guard(bool(widened(rules)), systemd_cgroups_path(cgroups_path), environ):
        return None  # crungate's reading (the per-start process skips this module on it)
    runtime = environ.get(EXEC_ENV, "")
    if runtime and runtime_kind(runtime) == "runc":  # by what it prints (a front that runs runc)
        return None
    wide = widened(rules, None if known is None else known())
    if not wide:
        return None
    named = "; ".join(describe(r) for r in wide[:3])
    named += f"; and {len(wide) - 3} more" if len(wide) > 3 else ""
    who = f"the runtime {runtime!r}" if runtime else "the runtime (it may be crun)"
    return (f"{named}: {who} with the systemd cgroup driver reads a 0 as every number, so this container "
            "would open devices it was not given; refused (run it with runc, or crun's cgroupfs driver)")


def check_config(
    config: Mapping[str, Any], source: str, environ: Mapping[str, str], driver_root: Callable[[], Path]
) -> None:
    """``HookError`` naming the file and field when ``config`` (decoded JSON) must be refused; the
    devices that exist are the nodes under ``driver_root()``'s ``/dev`` (the host's view: a node only
    the config names is no evidence that nothing else is on its major)."""
    linux = config.get("linux")
    linux = linux if isinstance(linux, dict) else {}
    resources = linux.get("resources")
    items = resources.get("devices") if isinstance(resources, dict) else None
    items = items if isinstance(items, list) else []
    rules = [parse_rule(r, source, f"{FIELD}[{i}]") for i, r in enumerate(items)]
    path = linux.get("cgroupsPath")

    def known() -> list[Device]:
        from hook.routes.hostscan import host_devices

        return list(host_devices(driver_root()).nodes)

    why = refusal(rules, path if isinstance(path, str) else "", environ, known)
    if why is not None:
        raise HookError(source, FIELD, why)


def driver_root_of(opts: dict[str, list[str]]) -> Path:
    """The driver root a spec-level decision read: ``--driver-root``, else the settings' (whose
    YAML is parsed again only here, on the rare path where a rule would be widened)."""
    given = opts.get("--driver-root")
    if given:
        return Path(given[-1])
    from hook.sources.settingsfile import DEFAULT_PATH, load_settings

    config = opts.get("--config")
    try:
        return Path(load_settings(Path(config[-1]) if config else DEFAULT_PATH, required=False).driver_root)
    except HookError:
        return Path("/")


def may_widen(config: bytes, source: str) -> tuple[bool, bool]:
    """Whether the config a spec-level decision hands on holds an allow rule crun's systemd driver
    could widen at all (before the manager, the runtime and the host's nodes are asked), and
    whether its ``linux.cgroupsPath`` has the systemd form: computed where the decision is made
    (in this process or the decider's: a function of the config alone), so a start whose config
    holds none, or that ``hook.routes.crungate`` clears, never loads this module. Any doubt: True."""
    try:
        final = json.loads(config)
        linux = final.get("linux") if isinstance(final, dict) else None
        resources = linux.get("resources") if isinstance(linux, dict) else None
        items = resources.get("devices") if isinstance(resources, dict) else None
        items = items if isinstance(items, list) else []
        wide = bool(widened([parse_rule(r, source, f"{FIELD}[{i}]") for i, r in enumerate(items)]))
    except (HookError, ValueError):
        return True, True
    path = linux.get("cgroupsPath") if isinstance(linux, dict) else None
    return wide, systemd_cgroups_path(path if isinstance(path, str) else "")


def guarded(decision: Spec, config: bytes, source: str, opts: dict[str, list[str]]) -> Spec:
    """``decision``, or its refusal when the config it hands on must not reach a crun with the
    systemd driver. Only a decision that was made (logged) is checked: a config that needs none
    passes through as it came."""
    if decision.code != 0 or decision.record is None:
        return decision
    try:
        final = json.loads(decision.out if decision.out is not None else config)
        final = final if isinstance(final, dict) else {}
        check_config(final, source, os.environ, lambda: driver_root_of(opts))
    except HookError as exc:
        record = {**decision.record, "verdict": "error", "error": str(exc)}
        line = f"oci-device-hook: {exc}"
        return replace(decision, code=exc.exit_code, out=None, record=record,
                       before=decision.before + line + "\n", runtime_log=line)
    except ValueError:
        return decision  # a config the decision could read is JSON; nothing here to add
    return decision
