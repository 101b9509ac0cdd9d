"""Offer a container to the node's decider: the one place every route asks, and says who decided.

Rule: the per-start process asks only when the settings allow it (``decider: off``, read from
the fast path's compiled record without loading yaml, means never) and only for a runtime's run
(the state in a pipe; by hand, the in-process path prints the record instead). An answer is
turned into a decision (``hook.routes.decision``) and nothing else; any other outcome is a
``Session`` that makes the in-process decision's record say why (``decider`` and a warning).
"""

from __future__ import annotations

import gc
import os

from hook.routes import client, wire
from hook.routes.act import Session
from hook.routes.fastpath import DEFAULT_SETTINGS, Look, decider_setting

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from hook.routes.decision import Live, Spec

__all__ = ["checked", "live", "live_level", "spec", "spec_level"]


def _settings_path(opts: dict[str, list[str]]) -> str:
    return (opts.get("--config") or [DEFAULT_SETTINGS])[-1]


def _by_pipe() -> bool:
    try:
        return os.fstat(0).st_mode & 0o170000 in (0o010000, 0o140000)  # S_ISFIFO, S_ISSOCK
    except OSError:
        return False


def _answer_modules() -> None:
    """What acting on any answer loads (read it, stamp and write its record), imported while the
    decider decides: about 1 ms of imports off the start's path where the decider has a core."""
    import hook.adapters.log
    import hook.routes.decision
    import hook.routes.logrecord  # noqa: F401


def _answer_modules_live() -> None:
    """``_answer_modules``, a live decision's plan values and the apply step every plan with a
    change runs (locating the cgroup, the transaction and v1's writer). The node helper and v2's
    writer are left to the plans that need them."""
    _answer_modules()
    import hook.adapters.apply.locate
    import hook.adapters.apply.transaction
    import hook.core.plainplan  # noqa: F401


def _offer(
    route: bytes, opts: dict[str, list[str]], parts: list[tuple[bytes, bytes]], session: Session
) -> Live | Spec | None:
    """The decider's decision, or None with ``session`` saying why (nothing: no decider here)."""
    path = _settings_path(opts)
    if decider_setting(path) == "off":
        session.decider = "off"
        return None
    meanwhile = _answer_modules_live if route == b"live" else _answer_modules
    got, body = client.ask(route, wire.fingerprint(opts, path), parts, meanwhile=meanwhile)
    if got == "answered" and isinstance(body, bytes):
        # What is left of an answered start (read the plan, apply, log, exit) is short and bounded,
        # and the process ends in os._exit: the cycle collector's passes there (about 0.6 ms a
        # start, a few dozen objects found) are skipped. An in-process decision keeps it.
        gc.disable()
        from hook.routes.decision import Live, from_wire

        try:
            decision = from_wire(body)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            got, body = "fallback", "an answer this hook cannot read"
        else:
            if isinstance(decision, Live) == (route == b"live"):
                session.decider = "answered"
                return decision
            got, body = "fallback", "an answer for another route"
        gc.enable()
    if got:
        session.decider = "off" if body == "declined: decider: off in the settings" else got
        if session.decider != "off":
            session.warnings = (*session.warnings, f"decider: {body!s}; decided in-process")
    return None


def live(stage: str, opts: dict[str, list[str]], look: Look) -> tuple[Live | None, Session]:
    """The decider's live decision for the container in ``look``, or None (decide in-process)."""
    session = Session(stage, log_always="--log" in opts)
    if not _by_pipe() or look.state is None:
        return None, session
    look.read_config()
    if look.config_bytes is None:
        return None, session  # in-process reports why it cannot be read, with the file
    decision = _offer(b"live", opts, [(wire.STATE, look.stdin), (wire.CONFIG, look.config_bytes)], session)
    return decision, session  # type: ignore[return-value]


def spec(route: str, opts: dict[str, list[str]], config: bytes) -> tuple[Spec | None, Session]:
    """The decider's spec-level decision for ``config`` (precreate, the runtime wrapper), or None."""
    from hook.routes.act import CONTAINER_ID_ENV, RUNTIME_SEEN_ENV

    session = Session(route)
    facts = []
    for name, env in (("id", CONTAINER_ID_ENV), ("runtime", RUNTIME_SEEN_ENV)):
        value = os.environ.get(env)
        if value is not None:
            facts.append(f"{name}={value}".encode("utf-8", "surrogateescape"))
    parts = [(wire.CONFIG, config), (wire.FACTS, b"\0".join(facts))]
    return _offer(b"precreate", opts, parts, session), session  # type: ignore[return-value]


def live_level(stage: str, opts: dict[str, list[str]], look: Look) -> int:
    """Decide (the decider, else this process) and act, for a container the fast path did not let through."""
    from hook.routes.act import act_live, pid_of

    decision, session = live(stage, opts, look)
    if decision is None:
        from hook.routes.live import decide_live

        decision = decide_live(opts, look)
    return act_live(decision, pid_of(look), session)


def spec_level(route: str, opts: dict[str, list[str]], config: bytes) -> tuple[int, bytes]:
    """A spec-level decision (the decider's, else this process's), logged: (exit status, config)."""
    from hook.routes.act import act_spec

    decision, session = spec(route, opts, config)
    if decision is None:
        from hook.routes.precreate import decide_spec, facts_from_env

        decision = decide_spec(opts, config, facts_from_env())
    return act_spec(checked(decision, config, opts), config, session)


def checked(decision: Spec, config: bytes, opts: dict[str, list[str]]) -> Spec:
    """``decision`` after the checks this container needs in the hook's own process: the crun guard
    (``hook.routes.crunguard``) only where ``hook.routes.crungate`` says the runtime may be crun
    with its systemd driver and a rule may be widened (fail-closed); nothing is loaded otherwise."""
    if not decision.may_widen:  # no rule crun's driver widens: not even the gate is loaded
        return decision
    from hook.routes.crungate import needs_guard

    if not needs_guard(decision.may_widen, decision.systemd_path, os.environ):
        return decision
    from hook.routes.act import SPEC_SOURCE
    from hook.routes.crunguard import guarded

    return guarded(decision, config, SPEC_SOURCE, opts)
