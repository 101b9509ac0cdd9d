"""Live mode: decide for the starting container and apply the Plan before its process runs.

Rule: fail closed for a container that asked for devices or must be narrowed (any error exits
non-zero, so the runtime aborts it, with everything undone); the fast path in ``hook.entry`` has
already let through every container that needs nothing, so the hook never blocks those.
"""

from __future__ import annotations

import posixpath
import sys
from pathlib import Path
from typing import Any

from hook.decide import decide
from hook.errors import HookError, InputError
from hook.escape import clean
from hook.gather import DEFAULT_SPEC_DIRS, Options, load_config, load_inputs
from hook.oci import OciConfig, parse_state
from hook.plan import Verdict
from hook.record import replace
from hook.report import build_report
from hook.settings import DEFAULT_PATH, Settings, load_settings

__all__ = ["options_from", "run_live"]

STDIN = "state (stdin)"


def options_from(opts: dict[str, list[str]], *, use_cache: bool) -> Options:
    spec_dirs = tuple(Path(p) for p in opts.get("--cdi-spec-dir", ())) or DEFAULT_SPEC_DIRS
    inventory = opts.get("--inventory")
    config = opts.get("--config")
    return Options(
        driver_root=Path((opts.get("--driver-root") or ["/"])[-1]),
        spec_dirs=spec_dirs,
        inventory_file=Path(inventory[-1]) if inventory else None,
        settings_file=Path(config[-1]) if config else None,
        use_cache=use_cache,
    )


def _log(record: dict[str, Any], settings: Settings | None) -> None:
    from hook.log import write_log

    s = settings or Settings()
    problem = write_log(record, Path(s.log_file), max_bytes=s.log_max_bytes)
    if problem:
        sys.stderr.write(f"oci-device-hook: warning: log dropped: {clean(problem)}\n")


def _remember(opts: dict[str, list[str]], settings: Settings) -> None:
    """Let the fast path serve later containers under custom settings without loading yaml."""
    from hook.settings import DEFAULT_PATH, remember_for_fast_path

    path = Path((opts.get("--config") or [str(DEFAULT_PATH)])[-1])
    if path.exists():
        problem = remember_for_fast_path(path, settings)
        if problem:
            sys.stderr.write(f"oci-device-hook: warning: fast path cache: {clean(problem)}\n")


def _settings_cannot_matter(config: OciConfig, annotations: dict[str, str]) -> bool:
    """No settings file could make this container ask for a device or count as widened.

    Stricter than the fast path's test with default settings: any annotation key that mentions
    CDI (a custom prefix might match it) and any ``/dev/null`` mount (a custom volume-mount root
    might hold it) count as a possible request.
    """
    from hook.entry import DEFAULT_MOUNT_ROOT, DEFAULT_PREFIXES, needs_decision

    if needs_decision(dict(config.raw), annotations, DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT):
        return False
    if any("cdi" in key.lower() for key in (*annotations, *config.annotations)):
        return False
    return not any(m.source and posixpath.normpath(m.source) == "/dev/null" for m in config.mounts)


def _broken_settings(error: InputError, stdin: bytes) -> int:
    """A settings file that does not load stops only the containers whose decision it could change.

    A container that asks for no device under any settings starts (the error is logged and
    printed as a warning, once per container); any other container fails closed with the error.
    """
    container = ""
    try:
        state = parse_state(stdin, STDIN)
        container = state.id
        config = load_config(state)
        harmless = _settings_cannot_matter(config, {**config.annotations, **state.annotations})
    except HookError:
        harmless = False
    record: dict[str, Any] = {"container": {"id": container}, "error": str(error)}
    if harmless:
        sys.stderr.write(f"oci-device-hook: warning: {error}; started: it asks for no device\n")
        _log({**record, "verdict": "none", "reason": "settings file broken; no device asked for"}, None)
        return 0
    sys.stderr.write(f"oci-device-hook: {error}\n")
    _log({**record, "verdict": "error"}, None)
    return error.exit_code


def run_live(opts: dict[str, list[str]], stdin: bytes) -> int:
    settings: Settings | None = None
    container = ""
    try:
        options = options_from(opts, use_cache=True)
        # settings first, so that an error in the state or config.json is logged where the operator said
        try:
            settings = load_settings(
                options.settings_file or DEFAULT_PATH, required=bool(options.settings_file)
            )
        except InputError as exc:
            return _broken_settings(exc, stdin)
        _remember(opts, settings)
        state = parse_state(stdin, STDIN)
        container = state.id
        inputs = load_inputs(state, replace(options, settings=settings))
        plan = decide(inputs)
        report = build_report(inputs, plan)
        if plan.verdict is Verdict.DENY:
            _log(report, settings)
            sys.stderr.write(f"oci-device-hook: deny: {clean(plan.reason)}\n")
            return 3
        if plan.changes:
            if state.pid is None:
                raise InputError(STDIN, "pid", "missing: the hook must run as a prestart/createRuntime hook")
            from hook.apply.transaction import apply_plan

            applied = apply_plan(plan, state.pid, rootfs=inputs.config.root_path)
            report["cgroup_version"] = applied.cgroup_version
            report["program_ids"] = applied.program_ids
        _log(report, settings)
        return 0
    except HookError as exc:
        sys.stderr.write(f"oci-device-hook: {exc}\n")
        _log({"verdict": "error", "container": {"id": container}, "error": str(exc)}, settings)
        return exc.exit_code
