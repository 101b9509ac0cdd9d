"""Issue 34 item 8: the NRI route against every per-start process, through a real containerd's CRI.

Rule: what a kubelet waits for is timed: CRI ``CreateContainer`` + ``StartContainer`` of one
container in an already running pod (``tests/cri.py``), stopped and removed untimed after. Debian
unstable's containerd 2.x (``tests/live/nribed.py``: private namespace, scratch root, state and
sockets, NRI on, the host's cgroup v1) runs twice, from the same package and config but for the
handlers: one with nothing registered on its NRI socket, whose handlers are runc (a), the runtime
wrapper with the warm decider (c) and NVIDIA's runtime in CDI mode (d, with ``--nvidia-runtime``);
one with ``hook nri`` registered (b) and runc. Each variant has its own pod (the handler is the
pod's) and every variant runs once a round, round-robin (``bench.timing.round_robin``), so every
ratio is between samples taken under the same drift. Workloads: the seed-000 slice pod (privileged,
the plugin's ``NVIDIA_VISIBLE_DEVICES``, the kubelet's allocation of that GPU) and a one-GPU pod
(unprivileged, the GPU as the CRI's CDI device, containerd injecting it from the example spec).

Targets: (b) within 1.05x of (a) and faster than (c) and (d), each the median of per-round ratios;
the daemon's median ``CreateContainer`` decision (its records' ``duration_ms``, stage ``create``) at
most 3 ms on the 64 GPUs + 224 MIG node (a third containerd, that node's ``/dev``); the daemon's
VmRSS not growing by more than 1 MiB from the 100th container to the last of ``--nri-containers``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import bundles, hosts, nvidia
from bench.timing import round_robin

__all__ = ["run_step", "page_section"]

SUITE = "sid"  # containerd 2.x
SLICE_UUID = "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"  # examples/slice-privileged's card (minor 1)
ONE_GPU = f"nvidia.com/gpu={SLICE_UUID}"
BIG = "64+224-mig"
LABELS = {
    "a": "(a) nothing registered",
    "b": "(b) the NRI route (`hook nri`)",
    "c": "(c) the runtime wrapper, decider warm",
    "d": "(d) NVIDIA's runtime (CDI mode)",
}


class Side:
    """One containerd of the bench, the daemon or decider beside it, the kubelet's checkpoint."""

    def __init__(
        self,
        b: Any,
        name: str,
        driver: Path | None = None,
        handlers: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        from tests.live.nribed import Bed

        self.tmp = b.tmp / "nri" / name
        self.tmp.mkdir(parents=True)
        self.bed = Bed(self.tmp, SUITE, False, driver=driver, handlers=handlers, env=env)
        (self.bed.cdi / "nvidia.json").write_text((bundles.EXAMPLES / "node/cdi/nvidia.json").read_text())
        self.ckpt = self.tmp / "kubelet_internal_checkpoint"
        self.entries: list[dict[str, object]] = []
        self.log = self.tmp / "hook.log"
        self.settings = self.tmp / "settings.yaml"
        self.settings.write_text(
            json.dumps(
                {
                    "runtime": b.runc,
                    "log_file": str(self.log),
                    "cache_dir": str(self.tmp / "cache"),
                    "driver_root": str(self.bed.driver),
                    "cdi_spec_dirs": [str(self.bed.cdi)],
                    "kubelet_checkpoint": str(self.ckpt),
                }
            )
        )
        self.allocate()
        self.bed.env["OCI_DEVICE_HOOK_CONFIG"] = str(self.settings)  # the wrapper's settings
        self.helpers: list[Any] = []

    def allocate(self, pod_uid: str = "", gpu: str = "") -> None:
        from tests.bundles import checkpoint, checkpoint_entry

        if pod_uid:
            self.entries.append(checkpoint_entry("nvidia.com/gpu", [gpu], pod_uid=pod_uid, container="cuda"))
        self.ckpt.write_bytes(checkpoint(self.entries))

    def start(self) -> None:
        self.bed.start()

    def nri(self, launcher: Path) -> None:
        self.daemon = self.bed.start_nri(self.settings, self.tmp / "nri.err", (str(launcher),))
        self.helpers.append(self.daemon)

    def decider(self, launcher: Path) -> None:
        import subprocess

        err = (self.tmp / "serve.err").open("wb")
        proc = subprocess.Popen(
            self.bed.in_ns([str(launcher), "serve", "--config", str(self.settings)]), stdout=err, stderr=err
        )
        self.helpers.append(proc)
        probe = self.bed.in_ns(["test", "-S", "/run/oci-device-hook/decider.sock"])
        for _ in range(200):
            if subprocess.run(probe).returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError("bench: hook serve did not start: " + (self.tmp / "serve.err").read_text()[-800:])

    def stop(self) -> None:
        for proc in self.helpers:
            proc.kill()
            proc.wait()
        self.bed.stop()

    def records(self, stage: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [r for r in map(json.loads, lines) if r.get("route") == "nri" and r.get("stage") == stage]

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.daemon.pid}/status").read_text()
        return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))


def _sampler(side: Side, workload: str, handler: str = "", gpu: str = SLICE_UUID) -> Callable[[], float]:
    """One create+start of ``workload``'s container in its own pod on ``side`` (handler ``handler``)."""
    privileged = workload == "slice"
    sid, pod = side.bed.pod(privileged=privileged, handler=handler)
    side.allocate(pod.uid, gpu)
    kw: dict[str, Any] = (
        {"privileged": True, "envs": [("NVIDIA_VISIBLE_DEVICES", gpu)]}
        if privileged
        else {"cdi_devices": [f"nvidia.com/gpu={gpu}"]}
    )
    client = side.bed.client
    assert client is not None

    def run() -> float:
        start = time.perf_counter()
        cid = side.bed.create(sid, pod, ["/bin/true"], **kw)
        client.start(cid)
        took = time.perf_counter() - start
        _discard(client, cid)
        return took

    return run


def _discard(client: Any, cid: str) -> None:
    """Stop (it runs /bin/true: usually exited already) and remove ``cid``, untimed."""
    from tests import cri

    for _ in range(100):
        with contextlib.suppress(Exception):
            if client.status(cid).state != cri.EXITED:
                client.stop(cid)
            client.remove(cid)
            return
        time.sleep(0.05)
    raise RuntimeError(f"bench: nri: container {cid} could not be removed")


def _median_ratio(times: dict[str, tuple[float, ...]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def run_step(b: Any, containers: int) -> None:
    """The rows, the targets (as checks) and the page section; the containerds killed after."""
    try:
        import grpc  # noqa: F401  (tests/cri.py's transport)
    except ImportError:
        b.checks.append(
            (
                "NRI route rows (issue 34 item 8)",
                False,
                "need grpcio in the bench's Python: "
                "BENCH_PYTHON=.venv/bin/python bench/run (the test extra installs it)",
            )
        )
        return
    nv_env = {}
    handlers = {"wrapper": str(b.launcher.parent / "runtime")}
    if b.nvidia:
        conf = nvidia.write_config(b.tmp / "nri" / "nvidia.toml", [b.tmp / "nri" / "plain" / "cdi"], b.runc)
        nv_env, handlers["nvidia"] = {nvidia.CONFIG_ENV: str(conf)}, b.nvidia
    (b.tmp / "nri").mkdir(exist_ok=True)
    bundles_runtime = b.launcher.parent / "runtime"
    if not bundles_runtime.exists():
        import shutil

        shutil.copy2(bundles.REPO / "packaging" / "runtime", bundles_runtime)
    plain = Side(b, "plain", handlers=handlers, env=nv_env)
    route = Side(b, "route")
    sides = [plain, route]
    lines: list[str] = []
    try:
        plain.start()
        plain.decider(b.launcher)
        route.start()
        route.nri(b.launcher)
        for workload, label in (
            ("slice", "seed-000 slice pod (privileged)"),
            ("gpu1", "one GPU by CDI (CRI field)"),
        ):
            samples = {
                "a": _sampler(plain, workload),
                "b": _sampler(route, workload),
                "c": _sampler(plain, workload, "wrapper"),
            }
            if b.nvidia:
                samples["d"] = _sampler(plain, workload, "nvidia")
            times = round_robin(samples, b.rounds)
            lines += _table(label, times)
            _targets(b, label, times)
        _decision(b, route, "seed-000 node (8 GPUs, 2 MIG)")
        _rss(b, route, containers)
        big = Side(b, "big", driver=_big_driver(b))
        sides.append(big)
        big.start()
        big.nri(b.launcher)
        gpu = hosts.spec(BIG).gpus[1].uuid
        sample = _sampler(big, "slice", gpu=gpu)
        for _ in range(max(10, b.rounds)):
            sample()
        _decision(b, big, "64 GPUs + 224 MIG", limit=3.0)
    finally:
        for side in sides:
            side.stop()
    how = [
        "- Timed: CRI CreateContainer + StartContainer of one container (`/bin/true`) in a running pod, "
        "as a kubelet waits for it; stopped and removed untimed (`bench/nri.py`).",
        "- Two containerds from the same package and config, each private (`tests/live/nribed.py`, "
        "host cgroup v1): (a), (c) and (d) on one with nothing on its NRI socket (the handler is the "
        "pod's), (b) on one with `hook nri` registered. Every variant once a round, round-robin; x (a) "
        "is the median of per-round ratios.",
        "- The CreateContainer decision is the daemon's own (`duration_ms` of its `stage: create` "
        "records), on this node and on a third containerd whose `/dev` is the 64 GPUs + 224 MIG node's.",
    ]
    b.nri_section = "\n".join(
        [
            f"## The NRI route (issue 34): CRI create+start through containerd {plain.bed.version}",
            "",
            *lines,
            *how,
            "",
        ]
    )


def _big_driver(b: Any) -> Path:
    root = b.tmp / "nri" / "big-driver"
    hosts.build(root, BIG)
    return root


def _table(label: str, times: dict[str, tuple[float, ...]]) -> list[str]:
    rows = [
        f"### {label} ({len(times['a'])} rounds)",
        "",
        "| variant | median | x (a) |",
        "| --- | ---: | ---: |",
    ]
    for key, ts in times.items():
        ms = statistics.median(ts) * 1000
        rows.append(f"| {LABELS[key]} | {ms:.1f} ms | {_median_ratio(times, key, 'a'):.2f}x |")
        print(f"bench: nri: {label}: {LABELS[key]}: {ms:.1f} ms", file=sys.stderr)
    return [*rows, ""]


def _targets(b: Any, label: str, times: dict[str, tuple[float, ...]]) -> None:
    r = _median_ratio(times, "b", "a")
    b.checks.append(
        (
            f"NRI route, {label}: (b) within 1.05x of (a) nothing registered",
            r <= 1.05,
            f"{r:.3f}x (median of per-round ratios)",
        )
    )
    for other in ("c", "d"):
        if other in times:
            r = _median_ratio(times, "b", other)
            b.checks.append(
                (
                    f"NRI route, {label}: (b) faster than {LABELS[other]}",
                    r < 1.0,
                    f"{r:.3f}x (median of per-round ratios)",
                )
            )


def _decision(b: Any, side: Side, node: str, limit: float | None = None) -> None:
    took = [float(r["duration_ms"]) for r in side.records("create") if "duration_ms" in r]
    if not took:
        b.checks.append((f"NRI CreateContainer decision on the {node}", False, "no create record"))
        return
    median = statistics.median(took)
    print(
        f"bench: nri: CreateContainer decision, {node}: median {median:.2f} ms of {len(took)}",
        file=sys.stderr,
    )
    if limit is None:
        b.notes.append(
            f"NRI route: median CreateContainer decision on the {node}: {median:.2f} ms ({len(took)})"
        )
        return
    b.checks.append(
        (
            f"NRI median CreateContainer decision on the {node}: <= {limit:g} ms",
            median <= limit,
            f"{median:.2f} ms over {len(took)} decisions (the daemon's records' duration_ms)",
        )
    )


def _rss(b: Any, side: Side, containers: int) -> None:
    """``containers`` slice containers through the NRI route, one after another; VmRSS after the
    100th (or a tenth of them) and the last."""
    sample = _sampler(side, "slice")
    first = min(100, max(1, containers // 10))
    at: dict[int, int] = {}
    for i in range(1, containers + 1):
        sample()
        if i in (first, containers):
            at[i] = side.rss_kib()
    grew = (at[containers] - at[first]) / 1024
    mib = at[containers] / 1024
    b.checks.append(
        (
            f"hook nri RSS flat over {containers:,} containers: <= 60 MiB, <= 1 MiB growth after container "
            f"{first}",
            mib <= 60 and grew <= 1.0,
            f"VmRSS {at[first] / 1024:.1f} MiB after {first}, {mib:.1f} MiB after {containers:,}",
        )
    )


def page_section(b: Any) -> str:
    return str(getattr(b, "nri_section", "") or "")
