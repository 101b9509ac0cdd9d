"""Live mode: decide for the starting container and apply the Plan before its process runs.

Rule: fail closed for a container that asked for devices or must be narrowed (any error exits
non-zero, so the runtime aborts it, with everything undone); the fast path in ``hook.routes.fastpath`` has
already let through every container that needs nothing, so the hook never blocks those.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from hook.core.decide import decide
from hook.core.errors import HookError, InputError
from hook.core.escape import clean
from hook.core.oci import OciConfig, parse_state
from hook.core.plan import Verdict
from hook.core.record import replace
from hook.core.report import build_report
from hook.routes.gather import Options, inventory_option, load_config, load_inputs
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Abandoned", "Session", "options_from", "run_live"]

STDIN = "state (stdin)"


class Abandoned(Exception):
    """The requester of a served decision left before ``commit``: nothing is applied or logged."""


class Session:
    """Where one live decision reports, and the two checks a served one adds.

    In-process (the default): stderr is the process's, "by hand" is read from fd 0, ``commit`` and
    ``check_pid`` do nothing. The decider (``hook.routes.serve``) gives each request its own session: the
    stderr text goes back to the client, ``commit`` asks the client for "go" before anything is
    applied or logged (``Abandoned`` when it has already decided in-process), and ``check_pid``
    proves with the client's pidfd that the state's pid is still the process it handed over.
    ``warnings`` are added to the log line (a decider that could not serve, say).
    """

    def __init__(self, warnings: tuple[str, ...] = ()) -> None:
        self.warnings = warnings

    def err(self, text: str) -> None:
        sys.stderr.write(text)

    def by_hand(self) -> bool:
        return _by_hand()

    def commit(self) -> None:
        """Called once before the first side effect (apply, log)."""

    def check_pid(self, pid: int) -> None:
        """Raise ``HookError`` when ``pid`` may no longer be the container's process."""


def options_from(opts: dict[str, list[str]], *, use_cache: bool) -> Options:
    """Live and precreate argv as Options; what is not given comes from the settings (``gather.resolved``)."""
    inventory = opts.get("--inventory")
    config = opts.get("--config")
    root = opts.get("--driver-root")
    return Options(
        driver_root=Path(root[-1]) if root else None,
        spec_dirs=tuple(Path(p) for p in opts.get("--cdi-spec-dir", ())),
        inventory_file=inventory_option(Path(inventory[-1]) if inventory else None),
        settings_file=Path(config[-1]) if config else None,
        use_cache=use_cache,
    )


def _by_hand() -> bool:
    """A person ran the hook with the state from a file or a terminal: runtimes (runc, crun) always
    write the state into a pipe. Such a run must not add lines to the production log."""
    import os
    import stat

    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    return not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))


def _log(
    record: dict[str, Any],
    settings: Settings | None,
    annotations: Mapping[str, str],
    opts: dict[str, list[str]],
    session: Session,
    cgroups_path: str = "",
) -> None:
    import json

    from hook.adapters.log import write_log
    from hook.routes.logrecord import stamp

    session.commit()
    s = settings or Settings()
    if session.warnings:
        record = {**record, "warnings": [*record.get("warnings", ()), *session.warnings]}
    line = stamp(record, annotations, cgroups_path=cgroups_path)
    if "--log" not in opts and session.by_hand():
        sys.stdout.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        session.err(f"oci-device-hook: run by hand: not appended to {s.log_file} (--log does)\n")
        return
    problem = write_log(line, Path(s.log_file), max_bytes=s.log_max_bytes)
    if problem:
        session.err(f"oci-device-hook: warning: log dropped: {clean(problem)}\n")


def _remember(opts: dict[str, list[str]], settings: Settings, session: Session) -> None:
    """Let the fast path serve later containers under custom settings without loading yaml."""
    from hook.sources.settingsfile import DEFAULT_PATH, remember_for_fast_path

    path = Path((opts.get("--config") or [str(DEFAULT_PATH)])[-1])
    if path.exists():
        problem = remember_for_fast_path(path, settings)
        if problem:
            session.err(f"oci-device-hook: warning: fast path cache: {clean(problem)}\n")


def _settings_cannot_matter(config: OciConfig, annotations: Mapping[str, str]) -> bool:
    """No settings file could make this container ask for a device or count as widened.

    Stricter than the fast path's test with default settings: any annotation key that mentions
    CDI (a custom prefix might match it) and any ``/dev/null`` mount (a custom volume-mount root
    might hold it) count as a possible request.
    """
    from hook.routes.fastpath import DEFAULT_MOUNT_ROOT, DEFAULT_PREFIXES, needs_decision

    if needs_decision(dict(config.raw), dict(annotations), DEFAULT_PREFIXES, DEFAULT_MOUNT_ROOT):
        return False
    if any("cdi" in key.lower() for key in annotations):
        return False
    from hook.core.kpath import host_source

    return not any(m.source and host_source(m.source, config.bundle) == "/dev/null" for m in config.mounts)


def _broken_settings(error: InputError, stdin: bytes, opts: dict[str, list[str]], session: Session) -> int:
    """A settings file that does not load stops only the containers whose decision it could change.

    A container that asks for no device under any settings starts (the error is logged and
    printed as a warning, once per container); any other container fails closed with the error.
    """
    container = cgroups = ""
    annotations: Mapping[str, str] = {}
    try:
        state = parse_state(stdin, STDIN)
        container = state.id
        config = load_config(state)
        annotations, cgroups = {**config.annotations, **state.annotations}, config.cgroups_path
        harmless = _settings_cannot_matter(config, annotations)
    except HookError:
        harmless = False
    record: dict[str, Any] = {"container": {"id": container}, "error": str(error)}
    logs = _salvaged(opts)
    if harmless:
        session.commit()
        session.err(f"oci-device-hook: warning: {error}; started: it asks for no device\n")
        reason = "settings file broken; the container asks for no device"
        _log({**record, "verdict": "none", "reason": reason}, logs, annotations, opts, session, cgroups)
        return 0
    session.commit()
    session.err(f"oci-device-hook: {error}\n")
    _log({**record, "verdict": "error"}, logs, annotations, opts, session, cgroups)
    return error.exit_code


def _salvaged(opts: dict[str, list[str]]) -> Settings | None:
    """The log a broken ``--config`` still names (``settings.salvage_log``); None: the default."""
    from hook.sources.settingsfile import salvage_log

    config = opts.get("--config")
    return salvage_log(Path(config[-1])) if config else None


def _decided_before(config: OciConfig, annotations: Mapping[str, str], settings: Settings) -> bool:
    """``hook precreate`` on this node decided exactly these nodes and rules, for this pod, on the
    kubelet evidence and settings it would read now (``hook.adapters.marker``)."""
    from hook.adapters.marker import ANNOTATION, binding, load_key, verify
    from hook.routes.gather import kubelet_evidence

    if ANNOTATION not in config.annotations:
        return False
    key = load_key(Path(settings.cache_dir), create=False)
    if key is None:
        return False
    evidence = kubelet_evidence(annotations, config.cgroups_path, settings)
    return verify(key, config, binding(evidence, settings))


def _skipped_warnings(skipped: tuple[tuple[str, str], ...]) -> list[str]:
    """One warning per reason the node helper left changes to the cgroup alone (not the container's /dev)."""
    by_why: dict[str, list[str]] = {}
    for path, why in skipped:
        by_why.setdefault(why, []).append(path)
    return [
        f"{', '.join(paths)}: left as it is, the cgroup alone narrows: {why}" for why, paths in by_why.items()
    ]


def run_live(opts: dict[str, list[str]], stdin: bytes, session: Session | None = None) -> int:
    """Decide for the container in ``stdin`` (its OCI state) and apply; the exit status.

    ``session`` is where output goes and what a served decision checks (``Session``); the
    decider and the in-process hook run exactly this code.
    """
    session = session or Session()
    settings: Settings | None = None
    container = cgroups = ""
    annotations: Mapping[str, str] = {}
    try:
        options = options_from(opts, use_cache=True)
        # settings first, so that an error in the state or config.json is logged where the operator said
        try:
            settings = load_settings(
                options.settings_file or DEFAULT_PATH, required=bool(options.settings_file)
            )
        except InputError as exc:
            return _broken_settings(exc, stdin, opts, session)
        _remember(opts, settings, session)
        state = parse_state(stdin, STDIN)
        container = state.id
        annotations = state.annotations
        config = load_config(state)
        annotations, cgroups = {**config.annotations, **state.annotations}, config.cgroups_path
        if _decided_before(config, annotations, settings):
            record = {"verdict": "none", "reason": "decided at precreate (valid marker): nothing more to do"}
            _log({**record, "container": {"id": container}}, settings, annotations, opts, session, cgroups)
            return 0
        inputs = load_inputs(state, replace(options, settings=settings), config)
        plan = decide(inputs)
        report = build_report(inputs, plan)
        if plan.verdict is Verdict.DENY:
            _log(report, settings, annotations, opts, session, cgroups)
            session.err(f"oci-device-hook: deny: {clean(plan.reason)}\n")
            return 3
        if plan.changes:
            if state.pid is None:
                raise InputError(STDIN, "pid", "missing: the hook must run as a prestart/createRuntime hook")
            from hook.adapters.apply.locate import find_container
            from hook.adapters.apply.transaction import apply_plan

            session.commit()
            session.check_pid(state.pid)
            # before anything is written: the pid must be a container's (issue 11, item 2)
            target = find_container(state.pid, inputs.config.cgroups_path, source=STDIN)
            applied = apply_plan(
                plan, state.pid, rootfs=inputs.config.root_path, target=target, host_dev=inputs.host_dev
            )
            session.check_pid(state.pid)
            report["cgroup_version"] = applied.cgroup_version
            report["program_ids"] = applied.program_ids
            report["warnings"] += _skipped_warnings(applied.skipped)
        _log(report, settings, annotations, opts, session, cgroups)
        return 0
    except HookError as exc:
        session.err(f"oci-device-hook: {exc}\n")
        _log(
            {"verdict": "error", "container": {"id": container}, "error": str(exc)},
            settings if settings is not None else _salvaged(opts),  # an option failed before the settings
            annotations,
            opts,
            session,
            cgroups,
        )
        return exc.exit_code
