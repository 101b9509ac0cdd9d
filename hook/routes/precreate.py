"""Spec level: decide on config.json before the runtime starts, as a value (the decided config).

Rule: the same gather and decide as live mode; only the outcome differs: the plan is folded into
the config (``hook.adapters.specwriter``) instead of being applied to a running container, so
the runtime itself creates only the allowed nodes and writes only the narrowed rules through its
own cgroup driver. There is no state, pid or bundle at this stage: the kubelet checkpoint is
found from the pod identity annotations in the config. A decided config carries a marker
(``hook.adapters.marker``) so that a prestart hook registered as well, or a second pass, does
nothing more. ``decide_spec`` decides (in the hook or the decider); ``hook.routes.act`` logs.

Fail closed for a container that asked for devices or must be narrowed; a container that needs
no decision passes through unchanged (byte for byte) even when the settings are broken.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hook.adapters.marker import ANNOTATION, binding, sign
from hook.core.decide import Inputs, decide
from hook.core.errors import HookError
from hook.core.escape import clean
from hook.core.oci import OciConfig, parse_config, parse_config_object
from hook.core.plan import Plan, Verdict
from hook.core.record import replace
from hook.core.report import build_report
from hook.routes.act import CONTAINER_ID_ENV, RUNTIME_SEEN_ENV, SPEC_SOURCE, Session, act_spec
from hook.routes.decision import LogTo, Spec, normalized
from hook.routes.gather import host_devices, inputs_for_config, resolved
from hook.routes.live import decided_before, remember, salvaged
from hook.routes.options import options_from
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

__all__ = ["SOURCE", "Facts", "decide_spec", "decided_config", "facts_from_env", "run_precreate"]

SOURCE = SPEC_SOURCE


class Facts:
    """What the hook's own invocation says about the container (the wrapper's environment)."""

    __slots__ = ("container_id", "runtime_seen")

    def __init__(self, container_id: str | None = None, runtime_seen: str | None = None) -> None:
        self.container_id, self.runtime_seen = container_id, runtime_seen


def facts_from_env() -> Facts:
    return Facts(os.environ.get(CONTAINER_ID_ENV), os.environ.get(RUNTIME_SEEN_ENV))


def decided_config(
    inputs: Inputs, plan: Plan, driver_root: Path, spec_dirs: tuple[Path, ...]
) -> dict[str, Any]:
    """The config the runtime should get: CDI edits for CDI requests, then the Plan (allow-list)."""
    from hook.adapters.specwriter import fold_cdi, fold_plan
    from hook.core.requests import Kind

    out: dict[str, Any] = dict(inputs.config.raw)
    names = [r.value for r in inputs.requests.items if r.kind is Kind.CDI]
    if names:
        from hook.sources.cdi.hostnodes import fill
        from hook.sources.cdi.registry import Registry

        registry = Registry.load(list(spec_dirs), None)
        out = fold_cdi(out, fill(registry.resolve(names), driver_root))
    return fold_plan(out, plan, host_devices(driver_root))


def _log_to(settings: Settings | None) -> LogTo:
    s = settings or Settings()
    return LogTo(file=s.log_file, max_bytes=s.log_max_bytes)


def _container_id(config: OciConfig, facts: Facts) -> str:
    hostname = config.raw.get("hostname")
    return facts.container_id or (hostname if isinstance(hostname, str) else "")


def decide_spec(opts: dict[str, list[str]], stdin: bytes, facts: Facts) -> Spec:
    """The spec-level decision for the config in ``stdin`` (nothing is written here but caches),
    saying whether the config it hands on needs the crun guard (``hook.routes.crunguard``)."""
    decision = _decide_spec(opts, stdin, facts)
    if decision.code != 0 or decision.record is None:
        return decision
    from hook.routes.crunguard import may_widen

    final = decision.out if decision.out is not None else stdin
    wide, systemd_path = may_widen(final, SOURCE)
    return replace(decision, may_widen=wide, systemd_path=systemd_path)


def _decide_spec(opts: dict[str, list[str]], stdin: bytes, facts: Facts) -> Spec:
    settings: Settings | None = None
    config: OciConfig | None = None
    container = before = ""

    def where(config: OciConfig | None) -> dict[str, Any]:
        if config is None:
            return {"annotations": {}, "cgroups_path": ""}
        return {"annotations": dict(config.annotations), "cgroups_path": config.cgroups_path}

    try:
        options = options_from(opts, use_cache=True)
        settings = load_settings(options.settings_file or DEFAULT_PATH, required=bool(options.settings_file))
        before = remember(opts, settings)  # later plain containers take the fast path under these settings
        config = parse_config(stdin, SOURCE, "")
        container = _container_id(config, facts)
        if decided_before(config, config.annotations, settings, facts.container_id or ""):
            return Spec(
                code=0, before=before
            )  # decided on this node before (the wrapper after podman, a retry)
        options = resolved(replace(options, settings=settings), settings)
        inputs = inputs_for_config(config, {}, container, options)
        plan = decide(inputs)
        report = build_report(inputs, plan)
        seen = facts.runtime_seen
        if seen is not None and seen != settings.runtime:
            report["warnings"] = [
                *report.get("warnings", []),
                f"{options.settings_file or DEFAULT_PATH}: runtime: the wrapper read {seen!r}, YAML says "
                f"{settings.runtime!r}; write it as one plain `runtime: VALUE` line",
            ]
        report["stage"] = "precreate"
        common = {"log": _log_to(settings), "before": before, **where(config)}
        if plan.verdict is Verdict.DENY:
            return normalized(
                Spec(
                    code=3,
                    record=report,
                    after=f"oci-device-hook: deny: {clean(plan.reason)}\n",
                    runtime_log=f"oci-device-hook: deny: {plan.reason}",
                    **common,
                )
            )
        if not plan.changes:
            return normalized(Spec(code=0, record=report, **common))
        out = decided_config(inputs, plan, options.driver_root or Path("/"), options.spec_dirs)
        from hook.sources.nodekey import node_key

        key = node_key(create=True)
        annotations = out.setdefault("annotations", {})
        annotations.pop(ANNOTATION, None)
        decided = parse_config_object(out, SOURCE, "")
        bound = binding(inputs.requests.kubelet, settings)
        made = None if key is None else sign(key, decided, bound, facts.container_id or "")
        if made is not None:
            annotations[ANNOTATION] = made
        else:
            why = "no node key" if key is None else "no container id or cgroupsPath to bind it to"
            report["warnings"] = [
                *report.get("warnings", []),
                f"no marker ({why}): a prestart hook will decide again",
            ]
        import json

        text = (json.dumps(out, indent=2) + "\n").encode()
        return normalized(Spec(code=0, out=text, record=report, **common))
    except HookError as exc:
        if _passes_through(stdin):
            return Spec(
                code=0,
                before=before + f"oci-device-hook: warning: {exc} (container needs no decision: unchanged)\n",
            )
        if config is None:  # the settings failed first: the config still names the container
            config = _config_or_none(stdin)
        if not container:
            container = _container_id(config, facts) if config is not None else facts.container_id or ""
        record = {"verdict": "error", "stage": "precreate", "container": {"id": container}, "error": str(exc)}
        log = _log_to(settings if settings is not None else salvaged(opts))
        return normalized(
            Spec(
                code=exc.exit_code,
                record=record,
                log=log,
                before=before + f"oci-device-hook: {exc}\n",
                runtime_log=f"oci-device-hook: {exc}",
                **where(config),
            )
        )


def _config_or_none(stdin: bytes) -> OciConfig | None:
    """The config for the error record's container id and pod, where it parses at all."""
    try:
        return parse_config(stdin, SOURCE, "")
    except HookError:
        return None


def _passes_through(stdin: bytes) -> bool:
    """With default settings, this config asks for no device and is not widened (the fast path's test)."""
    from hook.routes.fastpath import loads, needs_decision

    try:
        config = loads(stdin)
        return isinstance(config, dict) and not needs_decision(config, config.get("annotations") or {})
    except (ValueError, TypeError, AttributeError):
        return False


def run_precreate(
    opts: dict[str, list[str]], stdin: bytes, session: Session | None = None
) -> tuple[int, bytes]:
    """Decide in this process and act: (exit code, bytes for stdout: the decided config or the input)."""
    from hook.routes.crunguard import guarded  # loaded already (decide_spec's may_widen)

    session = session or Session("precreate")
    decision = decide_spec(opts, stdin, facts_from_env())
    return act_spec(guarded(decision, stdin, SOURCE, opts), stdin, session)
