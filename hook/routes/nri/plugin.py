"""The plugin's side of NRI: what each call of the runtime's is answered, and what is remembered.

Rule: the handler ``hook.routes.nri.session`` serves. Configure says which events we take (create,
start, stop, remove) and tells the runtime's NRI version (whether an adjustment's device rules are
applied: NRI >= 0.10, else treated as not; unknown is "not"). Synchronize queues every running
container the daemon has not enforced (started while it was away) for a late narrowing, run
within seconds of registration (``work``), logged with ``late: true`` and counted. Create and
start answer through ``hook.routes.nri.verdicts``; every decision that did something is logged as
every route logs. Memory is per container, from create to stop or remove, and bounded
(``MAX_REMEMBERED``, oldest first out): a forgotten container is narrowed again at the next
start or Synchronize, which changes nothing twice (the apply adapters are idempotent). Create's
decision is kept for that container's start only (``MAX_DECIDED``): one forgotten is made again.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from hook.core.rules import Rule
from hook.routes.nri import messages as m
from hook.routes.nri.verdicts import Answer, Ctx, Decided, on_create, on_start

__all__ = ["EVENTS", "MAX_DECIDED", "MAX_REMEMBERED", "Plugin", "rules_applied"]

EVENTS = (m.CREATE_CONTAINER, m.START_CONTAINER, m.STOP_CONTAINER, m.REMOVE_CONTAINER)
MAX_REMEMBERED = 8192
MAX_DECIDED = 64  # create decisions waiting for their start (a kubelet starts right after create)
STARTED = (2, 3)  # ContainerState PAUSED, RUNNING: its StartContainer is past (CREATED's is to come)
INVALID_ARGUMENT = 3


def _version(text: str) -> tuple[int, ...]:
    """Leading numbers of ``v2.1.9``, ``1.34.0-rc.1`` or ``0.10.0``; () when there are none."""
    parts = []
    for piece in text.strip().lstrip("v").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


def rules_applied(cfg: m.Configure) -> bool:
    """Whether the runtime applies device-cgroup rules from an adjustment (NRI >= 0.10: containerd
    >= 2.2, CRI-O >= 1.34). Told from NRI's own version where the runtime sends it, else from the
    runtime's; anything else is "no" (start then narrows alone, which it does in every case)."""
    if cfg.nri_version:
        return _version(cfg.nri_version)[:2] >= (0, 10)
    version = _version(cfg.runtime_version)
    if not version:
        return False
    name = cfg.runtime_name.lower()
    if name == "containerd":
        return version[:2] >= (2, 2)
    if name in ("cri-o", "crio"):
        return version[:2] >= (1, 34)
    return False


class Plugin:
    def __init__(
        self,
        ctx: Ctx,
        log_record: Callable[[Answer], None],
        say: Callable[[str], None],
        *,
        max_remembered: int = MAX_REMEMBERED,
    ) -> None:
        self.ctx, self.log_record, self.say = ctx, log_record, say
        self.config: m.Configure | None = None
        self._max = max_remembered
        self._trims: OrderedDict[str, tuple[Rule, ...]] = OrderedDict()  # created, start must take these back
        self._decided: OrderedDict[str, Decided] = OrderedDict()  # created: the decision start may reuse
        self._enforced: OrderedDict[str, None] = OrderedDict()  # started and checked
        self._late: deque[tuple[m.Pod, m.Container]] = deque()
        self._pods: dict[str, m.Pod] = {}  # a paged Synchronize's pods, until its last page
        self.late_narrowed = self.late_failed = 0

    # -- memory (bounded) --
    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any, most: int = 0) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > (most or self._max):
            table.popitem(last=False)

    def forget(self, container_id: str, removed_from: m.Pod | None = None, name: str = "") -> None:
        """Stop or remove: the container's own memory; remove: also the pod view a decision kept."""
        self._trims.pop(container_id, None)
        self._decided.pop(container_id, None)
        self._enforced.pop(container_id, None)
        if removed_from is not None and removed_from.uid:
            from hook.sources.kubelet.view import forget

            forget(removed_from.uid, name)

    def remembered(self) -> int:
        return len(self._trims) + len(self._decided) + len(self._enforced) + len(self._late) + len(self._pods)

    # -- the Handler protocol --
    def registered(self) -> None:
        cfg = self.config or m.Configure()
        runtime = f"{cfg.runtime_name or 'a runtime'} {cfg.runtime_version}".strip()
        nri = f"NRI {cfg.nri_version}" if cfg.nri_version else "NRI version not sent"
        rules = "applied at create" if self.ctx.rules_applied else "not applied at create: start narrows"
        self.say(f"registered with {runtime} ({nri}; device rules {rules})")

    def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        try:
            return self._call(method, payload)
        except ValueError as exc:
            return INVALID_ARGUMENT, f"oci-device-hook: {method}: undecodable request: {exc}", b""

    def _call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        if method == "Configure":
            self.config = m.parse_configure(payload)
            from hook.core.record import replace

            self.ctx = replace(self.ctx, rules_applied=rules_applied(self.config))
            return 0, "", m.configured(EVENTS)
        if method == "Synchronize":
            return 0, "", self._synchronize(m.parse_sync(payload))
        if method == "CreateContainer":
            t0 = time.monotonic()  # the record's duration_ms counts decoding the request too
            return self._answer(self._create(m.event(m.CREATE_CONTAINER, payload), t0))
        if method == "StartContainer":
            t0 = time.monotonic()
            return self._answer(self._start(m.event(m.START_CONTAINER, payload), t0))
        if method in ("StopContainer", "RemoveContainer"):
            ev = m.event(0, payload)
            self.forget(ev.container.id, ev.pod if method == "RemoveContainer" else None, ev.container.name)
            return 0, "", b""
        if method == "StateChange":
            t0 = time.monotonic()
            ev = m.state_change(payload)
            if ev.kind == m.START_CONTAINER:
                return self._answer(self._start(ev, t0))
            if ev.kind in (m.STOP_CONTAINER, m.REMOVE_CONTAINER):
                removed = ev.pod if ev.kind == m.REMOVE_CONTAINER else None
                self.forget(ev.container.id, removed, ev.container.name)
            return 0, "", b""
        if method == "Shutdown":
            return 0, "", b""
        return 12, f"oci-device-hook: {method[:100]!r} is not served", b""

    def _answer(self, a: Answer) -> tuple[int, str, bytes]:
        self.log_record(a)
        return a.code, a.message, a.payload

    def _create(self, ev: m.Event, t0: float) -> Answer:
        a = on_create(ev.pod, ev.container, self.ctx, t0)
        if a.code == 0 and a.trims:
            self._remember(self._trims, ev.container.id, a.trims)
        if a.code == 0 and a.decided is not None:
            self._remember(self._decided, ev.container.id, a.decided, min(self._max, MAX_DECIDED))
        else:  # a container id created again: never another create's decision
            self._decided.pop(ev.container.id, None)
        return a

    def _start(self, ev: m.Event, t0: float) -> Answer:
        cid = ev.container.id
        decided = self._decided.pop(cid, None)
        a = on_start(ev.pod, ev.container, self.ctx, cut=self._trims.pop(cid, ()), t0=t0, decided=decided)
        if a.code == 0:
            self._remember(self._enforced, cid, None)
        return a

    def _synchronize(self, sync: m.Sync) -> bytes:
        for pod in sync.pods:
            if len(self._pods) < self._max:
                self._pods[pod.id] = pod
        for c in sync.containers:
            if c.state in STARTED and c.id not in self._enforced and len(self._late) < self._max:
                self._late.append((self._pods.get(c.pod_sandbox_id, m.Pod()), c))
        if not sync.more:
            self._pods.clear()
        return m.synchronized(sync.more)

    def work(self) -> bool:
        """One late narrowing (see the module rule); False when none is queued."""
        if not self._late:
            return False
        pod, c = self._late.popleft()
        t0 = time.monotonic()
        a = on_start(pod, c, self.ctx, late=True)
        self.log_record(a)
        rec = a.record or {}
        if rec.get("verdict") == "error" or a.code:
            self.late_failed += 1
            self.say(f"error: late narrowing of container {c.id[:64]!r} failed: {a.message}")
        else:
            self._remember(self._enforced, c.id, None)
            if rec.get("late") is True and "cgroup_version" in rec:
                self.late_narrowed += 1
                self.say(f"late: narrowed container {c.id[:64]!r} in {time.monotonic() - t0:.3f}s")
        return True
