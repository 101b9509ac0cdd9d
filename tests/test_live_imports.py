"""Which modules the seed 000 slice pod's live path loads, pinned: a real runc container, real apply.

The hook runs as ``python3 -ISB`` on every container start, so every module on this path is paid
for by every GPU container. Here the slice pod (privileged, all 8 GPUs of the fake driver root,
narrowed to one) starts under runc with ``bench/hookproc.py`` as its prestart hook: it runs
``hook.entry.main`` exactly as the launcher does, with the launcher's flags, and records
``sys.modules``. Everything runs inside ``unshare -m`` with a tmpfs over /run (the hook's caches
are the test's own); the second container is measured (the first writes the caches, as the
first container on a node does).

Issue 35 extends the pin to every per-start route (prestart, createRuntime, hooks.d precreate and
the runtime wrapper, run through ``tests/routeproc.py``) and to the decider-served path, for a plain
container, one CDI GPU and the slice pod, on cgroup v1 and v2: the allowed modules are written below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from bench import bundles
from tests.hosttree import make_host_tree

REPO = Path(__file__).resolve().parents[1]
RUNC = shutil.which("runc") or "/usr/sbin/runc"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path(RUNC).exists() or not bundles.BUSYBOX.exists(),
    reason="needs root, runc and a static busybox",
)

# Our modules on this path: adding one is a decision, not an accident.
HOOK_MODULES = {
    "hook", "hook.entry", "hook.routes.fastpath", "hook.routes.live", "hook.core.errors",
    # the layer packages (docstring-only __init__ files)
    "hook.core", "hook.sources", "hook.sources.kubelet", "hook.adapters", "hook.routes",
    "hook.core.kubelet", "hook.core.settings", "hook.sources.privatefile",
    "hook.core.record", "hook.core.rules",
    "hook.core.oci", "hook.core.plan", "hook.core.plainplan",
    "hook.sources.kubelet.checkpoint", "hook.sources.settingsfile", "hook.core.requests",
    "hook.core.protowire",  # the checkpoint's AllocResp read through the one protobuf codec
    # issue 30: requests split by concern (values, what the engine gave, own asks, the kubelet's word)
    "hook.core.reqtypes", "hook.core.accel", "hook.core.asks", "hook.core.kubeasks",
    "hook.core.decide", "hook.routes.gather", "hook.core.report",
    "hook.routes.options", "hook.routes.resolver", "hook.routes.hostscan", "hook.sources.inputfile",
    "hook.sources.kubelet.view",
    "hook.adapters.log", "hook.routes.logrecord", "hook.core.hostdev", "hook.core.kpath",
    "hook.sources.kubelet.podid", "hook.adapters.marker", "hook.core.version",
    "hook.sources.nvidia",
    "hook.sources.nvidia.model", "hook.sources.nvidia.ids", "hook.sources.nvidia.migminors",
    "hook.sources.nvidia.nodes",
    "hook.sources.nvidia.procfs", "hook.sources.nvidia.snapshot", "hook.sources.nvidia.inventory",
    "hook.sources.nvidia.dri",
    # issue 28: every NVIDIA device class narrowed (the classes, the scope, the host's class nodes)
    "hook.core.devclasses", "hook.core.scope", "hook.sources.nvidia.classes",
    "hook.adapters.apply", "hook.adapters.apply.transaction", "hook.adapters.apply.devnodes",
    "hook.adapters.apply.devpath", "hook.adapters.apply.libcalls",
    "hook.adapters.apply.locate", "hook.adapters.apply.cgroup_v1", "hook.sources.cachefile",
    "hook.core.escape",
    # issue 23: the (absent) decider is asked first; views kept only in it
    "hook.routes.client", "hook.sources.warm",
    # issue 27: the offer (wire + client) and the one decide-then-act path, decided here or served
    "hook.routes.offer", "hook.routes.wire", "hook.routes.act", "hook.routes.decision",
    # issue 36: the node key, which every cache record and the decider's answers prove (os only)
    "hook.sources.nodekey",
}  # fmt: skip
# Never on this path: heavy, or only for other paths (the first container's cache writes excepted).
FORBIDDEN = {
    "yaml", "click", "pynvml", "dataclasses", "inspect", "ast", "dis", "tempfile", "shutil", "random",
    "hook.sources.cdi", "hook.cli", "hook.adapters.apply.cgroup_v2", "hook.adapters.apply.bpf",
    "hook.adapters.apply.bpf_sys", "hook.routes.serve", "prometheus_client", "hook.tools",
    "typing", "contextlib", "importlib", "hook.sources.nvidia.nvml",
}  # fmt: skip

def _slice_pod_runs(
    tmp: Path,
    count: int,
    cgroup2: bool = False,
    runner: Path = REPO / "bench" / "hookproc.py",
    served: bool = False,
) -> list[dict[str, object]]:
    root = tmp / "driver"
    make_host_tree(root, "8x-mig", mknod=True)
    lib = tmp / "lib"
    lib.mkdir()
    (lib / "hook").symlink_to(REPO / "hook")
    (lib / "yaml").symlink_to(Path(yaml.__file__).resolve().parent)
    settings = tmp / "settings.yaml"
    settings.write_text(f"log_file: {tmp / 'hook.log'}\ncache_dir: {tmp / 'cache'}\n")
    out = tmp / "modules.jsonl"
    hook = [sys.executable, "-ISB", str(runner), str(lib), str(out), "--",
            "--config", str(settings), "--driver-root", str(root)]  # fmt: skip
    rootfs = bundles.build_rootfs(tmp / "rootfs")
    state_root = tmp / "runc"
    cids, script = [], ["mount -t tmpfs -o mode=0755 tmpfs /run", "mkdir -m 0700 /run/oci-device-hook"]
    if cgroup2:  # runc (and the hook) then see a unified host and use eBPF, in this namespace only
        script.append("mount -t cgroup2 none /sys/fs/cgroup")
    if served:  # the warm decider, with the hook's options, its key dir a private tmpfs
        script += [
            "mkdir -p /var/lib/oci-device-hook",
            "mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook",
            f"{sys.executable} -I -m hook serve --config {settings} --driver-root {root}"
            f" 2>{tmp}/serve.err & d=$!",
            "i=0; while [ ! -S /run/oci-device-hook/decider.sock ] && [ $i -lt 400 ]; do",
            "sleep 0.05; i=$((i+1)); done",
        ]
    for n in range(count):  # one namespace for all: later containers find the first one's caches
        cid = f"odh-imports-{uuid.uuid4().hex[:10]}"
        config = bundles.slice_config(rootfs, f"/odh-live/{cid}")
        entry = {**bundles.hook_entry(Path(hook[0])), "args": hook}
        if served:  # a loaded machine's first decision must still be served, not fall back
            entry["env"] = [*entry.get("env", []), "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS=5000"]
        config["hooks"] = {"prestart": [entry]}
        bundle = bundles.write_bundle(tmp / f"bundle{n}", config)
        cids.append(cid)
        script.append(f"{RUNC} --root {state_root} run --bundle {bundle} {cid} </dev/null")
    if served:
        script.append("kill $d; wait $d || true")
    try:
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", "\n".join(script)],
                              capture_output=True, timeout=120)  # fmt: skip
    finally:
        for cid in cids:
            subprocess.run([RUNC, "--root", str(state_root), "delete", "-f", cid], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(line) for line in out.read_text().splitlines()]


V2_MODULES = {"hook.adapters.apply.cgroup_v2", "hook.adapters.apply.bpf", "hook.adapters.apply.bpf_sys"}


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_the_slice_pods_live_path_loads_what_it_uses(tmp_path: Path, cgroup2: bool) -> None:
    runs = _slice_pod_runs(tmp_path, 2, cgroup2)
    assert [r["rc"] for r in runs] == [0, 0]
    loaded = set(runs[-1]["loaded"])  # type: ignore[call-overload]
    ours = {m for m in loaded if m == "hook" or m.startswith("hook.")}
    assert ours == (HOOK_MODULES | V2_MODULES if cgroup2 else HOOK_MODULES)
    # ctypes: the node helper's setns and openat2 go through _ctypes alone; v2's bpf(2) loads it
    forbidden = (FORBIDDEN - V2_MODULES if cgroup2 else FORBIDDEN | {"ctypes"}) | {"platform"}
    assert not {m for m in loaded if m in forbidden or any(m.startswith(f + ".") for f in forbidden)}


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_the_slice_pods_live_path_reads_and_parses_config_json_once(tmp_path: Path, cgroup2: bool) -> None:
    """Issue 30 item 4: the state and config.json are loaded once (``hook.routes.fastpath.look_at``)
    and handed down as values: one open, one JSON decode, one ``parse_config_object``, for the
    first container (no fast-path record yet) and the next (the fast path reads it)."""
    runs = _slice_pod_runs(tmp_path, 2, cgroup2, runner=REPO / "tests" / "parsecount.py")
    assert runs == [{"rc": 0, "opens": 1, "decodes": 1, "parses": 1}] * 2


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_a_served_slice_pod_loads_no_decision_module(tmp_path: Path, cgroup2: bool) -> None:
    """Issue 27: with the warm decider answering, the per-start hook loads the fast path, the
    client, the decision's values and the apply adapters: no settings file, gather, decide, report,
    oci parser, yaml or CDI engine (the decider has them loaded)."""
    runs = _slice_pod_runs(tmp_path, 2, cgroup2, served=True)
    assert [r["rc"] for r in runs] == [0, 0]
    records = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert [r.get("decider") for r in records] == ["answered", "answered"]
    ours = {m for m in runs[-1]["loaded"] if m == "hook" or m.startswith("hook.")}  # type: ignore[attr-defined]
    decision_modules = {
        "hook.sources.settingsfile", "hook.routes.gather", "hook.routes.live", "hook.core.decide",
        "hook.core.report", "hook.core.oci", "hook.core.requests", "hook.routes.resolver",
        "hook.sources.kubelet.checkpoint", "hook.sources.nvidia.inventory", "hook.adapters.marker",
        "hook.core.protowire",
    }  # fmt: skip
    assert not ours & decision_modules, ours & decision_modules
    assert {"hook.routes.client", "hook.routes.act", "hook.adapters.apply.transaction"} <= ours
    assert not {m for m in runs[-1]["loaded"] if m in ("yaml", "hashlib", "socket", "typing")}  # type: ignore[attr-defined]


# --- issue 35 item 1: every route's per-start process, the decider warm -----------------------------
# What each route loads beyond the interpreter's own start (python3 -ISB), the decider answering.
# Adding a module here is a decision about every container's start, not an accident.

ONE_GPU = "nvidia.com/gpu=GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"  # examples/node/cdi
ROUTES = ("prestart", "createRuntime", "precreate", "wrapper")
LIVE_ROUTES = ("prestart", "createRuntime")


def _one_gpu(rootfs: Path, cgroups_path: str) -> dict[str, object]:
    config = bundles.nodev_config(rootfs, cgroups_path)
    config["annotations"] = {"cdi.k8s.io/odh": ONE_GPU}
    return config


WORKLOADS = {"plain": bundles.nodev_config, "one-cdi-gpu": _one_gpu, "slice-pod": bundles.slice_config}

# The fast path (a container that asks for nothing): its record and the fast-path cache's MAC.
FAST_STDLIB = {"_json", "_blake2", "_operator"}  # no __future__: the fast path's modules do without it
FAST_HOOK = {
    "hook", "hook.entry", "hook.core", "hook.core.version", "hook.routes", "hook.routes.fastpath",
    "hook.sources", "hook.sources.privatefile", "hook.sources.nodekey",
}  # fmt: skip
# A served decision: the socket, the MAC (_blake2, _operator's compare_digest), the JSON scanner,
# gc (built in: the collector is off once the decider answered).
SERVED_STDLIB = FAST_STDLIB | {"_socket", "gc", "__future__"}
SERVED_HOOK = FAST_HOOK | {
    "hook.routes.offer", "hook.routes.client", "hook.routes.wire", "hook.routes.decision", "hook.routes.act",
    "hook.core.record", "hook.adapters", "hook.adapters.log", "hook.routes.logrecord",
    "hook.sources.kubelet", "hook.sources.kubelet.podid", "hook.core.kubelet",
}  # fmt: skip
# The runtime wrapper reads the command line as runc and crun do; errno where it writes a decided
# config (escape only where it refuses, or with a decision's log).
WRAPPER_STDLIB = {"errno", "__future__"}
WRAPPER_HOOK = {
    "hook.routes.wrapper", "hook.core.record", "hook.routes.runtimeargs",
    "hook.routes.runtimeargs.crun", "hook.routes.runtimeargs.readings", "hook.routes.runtimeargs.runc",
    "hook.routes.runtimeargs.values",
}  # fmt: skip
# Applying a plan with nodes (live routes): the plain plan, the cgroup writer, the node helper
# (setns and openat2, which this Python's os lacks, through _ctypes alone: the ctypes package's
# Python layer, types, struct and ctypes._endian, cost about 2 ms of every such start).
APPLY_STDLIB = {"_ctypes", "_struct", "errno"}
APPLY_HOOK = {
    "hook.core.plainplan", "hook.core.errors", "hook.core.kpath", "hook.adapters.apply",
    "hook.adapters.apply.transaction", "hook.adapters.apply.locate", "hook.adapters.apply.devnodes",
    "hook.adapters.apply.devpath", "hook.adapters.apply.libcalls",
}  # fmt: skip
V1_HOOK = {"hook.adapters.apply.cgroup_v1"}
# cgroup v2: the eBPF program is built from the plan's normal list (normalized where it was
# decided: no enum here) and loaded with RLIMIT_MEMLOCK raised; bpf(2)'s attribute structs are
# ctypes Structures (the ctypes package: v2 alone).
V2_STDLIB = {"resource", "ctypes", "ctypes._endian", "struct", "types"}
V2_HOOK = {"hook.adapters.apply.cgroup_v1", "hook.adapters.apply.cgroup_v2", "hook.adapters.apply.bpf",
           "hook.adapters.apply.bpf_sys"}  # fmt: skip
# The crun guard's gate is read where a rule crun's systemd driver could widen (one CDI GPU, no
# runtime named by hooks.d precreate); the guard itself only where the runtime may be crun.
GATE_HOOK = {"hook.routes.crungate"}


def expected_modules(route: str, workload: str, cgroup2: bool) -> tuple[set[str], set[str]]:
    """(stdlib allowed, hook modules exactly) for one served start."""
    stdlib, hook = set(FAST_STDLIB), set(FAST_HOOK)
    if route == "wrapper":
        stdlib, hook = stdlib | WRAPPER_STDLIB, hook | WRAPPER_HOOK
    if workload == "plain":
        return stdlib, hook
    stdlib, hook = stdlib | SERVED_STDLIB, hook | SERVED_HOOK
    if route in LIVE_ROUTES:
        stdlib, hook = stdlib | APPLY_STDLIB, hook | APPLY_HOOK
        stdlib, hook = (stdlib | V2_STDLIB, hook | V2_HOOK) if cgroup2 else (stdlib, hook | V1_HOOK)
    elif workload == "one-cdi-gpu":
        hook |= GATE_HOOK
    return stdlib, hook


def _every_route_served(tmp: Path, cgroup2: bool) -> dict[tuple[str, str], dict[str, object]]:
    """Each route x workload started twice, one namespace, the decider warm: the second start's record."""
    root = tmp / "driver"
    make_host_tree(root, "8x-mig", mknod=True)
    lib = tmp / "lib"
    lib.mkdir()
    (lib / "hook").symlink_to(REPO / "hook")
    (lib / "yaml").symlink_to(Path(yaml.__file__).resolve().parent)
    settings = tmp / "settings.yaml"
    values = {"runtime": RUNC, "log_file": str(tmp / "hook.log"), "cache_dir": str(tmp / "cache"),
              "driver_root": str(root), "cdi_spec_dirs": [str(REPO / "examples" / "node" / "cdi")]}
    settings.write_text(json.dumps(values) + "\n")
    out = tmp / "modules.jsonl"
    runner = [sys.executable, "-ISB", str(REPO / "tests" / "routeproc.py"), str(lib), str(out), "--"]
    rootfs = bundles.build_rootfs(tmp / "rootfs")
    state_root = tmp / "runc"
    env = "OCI_DEVICE_HOOK_DECIDER_TIMEOUT_MS=5000"  # a loaded machine's first decision must be served
    script = [
        "mount -t tmpfs -o mode=0755 tmpfs /run", "mount -t tmpfs -o mode=0755 tmpfs /var/log",
        "mkdir -m 0700 /run/oci-device-hook", "mkdir -p /var/lib/oci-device-hook",
        "mount -t tmpfs -o mode=0700 tmpfs /var/lib/oci-device-hook",
    ]  # fmt: skip
    if cgroup2:
        script.append("mount -t cgroup2 none /sys/fs/cgroup")
    script += [
        f"{sys.executable} -I -m hook serve --config {settings} 2>{tmp}/serve.err & d=$!",
        "i=0; while [ ! -S /run/oci-device-hook/decider.sock ] && [ $i -lt 400 ]; do",
        "sleep 0.05; i=$((i+1)); done",
    ]
    cids, order = [], []
    for workload, make in WORKLOADS.items():
        for route in ROUTES:
            for n in range(2):  # the first writes the caches, as the first container on a node does
                cid = f"odh-routes-{uuid.uuid4().hex[:10]}"
                config = make(rootfs, f"/odh-live/{cid}")
                order.append((route, workload))
                b = tmp / f"{workload}-{route}-{n}"
                if route in LIVE_ROUTES:
                    args = [*runner, route, "--config", str(settings)]
                    entry = {**bundles.hook_entry(Path(sys.executable)), "args": args}
                    entry["env"] = [*entry.get("env", []), env]
                    config["hooks"] = {route: [entry]}
                    bundles.write_bundle(b, config)
                    cids.append(cid)
                    script.append(f"{RUNC} --root {state_root} run --bundle {b} {cid} </dev/null >/dev/null")
                else:
                    bundles.write_bundle(b, config)
                    if route == "precreate":
                        line = f"precreate --config {settings} < {b}/config.json"
                    else:
                        line = f"runtime-wrapper --config {settings} -- {RUNC} create --bundle {b} {cid}"
                        line += " </dev/null"
                    script.append(f"{env} {' '.join(runner)} {line} > {b}.out")
    script.append("kill $d; wait $d || true")
    try:
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", "\n".join(script)],
                              capture_output=True, timeout=300)  # fmt: skip
    finally:
        for cid in cids:
            subprocess.run([RUNC, "--root", str(state_root), "delete", "-f", cid], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(order)
    log = [json.loads(line) for line in (tmp / "hook.log").read_text().splitlines()]
    assert log and {r.get("decider") for r in log} == {"answered"}, [r.get("decider") for r in log]
    return {key: rec for key, rec in zip(order, records, strict=True)}  # the second of each pair wins


@pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_every_route_served_loads_only_what_its_container_needs(tmp_path: Path, cgroup2: bool) -> None:
    """Issue 35 item 1: prestart, createRuntime, hooks.d precreate and the runtime wrapper, for a
    plain container, one CDI GPU and the slice pod, with the decider answering: each per-start
    process loads the interpreter's core plus the modules listed above, and no others (no yaml,
    json, re, pathlib or enum, no crun guard with runc)."""
    runs = _every_route_served(tmp_path, cgroup2)
    for (route, workload), rec in runs.items():
        assert rec["rc"] == ("exec" if route == "wrapper" else 0), (route, workload, rec["rc"])
        loaded = set(rec["loaded"])  # type: ignore[call-overload]
        stdlib, hook = expected_modules(route, workload, cgroup2)
        ours = {m for m in loaded if m == "hook" or m.startswith("hook.")}
        assert ours == hook, (route, workload, sorted(ours - hook), sorted(hook - ours))
        assert loaded - ours <= stdlib, (route, workload, sorted(loaded - ours - stdlib))
        # node changes from a thread, not a forked helper (a fork costs the start 2-3 ms)
        assert rec["forks"] == 0, (route, workload, rec["forks"])
        # an answered start runs its short rest without the cycle collector (0.6 ms); the fast path never asks
        assert rec["gc"] is (workload == "plain"), (route, workload, rec["gc"])
