"""Chaos at every apply step (issue 11, "Done when"): the live hook on a real runc container, with one
syscall failed (``strace -e inject=SYSCALL:error=E:when=N``) or the hook SIGKILLed (at a syscall, or
by a timer at a random moment) per run.

After every run: the container either did not start, or it runs with the whole plan applied (its
probes equal a clean run's, never something in between); and nothing is left behind on the host:
no node in the fake driver root or in the machine's /dev, no rule in the parent cgroup (v1 list,
v2 attached programs), no cgroup of the container, no temp file in the hook's /run tree.

The container is seed 000's MIG pod, privileged, with its own GI/CI caps missing from
``linux.devices``: the plan denies (cgroup writes or eBPF), removes the other cards and caps
(unlinkat) and creates its caps (mknodat, fchownat), all through ``openat2`` after ``setns``.
Time: about 30 runs of one container each; the whole file stays well under 60 s on a small node.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hook.adapters.apply import bpf_sys
from tests.hosttree import CAPS_MAJOR, cap_minor, make_host_tree
from tests.live.isolation import run_isolated
from tests.live.livekit import Bundle, RunResult, build_bundle, char_device, hook, parse_probe, probe_args
from tests.live.test_hook_scenarios import CAPS, MIG_UUID, REPO

STRACE = shutil.which("strace")
TIMEOUT = shutil.which("timeout") or "/usr/bin/timeout"
V1_DEVICES = Path("/sys/fs/cgroup/devices")
# the machine's cgroup2 mount as this process sees it: hybrid hosts have it at unified/
V2_ROOT = (
    Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir() else Path("/sys/fs/cgroup")
)
OWN = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (cap_minor(0, 1), cap_minor(0, 1, 0))]
SIBLING = cap_minor(0, 2)
PROBES = [
    "/dev/nvidia0",
    *OWN,
    "/dev/nvidia1",
    f"/dev/nvidia-caps/nvidia-cap{SIBLING}",
    "/tmp/sib",
    "/tmp/n1",
]
FULL_PLAN = {
    "/dev/nvidia0": "ENXIO",  # the MIG parent: kept, allowed
    OWN[0]: "ENXIO",  # own GI and CI caps: created, allowed
    OWN[1]: "ENXIO",
    "/dev/nvidia1": "ENOENT",  # another card: removed
    f"/dev/nvidia-caps/nvidia-cap{SIBLING}": "ENOENT",  # the sibling's cap: removed
    "/tmp/sib": "EPERM",  # ...and denied even when re-created
    "/tmp/n1": "EPERM",
}

pytestmark = pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("chaos")
    root = tmp / "driver-root"
    make_host_tree(root, "8x-mig", mknod=True)
    (tmp / "no-cdi").mkdir()
    settings = tmp / "settings.yaml"
    settings.write_text(f"log_file: {tmp}/hook.log\ncache_dir: {tmp}/cache\n")
    return {"tmp": tmp, "root": root, "settings": settings, "log": tmp / "hook.log"}


def hook_args(world: dict[str, Path]) -> list[str]:
    cdi = REPO / "examples" / "node" / "cdi"
    return [
        *(sys.executable, "-I", "-m", "hook", "prestart", "--driver-root", str(world["root"])),
        *("--config", str(world["settings"]), "--cdi-spec-dir", str(cdi)),
    ]


def mig_pod(dest: Path, world: dict[str, Path], wrapper: list[str]) -> Bundle:
    """Seed 000's MIG pod (privileged, CDI annotation) without its own caps in linux.devices."""
    own_minors = {cap_minor(0, 1), cap_minor(0, 1, 0)}
    caps = [1, 2, *own_minors, SIBLING, SIBLING + 1]
    devices = (
        [char_device(f"/dev/nvidia{i}", 195, i) for i in range(8)]
        + [char_device("/dev/nvidiactl", 195, 255)]
        + [char_device(f"/dev/nvidia-caps/nvidia-cap{m}", CAPS_MAJOR, m) for m in caps if m not in own_minors]
    )
    args = [*wrapper, *hook_args(world)]
    b = build_bundle(
        dest,
        probe_args(PROBES),
        hooks={"prestart": [hook(args[0], args, timeout=30)]},
        devices=devices,
        cgroup_devices=[{"allow": True, "access": "rwm"}],
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"nvidia.com/gpu={MIG_UUID}"},
    )
    all_caps = [*CAPS, "CAP_SYS_ADMIN"]
    b.config["process"]["capabilities"] = {k: all_caps for k in ("bounding", "effective", "permitted")}
    for path, minor, major in (("tmp/sib", SIBLING, CAPS_MAJOR), ("tmp/n1", 1, 195)):
        os.mknod(b.rootfs / path, 0o666 | 0o020000, os.makedev(major, minor))
    return b.write()


def snapshot(v2: bool) -> dict[str, Any]:
    """What the host shows outside any container: /dev's accelerator names, parent cgroup rules."""
    seen: dict[str, Any] = {
        "dev": sorted(n for n in os.listdir("/dev") if "nvidia" in n),
        "root_v1": (V1_DEVICES / "devices.list").read_text() if V1_DEVICES.exists() else "",
    }
    parent_v1 = V1_DEVICES / "odh-live"
    seen["parent_v1"] = (parent_v1 / "devices.list").read_text() if parent_v1.exists() else ""
    parent_v2 = V2_ROOT / "odh-live"
    if v2 and parent_v2.exists():
        fd = os.open(parent_v2, os.O_RDONLY | os.O_DIRECTORY)
        try:
            seen["parent_v2"] = bpf_sys.query_device_programs(fd).ids
        finally:
            os.close(fd)
    return seen


Wrapper = Callable[[str], list[str]]  # container id -> the command line put before the hook's


@pytest.fixture
def chaos(world: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., tuple[RunResult, list[str]]]]:
    """Run the pod once with a wrapper before the hook; the result and what /run holds afterwards."""
    seq = iter(range(1000))

    def run(wrapper: Wrapper, *, cgroup2: bool = False) -> tuple[RunResult, list[str]]:
        cid = f"odh-chaos-{uuid.uuid4().hex[:8]}"
        b = mig_pod(tmp_path / f"b{next(seq)}", world, wrapper(cid))
        b.id = cid
        b.config["linux"]["cgroupsPath"] = b.cgroups_path = f"/odh-live/{cid}"
        b.write()
        run_tree = tmp_path / f"run-{cid}"
        after = [f"find /run /var/log -mindepth 1 > {run_tree}", "sleep 0.2"]  # orphaned children finish
        res = run_isolated(b, after=after, cgroup2=cgroup2, timeout=60)
        for cg in (V1_DEVICES / "odh-live" / cid, V2_ROOT / "odh-live" / cid):
            assert not cg.exists(), f"{cg} left behind"
        return res, run_tree.read_text().split()

    yield run


def check(res: RunResult, run_tree: list[str], what: str, *, kill: bool = False) -> str:
    """Started with the full plan, or not started; no temp file left. Returns "full" or "refused".

    A kill at a random moment may land between a cache temp file's creation and its rename: the
    next start sweeps it (the cache's own tests cover that), so only failures that the hook saw
    (errors, kills at apply steps) must leave /run clean.
    """
    seen = parse_probe(res.stdout)
    print(
        what, "->", "started" if seen else f"refused rc={res.rc}", res.stderr.strip()[-300:]
    )  # shown on failure
    stray = [p for p in run_tree if ".tmp" in p or os.path.basename(p).startswith(".")]
    assert kill or not stray, f"{what}: temp files left behind: {stray}"
    if seen:
        assert res.rc == 0 and seen == FULL_PLAN, f"{what}: started with a partial plan: {seen}\n{res.stderr}"
        return "full"
    assert res.rc != 0, f"{what}: no probe output but runc said 0: {res.stderr}"
    errors = [
        e
        for e in re.findall(r"oci-device-hook: (.*?)(?:\\n|\"|$)", res.stderr)
        if not e.startswith("warning")
    ]
    for line in errors:  # the hook's own error line (absent when it was killed): a path, each step once
        assert line.startswith("/"), f"{what}: the error names no file: {line}"
        for step in ("device nodes", "cgroup v1", "cgroup v2", "locate cgroup"):
            assert line.count(f"{step}:") <= 1, f"{what}: step repeated: {line}"
    return "refused"


def inject(syscall: str, how: str, when: str, path: str = "") -> Wrapper:
    """strace failing (or SIGKILLing at) the ``when``-th ``syscall`` of each traced process.

    strace counts per process: the devnodes helper and its undo helper each start at 1. ``path``
    names a cgroup file below the container's cgroup (``-P``), so writes elsewhere (the hook's
    caches, its log) are not counted.
    """

    def wrapper(cid: str) -> list[str]:
        assert STRACE is not None
        args = [STRACE, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}"]
        args += ["-e", f"inject={syscall}:{how}:when={when}"]
        for name in path.split():
            args += ["-P", str(V1_DEVICES / "odh-live" / cid / name)]
        return args

    return wrapper


def no_wrapper(cid: str) -> list[str]:
    return []


# (syscall, injection, when, cgroup file): every apply step, its first call and a later one
V1_FAULTS = [
    ("write", "error=ENOSPC", "1", "devices.deny"),
    ("write", "error=ENOSPC", "6", "devices.deny"),
    ("write", "error=ENOSPC", "6+", "devices.deny devices.allow"),  # and every rollback write after it
    ("openat", "error=EACCES", "2", "devices.list"),  # the re-read that verifies the rules
    ("setns", "error=EPERM", "1", ""),
    ("openat2", "error=EIO", "1", ""),
    ("openat2", "error=EPERM", "1", ""),  # seccomp-like: the O_NOFOLLOW walk takes over, still whole
    ("openat2", "error=EIO", "4", ""),
    ("unlinkat", "error=EBUSY", "1", ""),
    ("unlinkat", "error=EBUSY", "5", ""),
    ("mknodat", "error=ENOSPC", "1", ""),  # the undo helper's first re-create fails too
    ("mknodat", "error=ENOSPC", "2", ""),
    ("fchownat", "error=EPERM", "2", ""),
    ("write", "signal=SIGKILL", "1", "devices.deny"),
    ("write", "signal=SIGKILL", "9", "devices.deny"),
    ("setns", "signal=SIGKILL", "1", ""),
    ("unlinkat", "signal=SIGKILL", "3", ""),
    ("mknodat", "signal=SIGKILL", "2", ""),
]
V2_FAULTS = [
    ("bpf", "error=EPERM", "1", ""),
    ("bpf", "error=EPERM", "3", ""),
    ("bpf", "error=EPERM", "4", ""),
    ("bpf", "error=EINVAL", "5", ""),
    ("bpf", "error=EPERM", "6", ""),
    ("bpf", "signal=SIGKILL", "5", ""),
]


def test_clean_run_applies_the_full_plan(chaos: Any) -> None:
    res, run_tree = chaos(no_wrapper)
    assert res.rc == 0, res.stderr
    assert check(res, run_tree, "clean") == "full"


def test_one_failed_syscall_at_each_step_never_leaves_a_partial_container(chaos: Any) -> None:
    before = snapshot(v2=False)
    outcomes = {}
    for syscall, how, when, path in V1_FAULTS:
        what = f"{syscall}:{how}:when={when} {path}"
        res, run_tree = chaos(inject(syscall, how, when, path))
        outcomes[what] = check(res, run_tree, what)
        assert snapshot(v2=False) == before, f"{what}: the host changed"
    # the injections did hit apply steps: most runs were refused, and the fallback one ran whole
    assert outcomes["openat2:error=EPERM:when=1 "] == "full"
    refused = [w for w, o in outcomes.items() if o == "refused"]
    assert len(refused) >= len(V1_FAULTS) - 3, outcomes


def test_ebpf_steps_fail_whole_on_cgroup_v2(chaos: Any) -> None:
    before = snapshot(v2=True)
    outcomes = {}
    for syscall, how, when, path in V2_FAULTS:
        what = f"v2 {syscall}:{how}:when={when}"
        res, run_tree = chaos(inject(syscall, how, when, path), cgroup2=True)
        outcomes[what] = check(res, run_tree, what)
        assert snapshot(v2=True) == before, f"{what}: the host changed"
    assert "refused" in outcomes.values(), outcomes


def test_sigkill_at_random_moments(chaos: Any, world: dict[str, Path]) -> None:
    """``timeout -s KILL`` (the whole process group: the hook and its devnodes child) at random
    points across a clean hook's duration; the seed is in every failure message."""
    seed = int(os.environ.get("ODH_CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    times = world["tmp"] / "hook-times"
    timed = ["/bin/sh", "-c", f'date +%s.%N > {times}; "$@"; rc=$?; date +%s.%N >> {times}; exit $rc', "sh"]
    res, _ = chaos(lambda cid: timed)
    assert res.rc == 0, res.stderr
    t0, t1 = map(float, times.read_text().split())
    span = max(0.1, t1 - t0)  # how long the hook itself ran: kills land inside it
    before = snapshot(v2=False)
    for i in range(5):
        delay = round(rng.uniform(0.02, span), 3)
        what = f"seed {seed} run {i}: SIGKILL after {delay}s"
        res, run_tree = chaos(lambda cid, d=delay: [TIMEOUT, "-s", "KILL", str(d)])
        check(res, run_tree, what, kill=True)
        assert snapshot(v2=False) == before, f"{what}: the host changed"
    log = world["log"].read_text().splitlines() if world["log"].exists() else []
    assert all(json.loads(line) for line in log)  # a kill never leaves a torn log line
