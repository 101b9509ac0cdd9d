"""Simulation (``hook --bundle DIR``): the decision live mode would take, printed instead of applied.

Rule: shares ``gather``/``decide`` with live mode and differs only in the adapter: it renders the
report (and, with ``--output-config``, writes the config ``hook precreate`` would hand the runtime).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hook.core.errors import HookError

__all__ = ["simulate"]


def simulate(
    opts: Any,
    bundle: Path,
    state_file: Path | None,
    output_config: Path | None,
    fmt: str,
    resolved: Callable[[], Any],
) -> tuple[str, int]:
    """(report text, exit code: 3 for deny); ``resolved`` gives the options with the settings' paths."""
    from hook.core.decide import decide
    from hook.core.record import replace
    from hook.core.report import build_report, render_json, render_text
    from hook.routes.gather import load_inputs, read_state_file, state_from_bundle

    state = read_state_file(state_file) if state_file else state_from_bundle(bundle)
    state = replace(state, bundle=str(bundle))
    inputs = load_inputs(state, opts)
    plan = decide(inputs)
    report = build_report(inputs, plan)
    if output_config is not None:
        _write_config(inputs, plan, resolved(), output_config)
    text = render_json(report) if fmt == "json" else render_text(report)
    return text, 3 if report["verdict"] == "deny" else 0


def _write_config(inputs: Any, plan: Any, opts: Any, out: Path) -> None:
    """The config ``hook precreate`` would hand the runtime (the same fold: ``precreate.decided_config``)."""
    from hook.routes.crunguard import check_config
    from hook.routes.precreate import decided_config

    config = decided_config(inputs, plan, opts.driver_root, opts.spec_dirs)
    check_config(config, str(out), {}, lambda: opts.driver_root)  # no command line: cgroupsPath tells
    try:
        out.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise HookError(str(out), "", exc.strerror or str(exc)) from None
