"""What one live-mode log line says besides the decision: when, which hook, which pod, which engine.

Rule: pure functions of the annotations and a clock value; nothing here reads files or decides.
The fields answer "what happened to pod X and when" from the log alone (``hook log``), so they
are named the same for every engine: containerd's and CRI-O's CRI annotations both become
``pod.namespace`` / ``pod.name`` / ``pod.container``. Values come from a container's annotations
and are stored as JSON strings (escaped by ``json.dumps``), capped so one line stays small.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from hook.version import VERSION

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["engine_of", "pod_of", "rfc3339", "stamp"]

MAX_VALUE = 253  # a DNS subdomain, the longest a namespace/pod name may be

# (namespace, pod name, container name) annotation keys per engine
_POD_KEYS = (
    (
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.cri.container-name",
    ),  # containerd
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),  # CRI-O
)

# an annotation key (or key prefix, ending in "."/"/") that only one engine sets
_ENGINE_MARKS = (
    ("io.container.manager", "podman"),  # "libpod"; podman also sets CRI-O's annotations
    ("io.podman.", "podman"),
    ("io.kubernetes.cri-o.", "cri-o"),
    ("io.kubernetes.cri.", "containerd"),
    ("com.docker.", "docker"),
    ("oci-device-hook/decided", "runtime-wrapper"),
)


def _cap(value: str) -> str:
    return value if len(value) <= MAX_VALUE else value[:MAX_VALUE] + "…"


def pod_of(annotations: Mapping[str, str]) -> dict[str, str]:
    """``{"namespace", "name", "container"}`` from the CRI annotations; ``{}`` outside Kubernetes."""
    for keys in _POD_KEYS:
        values = [annotations.get(k) for k in keys]
        if any(isinstance(v, str) and v for v in values):
            return {
                field: _cap(v)
                for field, v in zip(("namespace", "name", "container"), values, strict=True)
                if isinstance(v, str) and v
            }
    return {}


def engine_of(annotations: Mapping[str, str]) -> str:
    """Which engine created the container, as far as its annotations tell; ``""`` when they don't."""
    for mark, engine in _ENGINE_MARKS:  # in the table's order: CRI-O's own marks outrank CRI ones
        if any(key.startswith(mark) for key in annotations):
            return engine
    return ""


def rfc3339(now: float) -> str:
    """UTC, millisecond precision, ``Z``: sorts as text and parses with ``datetime.fromisoformat``."""
    whole = int(now)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((now - whole) * 1000):03d}Z"


def stamp(record: dict[str, Any], annotations: Mapping[str, str], now: float | None = None) -> dict[str, Any]:
    """The record with ``time``, ``version``, ``pod`` and ``engine`` added (a new dict)."""
    out = dict(record)
    out["time"] = rfc3339(time.time() if now is None else now)
    out["version"] = VERSION
    pod = pod_of(annotations)
    if pod:
        out["pod"] = pod
    engine = engine_of(annotations)
    if engine:
        out["engine"] = engine
    return out
