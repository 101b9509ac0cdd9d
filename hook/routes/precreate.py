"""Spec level: decide on config.json before the runtime starts, and hand it the decided config.

Rule: the same gather and decide as live mode; only the adapter differs (``hook.adapters.specwriter``
folds the Plan into the config instead of applying it to a running container), so the runtime
itself creates only the allowed nodes and writes only the narrowed rules through its own cgroup
driver. There is no state, pid or bundle at this stage: the kubelet checkpoint is found from
the pod identity annotations in the config. A decided config carries a marker (``hook.adapters.marker``)
so that a prestart hook registered as well, or a second pass, does nothing more.

Fail closed for a container that asked for devices or must be narrowed; a container that needs
no decision passes through unchanged (byte for byte) even when the settings are broken.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hook.adapters.marker import ANNOTATION, binding, load_key, sign
from hook.core.decide import Inputs, decide
from hook.core.errors import HookError
from hook.core.escape import clean
from hook.core.oci import OciConfig, parse_config, parse_config_object
from hook.core.plan import Plan, Verdict
from hook.core.record import replace
from hook.core.report import build_report
from hook.routes.gather import host_devices, inputs_for_config, resolved
from hook.routes.live import Session, _decided_before, _remember, _salvaged, options_from
from hook.sources.settingsfile import DEFAULT_PATH, Settings, load_settings

__all__ = ["SOURCE", "run_precreate", "decided_config"]

SOURCE = "config.json (stdin)"
RUNTIME_SEEN_ENV = "OCI_DEVICE_HOOK_RUNTIME"  # what the wrapper read as `runtime` (it cannot parse YAML)
CONTAINER_ID_ENV = "OCI_DEVICE_HOOK_CONTAINER_ID"  # the wrapper knows the id; hooks.d precreate does not
RUNTIME_LOG_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG"  # the runtime's --log, from the wrapper
RUNTIME_LOG_FORMAT_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG_FORMAT"


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


def _log(record: dict[str, Any], settings: Settings | None, config: OciConfig | None) -> None:
    """The live mode's log line; never on stdout (that is the config), whoever runs it."""
    from hook.adapters.log import write_log
    from hook.routes.logrecord import stamp

    s = settings or Settings()
    annotations, cgroups = (dict(config.annotations), config.cgroups_path) if config is not None else ({}, "")
    line = stamp(record, annotations, cgroups_path=cgroups)
    problem = write_log(line, Path(s.log_file), max_bytes=s.log_max_bytes)
    if problem:
        sys.stderr.write(f"oci-device-hook: warning: log dropped: {clean(problem)}\n")


def _runtime_log(message: str) -> None:
    """A refused create's line where the engine looks for the runtime's error (containerd reads the
    last ``"level":"error"`` entry of runc's ``--log`` file); runc never ran to write one. Best effort."""
    import time

    path = os.environ.get(RUNTIME_LOG_ENV)
    if not path:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if os.environ.get(RUNTIME_LOG_FORMAT_ENV) == "json":
        line = json.dumps({"level": "error", "msg": message, "time": stamp})
    else:
        line = f"time={json.dumps(stamp)} level=error msg={json.dumps(message)}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _container_id(config: OciConfig) -> str:
    hostname = config.raw.get("hostname")
    return os.environ.get(CONTAINER_ID_ENV) or (hostname if isinstance(hostname, str) else "")


def run_precreate(opts: dict[str, list[str]], stdin: bytes) -> tuple[int, bytes]:
    """(exit code, bytes for stdout): the decided config, or the input unchanged."""
    settings: Settings | None = None
    config: OciConfig | None = None
    container = ""
    try:
        options = options_from(opts, use_cache=True)
        settings = load_settings(options.settings_file or DEFAULT_PATH, required=bool(options.settings_file))
        _remember(opts, settings, Session())  # later plain containers take the fast path under these settings
        config = parse_config(stdin, SOURCE, "")
        container = _container_id(config)
        if _decided_before(config, config.annotations, settings):
            return 0, stdin  # decided on this node before (the wrapper after podman, a retried create)
        options = resolved(replace(options, settings=settings), settings)
        inputs = inputs_for_config(config, {}, container, options)
        plan = decide(inputs)
        report = build_report(inputs, plan)
        seen = os.environ.get(RUNTIME_SEEN_ENV)
        if seen is not None and seen != settings.runtime:
            report["warnings"] = [
                *report.get("warnings", []),
                f"{options.settings_file or DEFAULT_PATH}: runtime: the wrapper read {seen!r}, YAML says "
                f"{settings.runtime!r}; write it as one plain `runtime: VALUE` line",
            ]
        report["stage"] = "precreate"
        if plan.verdict is Verdict.DENY:
            _log(report, settings, config)
            sys.stderr.write(f"oci-device-hook: deny: {clean(plan.reason)}\n")
            _runtime_log(f"oci-device-hook: deny: {plan.reason}")
            return 3, b""
        if not plan.changes:
            _log(report, settings, config)
            return 0, stdin
        out = decided_config(inputs, plan, options.driver_root or Path("/"), options.spec_dirs)
        key = load_key(Path(settings.cache_dir), create=True)
        if key is not None:
            annotations = out.setdefault("annotations", {})
            annotations.pop(ANNOTATION, None)
            bound = binding(inputs.requests.kubelet, settings)
            annotations[ANNOTATION] = sign(key, parse_config_object(out, SOURCE, ""), bound)
        else:
            report["warnings"] = [
                *report.get("warnings", []),
                "no marker key: a prestart hook will decide again",
            ]
        _log(report, settings, config)
        return 0, (json.dumps(out, indent=2) + "\n").encode()
    except HookError as exc:
        if _passes_through(stdin):
            sys.stderr.write(f"oci-device-hook: warning: {exc} (container needs no decision: unchanged)\n")
            return 0, stdin
        sys.stderr.write(f"oci-device-hook: {exc}\n")
        _runtime_log(f"oci-device-hook: {exc}")
        _log(
            {"verdict": "error", "stage": "precreate", "container": {"id": container}, "error": str(exc)},
            settings if settings is not None else _salvaged(opts),
            config,
        )
        return exc.exit_code, b""


def _passes_through(stdin: bytes) -> bool:
    """With default settings, this config asks for no device and is not widened
    (``hook.routes.fastpath``'s test)."""
    from hook.routes.fastpath import needs_decision

    try:
        config = json.loads(stdin)
        return isinstance(config, dict) and not needs_decision(config, config.get("annotations") or {})
    except (ValueError, TypeError, AttributeError):
        return False
