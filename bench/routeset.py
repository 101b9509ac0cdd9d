"""The workloads of issue 27's speed rows, the decider's memory check, and their part of the page.

Rule: the workloads are the ones issue 35 names: one GPU by CDI annotation (create+start+wait+delete,
with NVIDIA's runtime beside the routes when ``--nvidia-runtime`` is given), the no-device container
and the seed-000 slice pod (``runc run``) on cgroup v1, the slice pod on v2, and the slice pod on the
8x7-MIG, 64 GPUs + 224 MIG and 254-GPU nodes (prestart and wrapper, each against the same route's
8-GPU row: the v1 slice pod). Each node is one settings file.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import bundles, hosts, nvidia
from bench.decider import Decider, running
from bench.routes import Kit, Node, Result, Target, Workload, measure, table_rows, targets

__all__ = ["SHAPES", "run_step", "page_section", "CDI_DIR", "ONE_GPU"]

CDI_DIR = bundles.REPO / "examples" / "node" / "cdi"
ONE_GPU = "nvidia.com/gpu=GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"
SHAPES = (("8x7-mig", "slice pod on 8 GPUs x 7 MIG"), ("64+224-mig", "slice pod on 64 GPUs + 224 MIG"),
          ("254-gpus", "slice pod on 254 GPUs"))
RSS_SHAPE = "64+224-mig"
RSS_DECISIONS = 1000


def node(b: Any, name: str, driver_root: Path) -> Node:
    """The settings file every hook of this node's workloads and its decider are given."""
    d = b.tmp / "nodes" / name
    d.mkdir(parents=True, exist_ok=True)
    log = d / "hook.log"
    settings = d / "settings.yaml"
    settings.write_text(
        f"runtime: {b.runc}\n"
        f"log_file: {log}\n"
        f"cache_dir: {d / 'cache'}\n"
        f"driver_root: {driver_root}\n"
        f"cdi_spec_dirs: [{json.dumps(str(CDI_DIR))}]\n"
    )
    return Node(name, settings, log)


def kit(b: Any) -> Kit:
    env: dict[str, str] = {}
    if b.nvidia:
        conf = nvidia.write_config(b.tmp / "nvidia" / "config.toml", [CDI_DIR], b.runc)
        env = {nvidia.CONFIG_ENV: str(conf)}
    return Kit(tmp=b.tmp, rootfs=b.rootfs, launcher=b.launcher, interp=b.interp, runc=b.runc,
               nvidia=b.nvidia, nvidia_env=env)


def one_gpu(rootfs: Path, cgroups_path: str) -> dict[str, Any]:
    config = bundles.nodev_config(rootfs, cgroups_path)
    config["annotations"] = {"cdi.k8s.io/bench": ONE_GPU}
    return config


def _record(b: Any, r: Result) -> None:
    b.results[r.workload.key] = r
    for route in r.workload.routes if r.workload.decided else ():
        got = r.served.get(f"{route}/warm", [])
        answered = sum(1 for v in got if v == "answered")
        b.checks.append((f"the decider answered every warm start: {r.workload.label}, {route}",
                         bool(got) and answered == len(got),
                         f"{answered} of {len(got)} ({', '.join(sorted(set(got)))}; from the hook's log "
                         "records, else the decider's request count)"))
        print(f"bench: {r.workload.label}: {route}: decider answered {answered} of {len(got)} warm starts; "
              f"floor {r.ms(f'{route}/floor'):.1f} ms, in-process {r.ms(f'{route}/in-process'):.1f}, "
              f"warm {r.ms(f'{route}/warm'):.1f}, stopped {r.ms(f'{route}/stopped'):.1f} "
              f"(bare {r.ms('bare'):.1f})", file=sys.stderr)


def run_step(b: Any, step: str) -> None:
    """``routes`` (v1: one CDI GPU, slice pod), ``routes-v2`` (slice pod), ``routes-scale``,
    ``decider-rss`` (its own decider for the big node, asked 1,000 times)."""
    k = kit(b)
    main = node(b, "main", b.driver_root)
    all3 = ("prestart", "wrapper", "precreate")
    if step == "routes":
        _record(b, measure(k, Workload("cdi1", "one GPU by CDI annotation (create+start+delete, cgroup v1)",
                                       one_gpu, main, "csd", all3, nvidia=True), b.rounds))
        _record(b, measure(k, Workload("slice-v1", "seed-000 slice pod (`runc run`, cgroup v1)",
                                       bundles.slice_config, main, "run", all3), b.rounds))
        _record(b, measure(k, Workload("nodev", "no-device container (`runc run`, cgroup v1)",
                                       bundles.nodev_config, main, "run", all3, decided=False), b.rounds))
    elif step == "routes-v2":
        _record(b, measure(k, Workload("slice-v2", "seed-000 slice pod (`runc run`, cgroup v2)",
                                       bundles.slice_config, main, "run", ("prestart", "wrapper")), b.rounds))
    elif step == "routes-scale":
        for shape, label in SHAPES:
            root, spec = b.host(shape)

            def make(rootfs: Path, cgroups_path: str, spec: Any = spec) -> dict[str, Any]:
                return hosts.slice_config(bundles.slice_config(rootfs, cgroups_path), spec)

            w = Workload(shape, f"{label} (`runc run`, cgroup v1)", make, node(b, shape, root), "run",
                         ("prestart", "wrapper"))

            _record(b, measure(k, w, max(5, b.rounds // 2)))
    elif step == "decider-rss":
        root, spec = b.host(RSS_SHAPE)

        def big(rootfs: Path, cgroups_path: str) -> dict[str, Any]:
            return hosts.slice_config(bundles.slice_config(rootfs, cgroups_path), spec)

        w = Workload(RSS_SHAPE, "decider RSS", big, node(b, RSS_SHAPE, root), "run", ())
        with running(b.launcher, w.node.settings, w.node.log) as d:
            b.checks.append(rss_check(b, w, d))
    else:
        raise ValueError(step)


def _asker(settings: Path, bundle: Path, cid: str) -> Callable[[], str] | str:
    """One live request for the container in ``bundle`` as the prestart hook (``--config
    settings``) sends it, through the hook's own client (``hook.routes.client``), or why there
    is none. No pid: the decider decides; nothing is applied."""
    try:
        from hook.routes import client, wire
    except ImportError as exc:
        return f"no decider client in this tree ({exc})"
    path = str(settings)
    fingerprint = wire.fingerprint({"--config": [path]}, path)
    config = (bundle / "config.json").read_bytes()
    parts = [(wire.STATE, bundles.state_for(bundle, cid)), (wire.CONFIG, config)]

    def ask() -> str:
        got, body = client.ask(b"live", fingerprint, parts, 5.0)
        return "answered" if got == "answered" else f"{got or 'no decider'}: {body!s}"

    return ask


def rss_check(b: Any, w: Workload, d: Decider) -> tuple[str, bool, str]:
    """1,000 live decisions of ``w``'s container by the decider (no pid: decided, not applied),
    asked one after another by the hook's client in this process, so the loop costs the
    decider's work only; its VmRSS after the 100th and the last."""
    label = (f"decider RSS after {RSS_DECISIONS:,} decisions on 64 GPUs + 224 MIG: <= 60 MiB, "
             "not growing from the 100th (<= 1 MiB)")
    bundle = bundles.write_bundle(b.tmp / "bundles" / "decider-rss", w.make(b.rootfs, "/odh-bench/rss"))
    ask = _asker(w.node.settings, bundle, "odh-bench-rss")
    if isinstance(ask, str):
        return (label, False, ask)
    at: dict[int, int] = {}
    took: list[float] = []
    deadline = time.monotonic() + b.rss_seconds
    for i in range(1, RSS_DECISIONS + 1):
        start = time.perf_counter()
        got = ask()
        took.append(time.perf_counter() - start)
        if got != "answered":
            return (label, False, f"request {i} was not answered: {got}")
        if i in (100, RSS_DECISIONS):
            at[i] = d.rss_kib()
        if time.monotonic() > deadline and i < RSS_DECISIONS:
            at[i] = d.rss_kib()
            first = f"{at[100] / 1024:.1f} MiB after 100, " if 100 in at else ""
            return (label, False, f"stopped at the time cap (`--rss-seconds {b.rss_seconds}`) after {i} "
                                  f"decisions (median {statistics.median(took) * 1000:.0f} ms each): VmRSS "
                                  f"{first}{at[i] / 1024:.1f} MiB after {i}")
    mib, first_mib = at[RSS_DECISIONS] / 1024, at[100] / 1024
    ok = mib <= 60 and mib - first_mib <= 1.0
    each = statistics.median(took) * 1000
    print(f"bench: decider RSS {first_mib:.1f} -> {mib:.1f} MiB", file=sys.stderr)
    return (label, ok, f"VmRSS {first_mib:.1f} MiB after 100, {mib:.1f} MiB after {RSS_DECISIONS:,} "
                       f"(live requests, every one answered; median {each:.0f} ms a decision)")


def _md(rows: list[tuple[str, ...]]) -> list[str]:
    head = ["| route | decider | median | x bare runc | x the route's floor | above the floor | note |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    return head + ["| " + " | ".join(r) + " |" for r in rows]


def route_targets(b: Any) -> list[Target]:
    return targets(b.results, tuple(s for s, _ in SHAPES))


def print_targets(b: Any) -> None:
    """Every route target and the decider's RSS check, PASS or FAIL, one line each (stderr)."""
    for t in route_targets(b):
        print(f"bench: {'PASS' if t.passed else 'FAIL'}: {t.label}: {t.measured:.2f}x (<= {t.limit:g}x; "
              f"{t.detail})", file=sys.stderr)
    for label, ok, detail in b.checks:
        if label.startswith("decider RSS"):
            print(f"bench: {'PASS' if ok else 'FAIL'}: {label}: {detail}", file=sys.stderr)


def page_section(b: Any) -> str:
    """The routes part of docs/performance.md (empty when no route step ran)."""
    if not b.results:
        return ""
    name = f"NVIDIA's runtime {nvidia.version(b.nvidia).split()[-1]} (CDI mode)" if b.nvidia else "NVIDIA"
    out = ["## Routes (issue 27): every route, its floor, the decider warm, stopped and absent", ""]
    for r in b.results.values():
        n = len(next(iter(r.times.values())))
        out += [f"### {r.workload.label} ({n} rounds)", "", *_md(table_rows(r, name)), ""]
    out += ["### Targets (issue 35; decider warm unless said)", "",
            "| target | measured | limit | result | detail |", "| --- | ---: | ---: | --- | --- |"]
    for t in route_targets(b):
        out.append(f"| {t.label} | {t.measured:.2f}x | ≤ {t.limit:g}x | "
                   f"{'PASS' if t.passed else '**FAIL**'} | {t.detail} |")
    if not b.nvidia:
        out += ["", "- NVIDIA's runtime was not given (`--nvidia-runtime PATH`): no row for it, no target "
                "against it."]
    return "\n".join(out) + "\n"
