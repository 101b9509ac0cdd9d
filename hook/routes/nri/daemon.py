"""``hook nri``: the node daemon. Connects to the runtime's NRI socket, registers, serves, and
connects again with backoff whenever the runtime drops it or restarts.

Rule: the daemon never exits on what a peer sends (``hook.routes.nri.session`` bounds it and
ends that session) and talks to no listener that is not root's (``SO_PEERCRED``: a pod's non-root
process that got to listen at the path is not a runtime). It logs one line to stderr when
registered and one when dropped, with why, and the decision records to the settings' log as every
route does (``route: nri``). Backoff doubles from ``MIN_BACKOFF`` to ``MAX_BACKOFF`` while
connecting fails and starts again after a session that registered; a failing connect is logged
once per streak, not once per try. The views a decision reads stay warm across containers
(``hook.sources.warm``), as in ``hook serve``.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable

from hook.core.escape import clean
from hook.routes.nri.messages import register
from hook.routes.nri.plugin import Plugin
from hook.routes.nri.session import Session
from hook.routes.nri.verdicts import Answer, Ctx
from hook.routes.options import Options

__all__ = ["MAX_BACKOFF", "MIN_BACKOFF", "log_answer", "run"]

MIN_BACKOFF, MAX_BACKOFF = 0.5, 5.0  # a unix connect is cheap: the runtime back sooner is served sooner


def say(text: str) -> None:
    sys.stderr.write(f"oci-device-hook nri: {clean(text)}\n")
    sys.stderr.flush()


def log_answer(a: Answer) -> None:
    """The decision record, stamped and appended to the settings' log (nothing when None)."""
    if a.record is None:
        return
    from hook.adapters.log import write_log
    from hook.routes.logrecord import stamp
    from hook.sources.settingsfile import Settings

    duration = a.record.get("duration_ms")
    line = stamp({**a.record, "route": "nri"}, a.annotations, cgroups_path=a.cgroups_path)
    if duration is not None:
        line["duration_ms"] = duration
    else:
        line.pop("duration_ms", None)  # since the daemon's start: meaningless here
    s = a.settings or Settings()
    problem = write_log(line, s.log_file, max_bytes=s.log_max_bytes)
    if problem:
        say(f"warning: log dropped: {problem}")


# what a decision and a start's apply import on first use: loaded with the daemon, not inside the
# first container's CreateContainer or StartContainer (a daemon is started once, off every path)
PRELOAD = (
    "hook.core.decide",
    "hook.core.oci",
    "hook.core.report",
    "hook.routes.fastpath",
    "hook.routes.gather",
    "hook.routes.nri.target",
    "hook.adapters.apply.transaction",
    "hook.adapters.apply.ownmounts",
    "hook.adapters.apply.devnodes",
    "hook.adapters.apply.cgroup_v2",
    "hook.adapters.log",
    "hook.routes.logrecord",
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def peer_problem(sock: socket.socket) -> str:
    """Why the listener is not a runtime's ("" when it may be): the runtime runs as root, so a
    listener of another uid (``SO_PEERCRED``, the kernel's word) is someone else's."""
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return f"the listener (pid {pid}) runs as uid {uid}, not root: not a runtime" if uid != 0 else ""


def run(
    socket_path: str,
    options: Options,
    name: str,
    index: str,
    *,
    sessions: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_session: Callable[[Plugin], None] | None = None,
) -> int:
    """Serve until killed (or ``sessions`` sessions have ended: tests)."""
    from hook.sources import warm

    warm.enable()
    _preload()
    plugin = Plugin(Ctx(options=options), log_answer, say)
    backoff, failing, done = MIN_BACKOFF, "", 0
    label = f"{index}-{name}"
    while sessions is None or done < sessions:
        try:
            sock = _connect(socket_path)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if why != failing:
                say(f"cannot connect to {socket_path}: {why}; retrying with backoff up to {MAX_BACKOFF:.0f}s")
                failing = why
            sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            continue
        failing = ""
        session = Session(sock, plugin, register(name, index), log=say)
        try:
            why = peer_problem(sock) or session.run()
        except Exception as exc:  # a bug ends this session only: the daemon never exits on a peer's bytes
            why = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            sock.close()
        done += 1
        if on_session is not None:
            on_session(plugin)
        state = "dropped" if session.is_registered else "not registered"
        say(f"{state} as {label} at {socket_path}: {why}; connecting again in {backoff:g}s")
        if session.is_registered:
            backoff = MIN_BACKOFF
        sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)
    return 0
