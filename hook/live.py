"""Live mode: decide for the starting container and apply the Plan before its process runs.

Rule: fail closed for a container that asked for devices or must be narrowed (any error exits
non-zero, so the runtime aborts it, with everything undone); the fast path in ``hook.entry`` has
already let through every container that needs nothing, so the hook never blocks those.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hook.decide import decide
from hook.errors import HookError, InputError
from hook.gather import Options, load_config, load_inputs
from hook.oci import OciConfig, parse_state
from hook.plan import Verdict
from hook.record import replace
from hook.report import build_report
from hook.settings import DEFAULT_PATH, Settings, load_settings

__all__ = ["options_from", "log_record", "run_live"]

STDIN = "state (stdin)"


def options_from(opts: dict[str, list[str]], *, use_cache: bool) -> Options:
    """Live and precreate argv as Options; what is not given comes from the settings (``gather.resolved``)."""
    inventory = opts.get("--inventory")
    config = opts.get("--config")
    root = opts.get("--driver-root")
    return Options(
        driver_root=Path(root[-1]) if root else None,
        spec_dirs=tuple(Path(p) for p in opts.get("--cdi-spec-dir", ())),
        inventory_file=Path(inventory[-1]) if inventory else None,
        settings_file=Path(config[-1]) if config else None,
        use_cache=use_cache,
    )


def _log(record: dict[str, Any], settings: Settings | None) -> None:
    from hook.log import write_log

    s = settings or Settings()
    problem = write_log(record, Path(s.log_file), max_bytes=s.log_max_bytes)
    if problem:
        sys.stderr.write(f"oci-device-hook: warning: log: {problem}\n")


def _remember(opts: dict[str, list[str]], settings: Settings) -> None:
    """Let the fast path serve later containers under custom settings without loading yaml."""
    from hook.settings import DEFAULT_PATH, remember_for_fast_path

    path = Path((opts.get("--config") or [str(DEFAULT_PATH)])[-1])
    if path.exists():
        problem = remember_for_fast_path(path, settings)
        if problem:
            sys.stderr.write(f"oci-device-hook: warning: fast path cache: {problem}\n")


log_record = _log  # precreate logs the same record to the same file


def _decided_before(config: OciConfig, settings: Settings) -> bool:
    """``hook precreate`` on this node decided exactly these nodes and rules (``hook.marker``)."""
    from hook.marker import ANNOTATION, load_key, verify

    if ANNOTATION not in config.annotations:
        return False
    return verify(load_key(Path(settings.cache_dir), create=False), config)


def run_live(opts: dict[str, list[str]], stdin: bytes) -> int:
    settings: Settings | None = None
    container = ""
    try:
        options = options_from(opts, use_cache=True)
        # settings first, so that an error in the state or config.json is logged where the operator said
        settings = load_settings(options.settings_file or DEFAULT_PATH, required=bool(options.settings_file))
        _remember(opts, settings)
        state = parse_state(stdin, STDIN)
        container = state.id
        config = load_config(state)
        if _decided_before(config, settings):
            _log(
                {"verdict": "none", "reason": "decided at precreate (valid marker): nothing more to do",
                 "container": {"id": container}},
                settings,
            )
            return 0
        inputs = load_inputs(state, replace(options, settings=settings), config)
        plan = decide(inputs)
        report = build_report(inputs, plan)
        if plan.verdict is Verdict.DENY:
            _log(report, settings)
            sys.stderr.write(f"oci-device-hook: deny: {plan.reason}\n")
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
