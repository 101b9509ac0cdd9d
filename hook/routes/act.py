"""Acting on a decision: the one apply-and-log path every route takes, decided here or by the decider.

Rule: a decision (``hook.routes.decision``) is acted on only here and only in the hook's own
process: the live plan is applied to the container the runtime named (its pid, located and
checked to be a container's before anything is written), the record is stamped and logged, the
stderr text is written, and the exit status returned. Whether ``hook serve`` or this process
decided changes nothing below, except the record's ``decider`` field and its warnings. A
spec-level decision only logs (the caller hands the config on), so the runtime wrapper's
per-start process imports no apply module.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

    from hook.routes.decision import Live, LogTo, Spec
    from hook.routes.fastpath import Look

__all__ = ["STDIN", "Session", "act_live", "act_spec", "pid_of", "runtime_log"]

STDIN = "state (stdin)"
SPEC_SOURCE = "config.json (stdin)"  # spec level's config, in every message that names it
# what the runtime wrapper tells the hook through its environment (it cannot parse YAML)
RUNTIME_SEEN_ENV = "OCI_DEVICE_HOOK_RUNTIME"  # what the wrapper read as `runtime`
CONTAINER_ID_ENV = "OCI_DEVICE_HOOK_CONTAINER_ID"  # the wrapper knows the id; hooks.d precreate does not
RUNTIME_LOG_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG"  # the runtime's --log, from the wrapper
RUNTIME_LOG_FORMAT_ENV = "OCI_DEVICE_HOOK_RUNTIME_LOG_FORMAT"


class Session:
    """Where one run reports: the route it took, who decided, and what the record adds.

    ``decider`` is the log record's ``decider`` field (``answered``, ``declined``, ``untrusted``,
    ``fallback``, ``off``; ``""``: no decider on this node, no field); ``warnings`` are appended to
    the record's (why the decider did not decide). ``log_always`` is live mode's ``--log``.
    """

    def __init__(
        self, route: str, *, decider: str = "", warnings: tuple[str, ...] = (), log_always: bool = False
    ) -> None:
        self.route, self.decider, self.warnings, self.log_always = route, decider, warnings, log_always

    def err(self, text: str) -> None:
        if text:
            sys.stderr.write(text)

    def by_hand(self) -> bool:
        """A person ran the hook with the state from a file or a terminal: runtimes (runc, crun)
        always write it into a pipe. Such a run must not add lines to the production log."""
        try:
            mode = os.fstat(0).st_mode
        except OSError:
            return False
        return mode & 0o170000 not in (0o010000, 0o140000)  # neither S_ISFIFO nor S_ISSOCK


def _line(record: dict[str, Any], d: Live | Spec, session: Session) -> dict[str, Any]:
    from hook.routes.logrecord import stamp

    record = dict(record)
    if session.warnings:
        record["warnings"] = [*record.get("warnings", ()), *session.warnings]
    if session.decider:
        record["decider"] = session.decider
    record["route"] = session.route
    return stamp(record, d.annotations, cgroups_path=d.cgroups_path)


def _write(record: dict[str, Any], d: Live | Spec, session: Session, by_hand: bool = False) -> None:
    from hook.adapters.log import write_log

    line = _line(record, d, session)
    log: LogTo = d.log
    if by_hand:
        import json

        sys.stdout.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        session.err(f"oci-device-hook: run by hand: not appended to {log.file} (--log does)\n")
        return
    problem = write_log(line, log.file, max_bytes=log.max_bytes)
    if problem:
        from hook.core.escape import clean  # only for a warning: the written line is JSON-escaped

        session.err(f"oci-device-hook: warning: log dropped: {clean(problem)}\n")


def pid_of(look: Look) -> int | None:
    """The state's pid as ``hook.core.oci`` reads it (0 or absent: none); an invalid one is the
    decision's error to report, and no plan is ever applied then."""
    pid = look.state.get("pid") if look.state is not None else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def act_live(d: Live, pid: int | None, session: Session) -> int:
    """Apply the decision's plan to the container whose init is ``pid``, log, and say the status."""
    session.err(d.before)
    record = d.record
    by_hand = not session.log_always and session.by_hand()
    if d.plan is not None and d.plan.changes:
        from hook.core.errors import HookError, InputError

        try:
            if pid is None:
                raise InputError(STDIN, "pid", "missing: the hook must run as a prestart/createRuntime hook")
            from hook.adapters.apply.locate import find_container
            from hook.adapters.apply.transaction import apply_plan

            # before anything is written: the pid must be a container's (issue 11, item 2)
            target = find_container(pid, d.cgroups_path, source=STDIN)
            # node changes from a thread in the container's namespace: a fork costs ~3 ms a start
            applied = apply_plan(
                d.plan, pid, rootfs=d.rootfs, target=target, host_dev=d.host_dev, in_thread=True
            )
        except HookError as exc:
            session.err(f"oci-device-hook: {exc}\n")
            error = {"verdict": "error", "container": {"id": d.container}, "error": str(exc)}
            _write(error, d, session, by_hand)
            return exc.exit_code
        record = {
            **record,
            "cgroup_version": applied.cgroup_version,
            "program_ids": applied.program_ids,
            "warnings": [*record.get("warnings", ()), *_skipped_warnings(applied.skipped)],
        }
    _write(record, d, session, by_hand)
    session.err(d.after)
    return d.code


def _skipped_warnings(skipped: tuple[tuple[str, str], ...]) -> list[str]:
    """One warning per reason the node helper left changes to the cgroup alone (not the container's /dev)."""
    by_why: dict[str, list[str]] = {}
    for path, why in skipped:
        by_why.setdefault(why, []).append(path)
    return [
        f"{', '.join(paths)}: left as it is, the cgroup alone narrows: {why}" for why, paths in by_why.items()
    ]


def act_spec(d: Spec, config: bytes, session: Session) -> tuple[int, bytes]:
    """Log a spec-level decision; ``(exit status, the config to hand on)`` (empty when refused)."""
    session.err(d.before)
    if d.record is not None:
        _write(d.record, d, session)
    session.err(d.after)
    if d.runtime_log:
        runtime_log(d.runtime_log)
    if d.code != 0:
        return d.code, b""
    return 0, config if d.out is None else d.out


def runtime_log(message: str) -> None:
    """A refused create's line where the engine looks for the runtime's error (containerd reads the
    last ``"level":"error"`` entry of runc's ``--log`` file); runc never ran to write one. Best effort."""
    import time

    path = os.environ.get(RUNTIME_LOG_ENV)
    if not path:
        return
    import json

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
