"""Live mode's decision: what to do for the starting container, decided once, as a value.

Rule: this decides and never acts (``hook.routes.act`` applies and logs): the same function
decides in the per-start hook and in the decider (``hook serve``), from the state and
config.json the runtime handed over (``Look``: read and parsed once, by the fast path where it
could) and the settings and options of whoever decides. Fail closed for a container that asked
for devices or must be narrowed: any error becomes an error decision (non-zero, so the runtime
aborts it); the fast path has already let through every container that needs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hook.core.errors import HookError, InputError
from hook.core.escape import clean
from hook.core.oci import (
    MAX_CONFIG_BYTES,
    OciConfig,
    OciState,
    parse_config,
    parse_config_object,
    parse_state,
    parse_state_object,
)
from hook.core.plan import Verdict
from hook.core.record import replace
from hook.routes.act import STDIN, Session, act_live, pid_of
from hook.routes.decision import Live, LogTo, normalized
from hook.routes.gather import load_inputs, read_limited
from hook.routes.options import options_from
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

    from hook.routes.fastpath import Look

__all__ = [
    "decide_live",
    "decided_before",
    "loaded_config",
    "loaded_state",
    "remember",
    "run_live",
    "salvaged",
]


def loaded_state(look: Look) -> OciState:
    """The state, from the object the fast path decoded when it could (never decoded twice)."""
    if look.state is not None:
        return parse_state_object(look.state, STDIN)
    return parse_state(look.stdin, STDIN)


def loaded_config(look: Look, state: OciState) -> OciConfig:
    """config.json of the state's bundle: the bytes (and object) the fast path already read,
    else read here, once. The decider is handed the bytes; it never opens a bundle."""
    bundle = Path(state.bundle)
    path = bundle / "config.json"
    if look.config is not None:
        return parse_config_object(look.config, str(path), str(bundle))
    if look.config_bytes is None:
        look.config_bytes = read_limited(path, MAX_CONFIG_BYTES, "config.json")
    return parse_config(look.config_bytes, str(path), str(bundle))


def remember(opts: dict[str, list[str]], settings: Settings) -> str:
    """Let the fast path serve later containers under custom settings without loading yaml; the
    warning text when the record could not be written."""
    from hook.sources.settingsfile import remember_for_fast_path

    path = Path((opts.get("--config") or [str(DEFAULT_PATH)])[-1])
    if path.exists():
        problem = remember_for_fast_path(path, settings)
        if problem:
            return f"oci-device-hook: warning: fast path cache: {clean(problem)}\n"
    return ""


def _log_to(settings: Settings | None) -> LogTo:
    s = settings or Settings()
    return LogTo(file=s.log_file, max_bytes=s.log_max_bytes)


def _settings_cannot_matter(config: OciConfig, annotations: Mapping[str, str]) -> bool:
    """No settings file could make this container ask for a device or count as widened.

    Stricter than the fast path's test with default settings: any annotation key that mentions
    CDI (a custom prefix might match it) and any ``/dev/null`` mount (a custom volume-mount root
    might hold it) count as a possible request.
    """
    from hook.core.kpath import host_source
    from hook.routes.fastpath import DEFAULT_MOUNT_ROOT, DEFAULT_PREFIXES, needs_decision

    if needs_decision(dict(config.raw), dict(annotations), DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT):
        return False
    if any("cdi" in key.lower() for key in annotations):
        return False
    return not any(m.source and host_source(m.source, config.bundle) == "/dev/null" for m in config.mounts)


def _broken_settings(error: InputError, look: Look, opts: dict[str, list[str]]) -> Live:
    """A settings file that does not load stops only the containers whose decision it could change.

    A container that asks for no device under any settings starts (the error is logged and
    printed as a warning, once per container); any other container fails closed with the error.
    """
    container = cgroups = ""
    annotations: Mapping[str, str] = {}
    try:
        state = loaded_state(look)
        container = state.id
        config = loaded_config(look, state)
        annotations, cgroups = {**config.annotations, **state.annotations}, config.cgroups_path
        harmless = _settings_cannot_matter(config, annotations)
    except HookError:
        harmless = False
    record: dict[str, Any] = {"container": {"id": container}, "error": str(error)}
    common: dict[str, Any] = {"log": _log_to(salvaged(opts)), "annotations": dict(annotations)}
    common["cgroups_path"] = cgroups
    if harmless:
        reason = "settings file broken; the container asks for no device"
        return Live(
            code=0,
            record={**record, "verdict": "none", "reason": reason},
            before=f"oci-device-hook: warning: {error}; started: it asks for no device\n",
            **common,
        )
    return Live(
        code=error.exit_code,
        record={**record, "verdict": "error"},
        before=f"oci-device-hook: {error}\n",
        **common,
    )


def salvaged(opts: dict[str, list[str]]) -> Settings | None:
    """The log a broken ``--config`` still names (``settings.salvage_log``); None: the default."""
    from hook.sources.settingsfile import salvage_log

    config = opts.get("--config")
    return salvage_log(Path(config[-1])) if config else None


def decided_before(
    config: OciConfig, annotations: Mapping[str, str], settings: Settings, container_id: str
) -> bool:
    """``hook precreate`` on this node decided exactly these nodes and rules, for this container
    (``container_id``, its ``cgroupsPath``) and pod, on the kubelet evidence and settings it would
    read now (``hook.adapters.marker``)."""
    from hook.adapters.marker import ANNOTATION, binding, verify
    from hook.routes.gather import kubelet_evidence
    from hook.sources.nodekey import node_key

    if ANNOTATION not in config.annotations:
        return False
    key = node_key()
    if key is None:
        return False
    evidence = kubelet_evidence(annotations, config.cgroups_path, settings)
    return verify(key, config, binding(evidence, settings), container_id)


def decide_live(opts: dict[str, list[str]], look: Look) -> Live:
    """The decision for the container in ``look`` under ``opts`` (and the settings they name)."""
    settings: Settings | None = None
    container = cgroups = before = ""
    annotations: Mapping[str, str] = {}
    try:
        options = options_from(opts, use_cache=True)
        # settings first, so that an error in the state or config.json is logged where the operator said
        try:
            settings = load_settings(
                options.settings_file or DEFAULT_PATH, required=bool(options.settings_file)
            )
        except InputError as exc:
            return normalized(_broken_settings(exc, look, opts))
        before = remember(opts, settings)
        state = loaded_state(look)
        container = state.id
        annotations = state.annotations
        config = loaded_config(look, state)
        annotations, cgroups = {**config.annotations, **state.annotations}, config.cgroups_path
        common: dict[str, Any] = {
            "log": _log_to(settings),
            "annotations": dict(annotations),
            "cgroups_path": cgroups,
            "before": before,
        }
        if decided_before(config, annotations, settings, container):
            record = {"verdict": "none", "reason": "decided at precreate (valid marker): nothing more to do"}
            return normalized(Live(code=0, record={**record, "container": {"id": container}}, **common))
        inputs = load_inputs(state, replace(options, settings=settings), config)
        from hook.core.decide import decide
        from hook.core.report import build_report

        plan = decide(inputs)
        report = build_report(inputs, plan)
        if plan.verdict is Verdict.DENY:
            decision = Live(
                code=3, record=report, after=f"oci-device-hook: deny: {clean(plan.reason)}\n", **common
            )
        elif plan.changes:
            decision = Live(
                code=0,
                record=report,
                plan=plan,
                rootfs=inputs.config.root_path,
                host_dev=tuple(inputs.host_dev),
                container=container,
                **common,
            )
        else:
            decision = Live(code=0, record=report, **common)
        return normalized(decision)
    except HookError as exc:
        return normalized(
            Live(
                code=exc.exit_code,
                record={"verdict": "error", "container": {"id": container}, "error": str(exc)},
                log=_log_to(settings if settings is not None else salvaged(opts)),
                annotations=dict(annotations),
                cgroups_path=cgroups,
                before=before + f"oci-device-hook: {exc}\n",
            )
        )


def run_live(opts: dict[str, list[str]], stdin: bytes, session: Session | None = None) -> int:
    """Decide in this process and act (tests, and a hook that the decider did not serve)."""
    from hook.routes.fastpath import look_at

    look = look_at(opts, stdin, fast=False)
    return act_live(
        decide_live(opts, look), pid_of(look), session or Session("prestart", log_always="--log" in opts)
    )
