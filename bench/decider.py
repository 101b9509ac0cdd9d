"""Bench rows for issue 23: container starts with the warm decider (``hook serve``) serving the hook.

Rule: the same containers and the same paired timing as ``bench.main``'s rows; the decider is the
launcher's ``hook serve`` (same interpreter, same lib) in the bench's private ``/run``, warmed with
one start of each container before its row. The rows "decider stopped" pair the in-process hook
with no decider against one that first fails to connect (a socket nobody listens on: what a
stopped decider leaves at worst), so they show what the fallback adds. The memory check drives
1,000 decisions of the slice pod on the 64 GPUs + 224 MIG node through ``hook.routes.client`` and reads
the decider's VmRSS after the 100th and the 1,000th.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import bundles, hosts
from bench.rows import Row
from bench.timing import Sample, paired

__all__ = ["decider_rows"]

SOCKET_DIR = Path("/run/oci-device-hook")
SOCKET = SOCKET_DIR / "decider.sock"
CDI_DIR = bundles.REPO / "examples" / "node" / "cdi"
ONE_GPU = "nvidia.com/gpu=GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"


@contextmanager
def running(b: Any) -> Iterator[subprocess.Popen[bytes]]:
    """``<launcher> serve`` until the block ends; the socket dir is made root-only for it."""
    SOCKET_DIR.mkdir(exist_ok=True)
    mode = SOCKET_DIR.stat().st_mode & 0o777
    os.chmod(SOCKET_DIR, 0o700)
    _stale(False)
    proc = subprocess.Popen([str(b.launcher), "serve"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(400):
            if SOCKET.is_socket() or proc.poll() is not None:
                break
            time.sleep(0.025)
        if not SOCKET.is_socket():
            done = proc.stderr is not None and proc.poll() is not None
            err = proc.stderr.read().decode(errors="replace") if done and proc.stderr else ""
            raise RuntimeError(f"the decider did not start: {err.strip()}")
        yield proc
    finally:
        proc.terminate()
        proc.wait(20)
        if proc.stderr:
            proc.stderr.close()
        os.chmod(SOCKET_DIR, mode)


def _stale(present: bool) -> None:
    """A socket file nobody listens on (``present``), or none."""
    if present and not SOCKET.exists():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(SOCKET))
        s.close()
    elif not present and SOCKET.exists():
        SOCKET.unlink()


def _with_stale(sample: Sample, present: bool) -> Sample:
    def run() -> float:
        _stale(present)
        return sample()

    return run


def _served(b: Any) -> int:
    from hook.routes import client

    got = client.status()
    return int(got["requests"]) if isinstance(got, dict) else -1  # type: ignore[call-overload]


def decider_rows(b: Any, version: int = 1) -> tuple[list[Row], list[tuple[str, bool, str]]]:
    """Rows (D*) and the decider's checks (served, memory); ``b`` is ``bench.main.Bench``. On
    cgroup v2 (``version``), only the slice pod and its "stopped" row."""
    launcher = [str(b.launcher)]
    cases: list[tuple[str, Callable[[Path, str], dict[str, Any]], list[str], float]] = []
    cases.append((f"seed 000 slice pod (cgroup v{version})", bundles.slice_config, b.slice_args(), 1.5))
    if version == 2:
        return _measure(b, cases, launcher, memory=False)

    def one_gpu(rootfs: Path, cgroups_path: str) -> dict[str, Any]:
        config = bundles.nodev_config(rootfs, cgroups_path)
        config["annotations"] = {"cdi.k8s.io/bench": ONE_GPU}
        return config

    cdi_args = [*b.slice_args(), "--cdi-spec-dir", str(CDI_DIR)]
    cases.append(("one GPU by CDI annotation", one_gpu, cdi_args, 1.5))
    shapes = (("8x7-mig", "8 GPUs x 7 MIG instances"), ("64+224-mig", "64 GPUs + 224 MIG instances"),
              ("254-gpus", "254 GPUs"))
    for shape, label in shapes:
        root, spec = b.host(shape)

        def make(rootfs: Path, cgroups_path: str, spec: Any = spec) -> dict[str, Any]:
            return hosts.slice_config(bundles.slice_config(rootfs, cgroups_path), spec)

        cases.append((f"slice pod on {label} (cgroup v1)", make, b.slice_args(root), 1.6))
    return _measure(b, cases, launcher, memory=True)


def _measure(
    b: Any, cases: list[tuple[str, Callable[[Path, str], dict[str, Any]], list[str], float]],
    launcher: list[str], *, memory: bool,
) -> tuple[list[Row], list[tuple[str, bool, str]]]:
    rows: list[Row] = []
    checks: list[tuple[str, bool, str]] = []
    reps = max(5, b.reps // 2)
    stopped: list[tuple[str, Sample, Sample]] = []
    with running(b) as proc:
        before = _served(b)
        for i, (label, make, args, target) in enumerate(cases):
            bare = b.runc_sample(f"d{i}-bare", make, None)
            hooked = b.runc_sample(f"d{i}-hook", make, b.hooks(launcher + args))
            hooked()  # warm the decider's views for this node
            rows.append(Row(f"(D) `runc run`, {label}, decider warm", "bare runc",
                            paired(bare, hooked, reps), target))
            if i in (0, 2):
                stopped.append((label, hooked, bare))
        served = _served(b) - before
        expected = len(cases) * (1 + 2 + reps)  # the warm-up start, paired()'s 2 warm-ups, the reps
        checks.append((f"(D) the decider served every hooked start of these rows ({cases[0][0]}, ...)",
                       served == expected and proc.poll() is None,
                       f"{served} of {expected} answered by the decider (the rest fell back in-process)"))
        if memory:
            checks.append(_memory(b, proc.pid))
    for label, hooked, _bare in stopped:
        alone = _with_stale(hooked, False)
        fallback = _with_stale(hooked, True)
        rows.append(Row(f"(Ds) {label}, decider stopped: a refused connect, then in-process",
                        "no decider (in-process)", paired(alone, fallback, reps), 1.1))
    _stale(False)
    return rows, checks


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def _memory(b: Any, pid: int) -> tuple[str, bool, str]:
    """1,000 decisions of the slice pod on the 64 + 224 MIG node (no pid: decided and logged, not
    applied); VmRSS after the 100th and the 1,000th."""
    from hook.routes import client

    os.environ[client.TIMEOUT_ENV] = "5000"  # this loop measures memory: never fall back on a slow start
    root, spec = b.host("64+224-mig")
    config = hosts.slice_config(bundles.slice_config(b.rootfs, "/odh-bench/rss"), spec)
    bundle = bundles.write_bundle(b.tmp / "bundles" / "decider-rss", config)
    opts = {"--config": [str(b.settings)], "--driver-root": [str(root)]}
    at: dict[int, int] = {}
    for i in range(1, 1001):
        stdin = bundles.state_for(bundle, f"odh-bench-rss-{i}")
        got = client.ask("prestart", opts, stdin, None)
        if isinstance(got, str):
            return ("(D) decider RSS after 1,000 decisions (64 + 224 MIG)", False, f"request {i}: {got}")
        if i in (100, 1000):
            at[i] = _rss_kib(pid)
    mib = at[1000] / 1024
    grew = (at[1000] - at[100]) / 1024
    ok = mib <= 60 and grew <= 1.0
    print(f"bench: decider RSS {at[100] / 1024:.1f} -> {mib:.1f} MiB", file=sys.stderr)
    return ("(D) decider RSS after 1,000 decisions on 64 GPUs + 224 MIG: <= 60 MiB, not growing from the "
            "100th (<= 1 MiB)", ok, f"VmRSS {at[100] / 1024:.1f} MiB after 100, {mib:.1f} MiB after 1,000")
