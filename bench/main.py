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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bundles, cdi_resolve
from bench.timing import Pair, Sample, paired, timed_process
from bench.wrapper import wrapper_rows

REPO = bundles.REPO
DOC = REPO / "docs" / "performance.md"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
CGROUP_PARENT = "odh-bench"


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    base: str
    pair: Pair
    target: float | None = None  # None: shown for information

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.pair.ratio <= self.target


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

    # ---- fixtures -------------------------------------------------------------------------------

    @property
    def lib(self) -> Path:
        return self.launcher.parent / "lib"

    def slice_args(self) -> list[str]:
        return ["--config", str(self.settings), "--driver-root", str(self.driver_root)]

    def state_file(self, name: str, bundle: Path, pid: int | None = None) -> Path:
        path = self.tmp / f"state-{name}.json"
        path.write_bytes(bundles.state_for(bundle, f"odh-bench-{name}", pid))
        return path

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

    def hooks(self, cmd: list[str]) -> dict[str, list[dict[str, Any]]]:
        return {"prestart": [{"path": cmd[0], "args": cmd, "env": bundles.HOOK_ENV, "timeout": 30}]}

    # ---- measurements -----------------------------------------------------------------------------

    def runc_rows(self) -> None:
        launcher = [str(self.launcher)]
        bare = self.runc_sample("nodev-bare", bundles.nodev_config, None)
        hooked = self.runc_sample("nodev-hook", bundles.nodev_config, self.hooks(launcher))
        self.rows.append(Row("(1) `runc run`, no-device busybox container", "bare runc",
                             paired(bare, hooked, self.reps), 1.8))
        bare = self.runc_sample("slice-bare", bundles.slice_config, None)
        hooks = self.hooks(launcher + self.slice_args())
        hooked = self.runc_sample("slice-hook", bundles.slice_config, hooks)
        self.rows.append(Row("(2) `runc run`, seed 000 slice pod (narrowed live, cgroup v1)", "bare runc",
                             paired(bare, hooked, self.reps), 2.5))

    def hook_alone_rows(self) -> None:
        bundle = bundles.write_bundle(self.tmp / "bundles" / "nodev-alone",
                                      bundles.nodev_config(self.rootfs, "/unused"))
        state = self.state_file("nodev", bundle)
        hook = timed_process([str(self.launcher)], state, "hook (no-device)")
        plain = timed_process([self.interp, "-I", "-c", "pass"], state, "python3 -I -c pass")
        self.rows.append(Row("(3) hook process, no-device container (state on stdin)",
                             "`python3 -I -c pass`", paired(plain, hook, self.reps), 2.0))
        flags = bundles.launcher_flags(self.launcher)
        plain = timed_process([self.interp, flags, "-c", "pass"], state, f"python3 {flags} -c pass")
        self.rows.append(Row("(3') same, against the launcher's own flags", f"`python3 {flags} -c pass`",
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

        for cold in (False, True):
            kind = "cold" if cold else "cached"
            pair = paired(sample(small, cold), sample(large, cold), self.reps)
            self.rows.append(Row(f"(4) hook process, CDI resolve, {kind}: {large_label}",
                                 f"{kind}: {small_label}", pair, None if cold else 1.5))
        for cold in (False, True):
            kind = "cold" if cold else "cached"
            results = []
            for devices, spec_dir, _cache_dir, _state in (small, large):
                cache = self.tmp / "inproc-cache" / spec_dir.parent.name
                name = cdi_resolve.last_device(devices)
                results.append(tuple(cdi_resolve.time_inprocess(spec_dir, cache, name, cold=cold,
                                                                reps=self.reps)))
            self.rows.append(Row(f"(4') in-process `Registry.load`+`resolve`, {kind}: {large_label}",
                                 f"{kind}: {small_label}", Pair(results[0], results[1])))

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
        fast = rec["hook_modules"] == ["hook", "hook.entry"] and not rec["heavy_stdlib"]
        self.check("(1)/(3) no-device: fast path (hook.entry only, no json/re/enum), no pynvml",
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
        for rec in _all(self.tmp / "hookproc-cdi.jsonl")[-2:]:
            self.check("(4) CDI resolve (last runs): no pynvml", rec["rc"] == 0 and not rec["pynvml"],
                       f"exit {rec['rc']}, {rec['new_modules']} modules")

    def check(self, label: str, ok: bool, detail: str) -> None:
        self.checks.append((label, ok, detail))


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
        target = "—" if r.target is None else f"≤ {r.target:.1f}x"
        result = "info" if r.passed is None else ("PASS" if r.passed else "**FAIL**")
        base, hook = f"{r.pair.a_ms * scale:.1f} {unit}", f"{r.pair.b_ms * scale:.1f} {unit}"
        ratio = f"{r.pair.ratio:.2f}x"
        lines.append(f"| {r.label} | {r.base} | {base} | {hook} | {ratio} | {target} | {result} |")
    return "\n".join(lines)


def report(b: Bench, started: str, loads: tuple[str, str], elapsed: float) -> str:
    rss = ["| process | peak RSS (median of 5) |", "| --- | ---: |"]
    rss += [f"| {label} | {kib / 1024:.1f} MiB |" for label, kib in b.rss]
    checks = ["| check | result | detail |", "| --- | --- | --- |"]
    checks += [f"| {label} | {'PASS' if ok else '**FAIL**'} | {detail} |" for label, ok, detail in b.checks]
    info = [f"- {k}: `{v}`" for k, v in machine(b.interp)]
    info.append(f"- load average at start / end: {loads[0]} / {loads[1]} (other work on the machine is not "
                "stopped; pairing keeps each ratio fair, absolute times drift)")
    info.append(f"- date: {started}; {b.reps} paired repetitions per row (+2 warm-up); "
                f"run took {elapsed:.0f} s")
    return PAGE.format(table=table(b.rows), rss="\n".join(rss), checks="\n".join(checks),
                       machine="\n".join(info))


PAGE = """# Performance on the container start path

Written by `bench/run` (do not edit by hand; rerun it). Every ratio comes from paired, alternating
repetitions in one run on one machine; values are medians. The hook runs as the package installs
it: the launcher from `packaging/launcher` (`python3 -ISB`, dependencies in `lib/` beside it) on the
interpreter its shebang names.

## Timings

{table}

- (1), (2): wall time of `runc run` of a busybox `/bin/true` container (`--root` in a scratch dir),
  bare and with the hook as its prestart hook. (2) is `examples/slice-privileged` made runnable:
  privileged shape, all 8 GPUs + MIG caps of `tests/hosttree.make_host_tree(root, "8x-mig")` (real
  nodes under the fake `--driver-root`), `NVIDIA_VISIBLE_DEVICES` of one GPU; the hook narrows it
  (13 deny rules written to the v1 device cgroup, 13 nodes removed) and the container exits 0.
  (2) passes `--config` (log file and caches in the scratch dir), so it never takes the fast path.
- (5), (6): the containers of (1) and (2) started through the spec-level runtime wrapper
  (`packaging/runtime` beside the launcher, settings from `OCI_DEVICE_HOOK_CONFIG`, runc as the real
  runtime; `bench/wrapper.py`): the wrapper runs `hook precreate` on config.json, then execs runc
  with no hook registered. (6) is narrowed in the config (allow-list), not in the running container.
- (3): the hook process alone on a no-device container (state on stdin, no `--config`: the fast
  path). (3') compares with the interpreter started with the launcher's own flags (`-S` skips
  `site`, which `-I -c pass` still runs), i.e. the hook's own cost over a bare interpreter.
- (4): `hook.entry.main` in a `python3 -ISB` process for a container whose CDI annotation names
  the device in the last spec file, with the Plan's application stubbed (`bench/hookproc.py
  --stub-apply`); cold = no parsed-spec cache (the run parses every file and writes it), cached =
  the cache from the previous run. (4') is `Registry.load` + `resolve` alone, in process.

To see where a path's time goes: `python3 -ISB -X importtime` on `bench/hookproc.py` with the
same arguments (imports dominate every path that is not the fast path).

## Peak RSS

{rss}

Measured by `bench/rss.py` (`getrusage(RUSAGE_CHILDREN).ru_maxrss` of a wrapper whose only child
is the measured process; for (2) the wrapper is the prestart hook itself).

## Checks

{checks}

`bench/hookproc.py` runs `hook.entry.main` in-process with the same inputs and reports
`sys.modules` afterwards: `pynvml` must never appear on these paths (the inventory comes from the
driver root's /proc files and the inventory cache).

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
    for controller in Path("/sys/fs/cgroup").iterdir():
        parent = controller / CGROUP_PARENT
        if parent.is_dir():
            for child in parent.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    parser.add_argument("--reps", type=int, default=25, help="paired repetitions per row (default 25)")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not Path(RUNC).exists() or not bundles.BUSYBOX.exists():
        sys.stderr.write("bench/run: needs root, runc and /usr/bin/busybox (static)\n")
        return 2
    sys.path.insert(0, str(REPO))
    from tests.hosttree import make_host_tree

    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = " ".join(Path("/proc/loadavg").read_text().split()[:3])
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
                  rootfs=bundles.build_rootfs(tmp / "rootfs"), driver_root=driver_root, settings=settings)
        steps = (("(1)+(2) runc", b.runc_rows), ("(3) hook alone", b.hook_alone_rows),
                 ("(4) CDI", b.cdi_rows), ("(5)+(6) wrapper", lambda: b.rows.extend(wrapper_rows(b, RUNC))),
                 ("peak RSS", b.rss_measure), ("NVML checks", b.nvml_checks))
        for name, step in steps:
            s = time.perf_counter()
            step()
            print(f"bench: {name} done in {time.perf_counter() - s:.0f} s", file=sys.stderr)
        load_end = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        page = report(b, started, (load_start, load_end), time.perf_counter() - t0)
    finally:
        cleanup_cgroups()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"bench: scratch dir kept: {tmp}", file=sys.stderr)
    print(page)
    if not args.no_doc:
        DOC.write_text(page)
    failed = [r.label for r in b.rows if r.passed is False] + [c[0] for c in b.checks if not c[1]]
    for label in failed:
        print(f"bench: FAIL: {label}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
