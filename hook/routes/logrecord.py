"""What one live-mode log line says besides the decision: when, which hook, which pod, which engine.

Rule: pure functions of the annotations, ``linux.cgroupsPath`` and a clock value; nothing here
reads files or decides. The fields answer "what happened to pod X and when" from the log alone
(``hook log``), so they are named the same for every engine: containerd's and CRI-O's CRI
annotations both become ``pod.namespace`` / ``pod.name`` / ``pod.container``, read from the keys
of the engine that wrote the config only (``hook.sources.kubelet.podid``). Values come from a container's
annotations and are stored as JSON strings (escaped by ``json.dumps``), capped so one line stays small.
"""

from __future__ import annotations

import time

from hook import STARTED
from hook.core.version import VERSION
from hook.sources.kubelet.podid import identify

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["engine_of", "pod_of", "rfc3339", "stamp"]

MAX_VALUE = 253  # a DNS subdomain, the longest a namespace/pod name may be

# an annotation key (or key prefix, ending in "."/"/") that only one engine sets; containerd and
# CRI-O are told by hook.sources.kubelet.podid (a pod can write either's keys), these only when neither is
_ENGINE_MARKS = (
    ("io.container.manager", "podman"),  # "libpod"; podman also sets CRI-O's annotations
    ("io.podman.", "podman"),
    ("com.docker.", "docker"),
    ("oci-device-hook/decided", "runtime-wrapper"),
)


def _cap(value: str) -> str:
    return value if len(value) <= MAX_VALUE else value[:MAX_VALUE] + "…"


def pod_of(annotations: Mapping[str, str], cgroups_path: str = "") -> dict[str, str]:
    """``{"namespace", "name", "container"}`` as the container's own engine wrote them
    (``hook.sources.kubelet.podid``); ``{}`` outside Kubernetes and when no identity is trusted (a line
    is never
    filed under a pod another engine's keys name)."""
    pod = identify(annotations, cgroups_path).pod
    if pod is None:
        return {}
    values = (pod.namespace, pod.name, pod.container)
    return {k: _cap(v) for k, v in zip(("namespace", "name", "container"), values, strict=True) if v}


def engine_of(annotations: Mapping[str, str], cgroups_path: str = "") -> str:
    """Which engine created the container, as far as its config tells; ``""`` when it doesn't."""
    engine = identify(annotations, cgroups_path).engine
    if engine:
        return engine
    for mark, name in _ENGINE_MARKS:
        if any(key.startswith(mark) for key in annotations):
            return name
    return ""


def rfc3339(now: float) -> str:
    """UTC, millisecond precision, ``Z``: sorts as text and parses with ``datetime.fromisoformat``."""
    whole = int(now)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((now - whole) * 1000):03d}Z"


def stamp(
    record: dict[str, Any],
    annotations: Mapping[str, str],
    now: float | None = None,
    cgroups_path: str = "",
) -> dict[str, Any]:
    """The record with ``time``, ``version``, ``duration_ms``, ``pod`` and ``engine`` added (a
    new dict); ``cgroups_path`` is the config's ``linux.cgroupsPath`` ("" when the config
    was not read). ``duration_ms``: since the hook's package was imported (``hook.STARTED``), so
    right only in the process that runs one container's route (the hook's, never a long-lived
    decider's); ``hook metrics`` makes its latency histogram from it."""
    out = dict(record)
    out["time"] = rfc3339(time.time() if now is None else now)
    out["version"] = VERSION
    out["duration_ms"] = round((time.monotonic() - STARTED) * 1000, 3)
    pod = pod_of(annotations, cgroups_path)
    if pod:
        out["pod"] = pod
    engine = engine_of(annotations, cgroups_path)
    if engine:
        out["engine"] = engine
    return out
