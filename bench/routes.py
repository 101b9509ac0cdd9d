"""Issue 27's speed rows: every route, its floor, the decider warm / stopped / absent, round-robin.

Rule: a *workload* (one container shape on one node) is started by every *variant* in one
round-robin (``bench.timing.round_robin``): bare runc; each route's floor; each route with the
decider absent (in-process), warm and stopped; NVIDIA's runtime in CDI mode when given. So every
ratio of a workload compares samples taken under the same drift. The routes, as an engine runs them:

- prestart: runc with the hook in ``hooks.prestart`` (floor: ``python3 -ISB -c pass`` there).
- wrapper (containerd's route): ``packaging/runtime`` as the runtime binary, settings from
  ``OCI_DEVICE_HOOK_CONFIG``; it runs ``hook runtime-wrapper`` on create/run, which execs runc
  (floor: the same sh wrapper, its ``hook`` a ``python3 -ISB`` that only execs runc).
- precreate (hooks.d ``precreate`` of podman/CRI-O): ``hook precreate < config.json``, the
  decided config written back, then runc (floor: a ``python3 -ISB`` that copies stdin to stdout).
- nvidia: ``nvidia-container-runtime`` (CDI mode, ``bench.nvidia``) as the runtime binary.

Each route where a per-start process asks the decider (prestart, wrapper) also runs its *floor
client* (``bench.floorclient``): the least such a process can do, decider warm, so the rows show
what the shipped client spends above it.

A *create+start+delete* workload drives ``create``, ``start``, a wait for the container's exit and
``delete --force`` through the variant's runtime binary, as containerd's shim does (it is the
container's subreaper and deletes after reaping it; without the wait, delete races the exit); a
*run* workload is one ``runc run``.
Every hook of a workload gets only ``--config S`` (the wrapper: ``OCI_DEVICE_HOOK_CONFIG=S``),
and the decider ``serve --config S``: one settings file names the driver root, CDI dirs, log and
caches, so the decider serves exactly the hooks of its workload.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import bundles
from bench.decider import MODES, Decider, running
from bench.timing import Sample, round_robin

__all__ = ["Node", "Workload", "Result", "Target", "measure", "PRECREATE_FLOOR", "FLOOR_CLIENT"]

Make = Callable[[Path, str], dict[str, Any]]
PRECREATE_FLOOR = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
WRAPPER_FLOOR = "import posix, sys\na = sys.argv[sys.argv.index('--') + 1:]\nposix.execv(a[0], a)\n"
FLOOR_CLIENT = "floor-client"  # the variant's mode: bench.floorclient, decider warm
CLIENT_ROUTES = ("prestart", "wrapper")  # the routes whose per-start process asks the decider
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Node:
    """One node's settings file (driver root, CDI dirs, log, caches, the wrapper's runtime)."""

    name: str
    settings: Path
    log: Path


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    make: Make
    node: Node
    lifecycle: str  # "run" or "csd" (create+start+delete)
    routes: tuple[str, ...]  # of "prestart", "wrapper", "precreate"
    nvidia: bool = False
    decided: bool = True  # False: the fast path lets it through (no decider asked, no floor client)


@dataclass(frozen=True)
class Result:
    """A workload's samples per variant (``route/mode``; ``bare``, ``nvidia``, ``route/floor``)."""

    workload: Workload
    times: dict[str, tuple[float, ...]]
    served: dict[str, list[str]]

    def ms(self, variant: str) -> float:
        return statistics.median(self.times[variant]) * 1000


@dataclass(frozen=True)
class Target:
    label: str
    measured: float
    limit: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.measured <= self.limit


@dataclass
class Kit:
    """What the variants need: ``bench.main.Bench``'s fixtures plus the runtime binaries."""

    tmp: Path
    rootfs: Path
    launcher: Path
    interp: str
    runc: str
    nvidia: str | None
    nvidia_env: dict[str, str]

    def floor_dir(self) -> Path:
        """``runtime`` (packaging/runtime) beside a ``hook`` that only execs the real runtime."""
        d = self.tmp / "wrapper-floor"
        if not (d / "runtime").exists():
            d.mkdir(parents=True, exist_ok=True)
            shutil.copy2(bundles.REPO / "packaging" / "runtime", d / "runtime")
            (d / "hook").write_text(f"#!{self.interp} -ISB\n{WRAPPER_FLOOR}")
            (d / "hook").chmod(0o755)
        return d

    def floor_client(self) -> Path:
        """``runtime`` (packaging/runtime) beside a ``hook`` that is the floor client."""
        d = self.tmp / "floor-client"
        if not (d / "runtime").exists():
            from bench import floorclient

            floorclient.install(d / "hook", self.interp)
            shutil.copy2(bundles.REPO / "packaging" / "runtime", d / "runtime")
        return d

    def wrapper(self) -> Path:
        w = self.launcher.parent / "runtime"
        if not w.exists():
            shutil.copy2(bundles.REPO / "packaging" / "runtime", w)
        return w


def _check(proc: subprocess.CompletedProcess[bytes], what: str, err: bytes = b"") -> None:
    if proc.returncode != 0:
        text = (err or proc.stderr or b"").decode(errors="replace").strip()
        raise RuntimeError(f"{what}: exit {proc.returncode}: {text[-2000:]}")


def _sample(kit: Kit, w: Workload, variant: str, env: dict[str, str]) -> Sample:
    """One start of ``w`` by ``variant`` (route/mode, route/floor, bare, nvidia), timed whole."""
    route, _, mode = variant.partition("/")
    bundle = kit.tmp / "bundles" / f"{w.key}-{variant.replace('/', '-')}"
    root = str(kit.tmp / "runc")
    settings = str(w.node.settings)
    hooks: dict[str, Any] = {}
    runtime, run_env = kit.runc, env
    pre: list[str] | None = None
    if route == "prestart":
        floor = [kit.interp, "-ISB", "-c", "pass"]
        cmd = floor if mode == "floor" else [str(kit.launcher), "--config", settings]
        if mode == FLOOR_CLIENT:
            cmd = [kit.interp, "-ISB", str(kit.floor_client() / "hook"), "prestart", "--config", settings]
        hooks = {"prestart": [{"path": cmd[0], "args": cmd, "env": bundles.HOOK_ENV, "timeout": 30}]}
    elif route == "wrapper":
        dirs = {"floor": kit.floor_dir, FLOOR_CLIENT: kit.floor_client}
        runtime = str((dirs[mode]() if mode in dirs else kit.launcher.parent) / "runtime")
        if mode not in dirs:
            kit.wrapper()
    elif route == "precreate":
        pre = ([kit.interp, "-ISB", "-c", PRECREATE_FLOOR] if mode == "floor"
               else [str(kit.launcher), "precreate", "--config", settings])
    elif route == "nvidia":
        runtime, run_env = str(kit.nvidia), {**env, **kit.nvidia_env}

    def run() -> float:
        cid = f"odh-bench-{uuid.uuid4().hex[:10]}"
        config = w.make(kit.rootfs, f"/odh-bench/{cid}")
        config["hooks"] = hooks
        bundles.write_bundle(bundle, config)
        start = time.perf_counter()
        try:
            if pre is not None:
                with open(bundle / "config.json", "rb") as f:
                    got = subprocess.run(pre, stdin=f, capture_output=True, env=env)
                _check(got, f"{variant}: precreate")
                (bundle / "config.json").write_bytes(got.stdout)
            if w.lifecycle == "run":
                _check(subprocess.run([runtime, "--root", root, "run", "--bundle", str(bundle), cid],
                                      stdin=subprocess.DEVNULL, capture_output=True, env=run_env), variant)
            else:
                pid_file = bundle / "init.pid"
                with tempfile.TemporaryFile() as err:
                    create = [runtime, "--root", root, "create", "--bundle", str(bundle), "--pid-file",
                              str(pid_file), cid]
                    created = subprocess.run(create, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=err, env=run_env)
                    err.seek(0)
                    _check(created, f"{variant}: create", err.read())
                _check(subprocess.run([runtime, "--root", root, "start", cid], stdin=subprocess.DEVNULL,
                                      capture_output=True, env=run_env), f"{variant}: start")
                wait_exit(int(pid_file.read_text()))
                _check(subprocess.run([runtime, "--root", root, "delete", "--force", cid],
                                      stdin=subprocess.DEVNULL, capture_output=True, env=run_env),
                       f"{variant}: delete")
        except RuntimeError:
            subprocess.run([kit.runc, "--root", root, "delete", "--force", cid], capture_output=True)
            raise
        return time.perf_counter() - start

    return run


def wait_exit(pid: int) -> None:
    """Until the container's init ``pid`` has exited: reaped as its subreaper (``measure`` makes
    this process one for create+start+delete), else (not this process's child) watched in /proc."""
    try:
        os.waitpid(pid, 0)
        return
    except ChildProcessError:
        pass
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
            return
        time.sleep(0.0005)


def subreaper(on: bool) -> None:
    """Make this process the subreaper of its descendants (``prctl``), as containerd's shim is."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def variants(w: Workload, kit: Kit) -> list[str]:
    out = ["bare"]
    if w.nvidia and kit.nvidia:
        out.append("nvidia")
    for route in w.routes:
        client = route in CLIENT_ROUTES and w.decided
        out += [f"{route}/floor", *([f"{route}/{FLOOR_CLIENT}"] if client else []),
                *(f"{route}/{m}" for m in MODES)]
    return out


def measure(kit: Kit, w: Workload, rounds: int, after: Callable[[Decider], None] | None = None) -> Result:
    """Round-robin over every variant of ``w`` with one decider for its node; ``after`` runs while
    that decider is still up (the memory check)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OCI_DEVICE_HOOK_CONFIG": str(w.node.settings)}
    names = variants(w, kit)
    samples = {v: _sample(kit, w, v, env) for v in names}
    with running(kit.launcher, w.node.settings, w.node.log) as decider, _reaping(w.lifecycle == "csd"):

        def before(v: str) -> None:
            mode = v.partition("/")[2]
            decider.set("warm" if mode == FLOOR_CLIENT else mode if mode in MODES else "in-process")

        def judge(v: str) -> None:
            if v.endswith("/warm") and w.decided:
                decider.judge(v)

        times = round_robin(samples, rounds, before=before, after=judge)
        decider.set("warm")
        if after is not None:
            after(decider)
        return Result(w, times, decider.served)


@contextlib.contextmanager
def _reaping(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    subreaper(True)
    try:
        yield
    finally:
        subreaper(False)


# ---- rows and targets -------------------------------------------------------------------------------

ROUTE_NAMES = {"prestart": "prestart (runc hook)", "wrapper": "runtime wrapper (containerd's route)",
               "precreate": "`hook precreate` (hooks.d)"}
MODE_NAMES = {"floor": "the route's floor", "in-process": "none (in-process)", "warm": "warm",
              "stopped": "stopped (socket refuses)",
              FLOOR_CLIENT: "warm: the floor client (os, sys, _socket, _blake2, _json; asks, no log)"}


def served_note(r: Result, route: str) -> str:
    """How the warm samples of ``route`` were decided: all answered, or what else happened."""
    if not r.workload.decided:
        return ""
    got = r.served.get(f"{route}/warm", [])
    answered = sum(1 for v in got if v == "answered")
    if got and answered == len(got):
        return ""
    if not answered:
        kinds = ", ".join(sorted(set(got))) or "no record"
        return f"not answered by the decider ({kinds}): decided in-process"
    return f"{answered} of {len(got)} answered by the decider"


def table_rows(r: Result, nvidia_name: str) -> list[tuple[str, ...]]:
    """(route, decider, median, x bare, x floor, above floor, note) for every variant of ``r``."""
    bare = r.ms("bare")
    rows: list[tuple[str, ...]] = [("bare runc", "—", f"{bare:.1f} ms", "1.00x", "—", "—", "")]
    if "nvidia" in r.times:
        ms = r.ms("nvidia")
        rows.append((nvidia_name, "—", f"{ms:.1f} ms", f"{ms / bare:.2f}x", "—", "—", ""))
    for route in r.workload.routes:
        floor = r.ms(f"{route}/floor")
        for mode in ("floor", FLOOR_CLIENT, *MODES):
            if f"{route}/{mode}" not in r.times:
                continue
            ms = r.ms(f"{route}/{mode}")
            rel = "—" if mode == "floor" else f"{ms / floor:.2f}x"
            above = "—" if mode == "floor" else f"{ms - floor:+.1f} ms"
            note = served_note(r, route) if mode == "warm" else ""
            rows.append((ROUTE_NAMES[route], MODE_NAMES[mode], f"{ms:.1f} ms", f"{ms / bare:.2f}x", rel,
                         above, note))
    return rows


def _ratio(r: Result, a: str, b: str, label: str, limit: float) -> Target:
    """``a`` against ``b`` in workload ``r`` (same rounds)."""
    ma, mb = r.ms(a), r.ms(b)
    note = served_note(r, a.partition("/")[0]) if a.endswith("/warm") else ""
    detail = f"{ma:.1f} ms vs {mb:.1f} ms ({ma - mb:+.1f} ms)" + (f"; {note}" if note else "")
    return Target(label, ma / mb, limit, detail)


def _across(r: Result, base: Result, variant: str, label: str, limit: float) -> Target:
    """``variant`` in workload ``r`` against the same variant in ``base`` (their own rounds each)."""
    ma, mb = r.ms(variant), base.ms(variant)
    route = variant.partition("/")[0]
    floors = f"; floors {r.ms(f'{route}/floor'):.1f} / {base.ms(f'{route}/floor'):.1f} ms"
    notes = [n for n in (served_note(r, route), served_note(base, route)) if n]
    detail = f"{ma:.1f} ms vs {mb:.1f} ms ({ma - mb:+.1f} ms){floors}" + "".join(f"; {n}" for n in notes)
    return Target(label, ma / mb, limit, detail)


def targets(results: dict[str, Result], shapes: tuple[str, ...]) -> list[Target]:
    """Issue 35's speed targets (decider warm unless said), from whichever workloads this run measured."""
    out: list[Target] = []
    cdi, nodev, base = results.get("cdi1"), results.get("nodev"), results.get("slice-v1")
    if cdi:
        for route in CLIENT_ROUTES:
            if f"{route}/warm" not in cdi.times:
                continue
            what = f"one GPU by CDI annotation, {ROUTE_NAMES[route]}, decider warm"
            out.append(_ratio(cdi, f"{route}/warm", f"{route}/floor", f"{what}: x the route's floor", 1.15))
            if "nvidia" in cdi.times:
                label = f"{what}: x NVIDIA's runtime (CDI mode)"
                out.append(_ratio(cdi, f"{route}/warm", "nvidia", label, 1.05))
    for version in (1, 2):
        r = results.get(f"slice-v{version}")
        for route, limit in (("wrapper", 1.25), ("prestart", 1.30)):
            if r and f"{route}/warm" in r.times:
                label = (f"seed-000 slice pod, {ROUTE_NAMES[route]}, cgroup v{version}, decider warm: "
                         "x its floor")
                out.append(_ratio(r, f"{route}/warm", f"{route}/floor", label, limit))
    if nodev:
        for route in nodev.workload.routes:
            out.append(_ratio(nodev, f"{route}/warm", f"{route}/floor",
                              f"no-device container, {ROUTE_NAMES[route]}: x its floor", 1.05))
    for big in (results[key] for key in shapes if key in results and base is not None):
        for route in big.workload.routes:
            if base is not None and f"{route}/warm" in base.times:
                label = (f"{big.workload.label}, {ROUTE_NAMES[route]}, decider warm: x the same route's "
                         "8-GPU row (the slice pod, cgroup v1)")
                out.append(_across(big, base, f"{route}/warm", label, 1.3))
    for r in results.values():
        for route in r.workload.routes:
            out.append(_ratio(r, f"{route}/stopped", f"{route}/in-process",
                              f"{r.workload.label}, {route}: decider stopped x in-process", 1.05))
    return out
