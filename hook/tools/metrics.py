"""Counters and a latency histogram over the decision log, in the Prometheus text format.

Rule: pure. Records in (the log's JSON lines, already decoded), counts out, text out; reading the
log and writing the node_exporter textfile is ``hook.tools.metricsfile``'s. Nothing here is on a
container's start path: the hook only appends its log line, and these counts are made afterwards
from the log, by ``hook metrics`` (so ``prometheus_client`` is imported here and never by a route).

Every label value comes from a closed set (a log line can be written by hand, a container's
strings never become label values): what is not in the set counts as ``other``, what is absent
as ``unknown`` (older records, or a field a route does not write).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from hook.core.record import field, record

__all__ = ["BUCKETS", "Gauges", "Tally", "tally", "render", "parse", "PREFIX"]

PREFIX = "oci_device_hook"
VERDICTS = frozenset({"none", "apply", "deny", "error"})
ROUTES = frozenset({"prestart", "createRuntime", "precreate", "wrapper", "live", "nri"})
ENGINES = frozenset({"containerd", "cri-o", "podman", "docker", "runtime-wrapper"})
DECIDER = frozenset({"answered", "declined", "fallback", "untrusted", "off"})
# seconds from the hook's start to its log line: the fast decisions are a few ms, the slow ones
# (a cold inventory, a big node) tens; the wrapper's bound is 10 s
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# name -> (help, label names); each is a counter (``_total`` is added by the format)
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "decisions": ("Decisions the hook logged, by verdict, route and engine.", ("verdict", "route", "engine")),
    "narrowed": (
        "Containers narrowed to their allocation (verdict apply with denied accelerator nodes).",
        ("route", "engine"),
    ),
    "refused": (
        "Containers refused by policy (verdict deny: the container did not start).",
        ("route", "engine"),
    ),
    "errors": (
        "Decisions that failed (verdict error: a container that needed a decision did not start).",
        ("route", "engine"),
    ),
    "decider": (
        "How the warm decider took part: answered, declined, fallback (no answer in time), untrusted "
        "(an answer that failed its check), off, or none (no decider on the node, or an older record).",
        ("outcome", "route"),
    ),
    "late_narrowed": (
        "Containers the NRI daemon narrowed late, at Synchronize (started while it was away): "
        "narrowed, or failed (nothing left to refuse: the container runs as it started).",
        ("outcome",),
    ),
    "log_skipped_lines": (
        "Log lines that were not decision records (cut, hand-written, another format).",
        (),
    ),
}
# every series of the closed sets is written from the start, at 0: a rate() or an alert on a
# series needs it before the first event (what is "other" or "unknown" appears when seen)
DOMAINS: dict[str, frozenset[str]] = {
    "verdict": VERDICTS, "route": ROUTES, "engine": ENGINES, "outcome": DECIDER | {"none"},
}  # fmt: skip
LATE_OUTCOMES = frozenset({"narrowed", "failed"})  # late_narrowed's own outcome label
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "settings_valid": (
        "1 when the settings file hook metrics read loads; 0 when it does not (a node running it fails "
        "every container that asks for a device; a DaemonSet's ConfigMap is applied to no node).",
        (),
    ),
    "build_info": ("The version of oci-device-hook that wrote these metrics (value 1).", ("version",)),
    "registered": (
        "1 while the engine runs the hook for this runtime handler (registered, and the engine started "
        "after the registration); 0 on drift: unregistered, or registered but not restarted.",
        ("engine", "handler"),
    ),
}
HISTOGRAM = "decision_seconds"
HISTOGRAM_HELP = (
    "Seconds from the hook's start (its first import, after the interpreter's own start-up) to its "
    "log line: deciding, and applying where it applied."
)


@record
class Tally:
    """Counts so far: ``counters[(name, labels)]``; ``buckets[route]`` the per-bucket (not
    cumulative) counts with the +Inf bucket last, ``sums[route]`` the seconds observed."""

    counters: Mapping[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)
    buckets: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    sums: Mapping[str, float] = field(default_factory=dict)


@record
class Gauges:
    """What the node says now, beside the counts: whether the settings file loads (None: not
    known, not written) and, per (engine, handler), whether the engine runs the hook."""

    settings_valid: bool | None = None
    registered: Mapping[tuple[str, str], bool] = field(default_factory=dict)


def _one_of(value: Any, known: frozenset[str]) -> str:
    if value is None or value == "":
        return "unknown"
    return value if isinstance(value, str) and value in known else "other"


def route_of(rec: Mapping[str, Any]) -> str:
    """The record's route; older records carry none: precreate ones say so by ``stage``."""
    route = rec.get("route")
    if route is None:
        return "precreate" if rec.get("stage") == "precreate" else "live"
    return _one_of(route, ROUTES)


def decider_of(rec: Mapping[str, Any]) -> str:
    """The decider's part; older records only warned when it could not serve."""
    outcome = rec.get("decider")
    if outcome is None:
        warned = any(isinstance(w, str) and w.startswith("decider: ") for w in rec.get("warnings") or ())
        return "fallback" if warned else "none"
    return _one_of(outcome, DECIDER)


def _seconds(rec: Mapping[str, Any]) -> float | None:
    ms = rec.get("duration_ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
        return None
    return ms / 1000


def _is_record(rec: Any) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("verdict"), str)


def tally(records: Iterable[Mapping[str, Any] | None], start: Tally | None = None) -> Tally:
    """``start`` plus every record (``None``: a line that was not one)."""
    counters: dict[tuple[str, tuple[str, ...]], float] = dict(start.counters) if start else {}
    buckets: dict[str, list[float]] = {k: list(v) for k, v in (start.buckets if start else {}).items()}
    sums: dict[str, float] = dict(start.sums) if start else {}

    def add(name: str, *labels: str) -> None:
        key = (name, labels)
        counters[key] = counters.get(key, 0) + 1

    for rec in records:
        if rec is None or not _is_record(rec):
            add("log_skipped_lines")
            continue
        verdict = _one_of(rec.get("verdict"), VERDICTS)
        route = route_of(rec)
        engine = _one_of(rec.get("engine"), ENGINES)
        add("decisions", verdict, route, engine)
        denied = rec.get("denied")
        if verdict == "apply" and isinstance(denied, list) and denied:
            add("narrowed", route, engine)
        elif verdict == "deny":
            add("refused", route, engine)
        elif verdict == "error":
            add("errors", route, engine)
        add("decider", decider_of(rec), route)
        if rec.get("late") is True and (verdict == "error" or "cgroup_version" in rec):
            add("late_narrowed", "failed" if verdict == "error" else "narrowed")
        seconds = _seconds(rec)
        if seconds is not None:
            counts = buckets.setdefault(route, [0.0] * (len(BUCKETS) + 1))
            counts[next((i for i, le in enumerate(BUCKETS) if seconds <= le), len(BUCKETS))] += 1
            sums[route] = sums.get(route, 0.0) + seconds
    return Tally(counters=counters, buckets={k: tuple(v) for k, v in buckets.items()}, sums=sums)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _zeros(t: Tally) -> dict[tuple[str, tuple[str, ...]], float]:
    """The counts with every series of the closed label sets present (0 where none was counted)."""
    import itertools

    counters = dict(t.counters)
    for name, (_text, labels) in COUNTERS.items():
        domains = [LATE_OUTCOMES if name == "late_narrowed" else DOMAINS[label] for label in labels]
        for values in itertools.product(*(sorted(d) for d in domains)):
            counters.setdefault((name, values), 0.0)
    return counters


def _gauges(g: Gauges) -> Iterable[Any]:
    from prometheus_client.core import GaugeMetricFamily

    from hook.core.version import VERSION

    for name, (text, labels) in GAUGES.items():
        family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=list(labels))
        if name == "settings_valid" and g.settings_valid is not None:
            family.add_metric([], 1 if g.settings_valid else 0)
        elif name == "build_info":
            family.add_metric([VERSION], 1)
        elif name == "registered":
            for (engine, handler), ok in sorted(g.registered.items()):
                family.add_metric([engine, handler], 1 if ok else 0)
        if family.samples:
            yield family


def render(t: Tally, gauges: Gauges | None = None) -> str:
    """The Prometheus text format (``prometheus_client``'s writer: names, escaping, order)."""
    from prometheus_client.core import CollectorRegistry, CounterMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import generate_latest

    counters = _zeros(t)
    buckets = {route: (0.0,) * (len(BUCKETS) + 1) for route in ROUTES} | dict(t.buckets)

    class _Collector:
        def collect(self) -> Iterable[Any]:
            for name, (text, labels) in COUNTERS.items():
                family = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=list(labels))
                for (n, values), count in sorted(counters.items()):
                    if n == name:
                        family.add_metric(list(values), count)
                yield family
            hist = HistogramMetricFamily(f"{PREFIX}_{HISTOGRAM}", HISTOGRAM_HELP, labels=["route"])
            for route, counts in sorted(buckets.items()):
                cumulative, running = [], 0.0
                for bound, count in zip((*BUCKETS, math.inf), counts, strict=True):
                    running += count
                    cumulative.append((_le(bound), running))
                hist.add_metric([route], cumulative, sum_value=t.sums.get(route, 0.0))
            yield hist
            yield from _gauges(gauges or Gauges())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return generate_latest(registry).decode()


def parse(text: str) -> Tally:
    """Counts back from ``render``'s text (the previous textfile); raises ``ValueError`` when the
    text is not one this module wrote (an unknown family, a bucket layout of other bounds)."""
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[tuple[str, tuple[str, ...]], float] = {}
    buckets: dict[str, list[float]] = {}
    sums: dict[str, float] = {}
    bounds = [_le(b) for b in (*BUCKETS, math.inf)]
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix(PREFIX + "_")
        if name in COUNTERS:
            labels = COUNTERS[name][1]
            for s in family.samples:
                if s.name.endswith("_total"):
                    counters[(name, tuple(s.labels[k] for k in labels))] = s.value
        elif name == HISTOGRAM:
            cumulative: dict[str, dict[str, float]] = {}
            for s in family.samples:
                route = s.labels["route"]
                if s.name.endswith("_bucket"):
                    cumulative.setdefault(route, {})[s.labels["le"]] = s.value
                elif s.name.endswith("_sum"):
                    sums[route] = s.value
            for route, by_le in cumulative.items():
                if sorted(by_le) != sorted(bounds):
                    raise ValueError(f"{family.name}: buckets {sorted(by_le)} are not this version's")
                previous, counts = 0.0, []
                for le in bounds:
                    counts.append(by_le[le] - previous)
                    previous = by_le[le]
                buckets[route] = counts
        elif name not in GAUGES:  # the gauges say what is now: written afresh each time, never read back
            raise ValueError(f"{family.name}: not a metric hook metrics writes")
    return Tally(counters=counters, buckets={k: tuple(v) for k, v in buckets.items()}, sums=sums)
