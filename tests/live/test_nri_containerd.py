"""Issue 34 item 7: the NRI route (``hook nri``) on real containerd, through the CRI, cgroup v1 and v2.

Debian 13's containerd 1.7.24 and Debian unstable's 2.1.9 (tests/live/debcache.py), each run
privately by tests/live/nribed.py with NRI on, ``hook nri`` registered on its NRI socket and
running in the bed's namespace (it acts on the containers' ``/dev`` and device cgroups). The pods
are what a kubelet sends (tests/cri.py); the evidence is the kubelet's: its device-plugin checkpoint
and its DRA state, written by the test. Each container probes with ``open()``: EPERM = its device
cgroup denies, ENXIO = allowed (a fake node, no driver), ENOENT = not in its ``/dev``.

Cases: the privileged seed-000 slice pod, a privileged MIG pod, a privileged DRA pod, a plain pod,
a refused pod; then the daemon killed while a container starts (created unadjusted, narrowed late
on reconnect within 10 s, ``late: true``), and the daemon slower than the request timeout (stopped
with SIGSTOP: containerd drops it after 2 s and creates the container unadjusted; narrowed late
once it runs again).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc", reason="grpcio (the test extra)")
from tests.bundles import checkpoint, checkpoint_entry  # noqa: E402
from tests.dra_shapes import claim, device, dra_state, gpu_id, write_claim_spec  # noqa: E402
from tests.live.livekit import parse_probe, probe_args  # noqa: E402
from tests.live.nribed import Bed, registrations  # noqa: E402
from tests.live.test_hook_scenarios import MIG_UUID, SLICE_UUID  # noqa: E402
from tests.live.test_spec_level import MIG_EXPECTED, MIG_PROBES, SLICE_EXPECTED, SLICE_PROBES  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get to fetch containerd")
REPO = Path(__file__).resolve().parents[2]
BEDS = [("trixie", False), ("trixie", True), ("sid", False), ("sid", True)]
CLAIM = "5d0c9e8a-7b6f-4e3d-8c2b-1a0f9e8d7c6b"
DRA_PROBES = [f"/dev/nvidia{m}" for m in range(8)] + ["/dev/nvidiactl", "/tmp/n0"]
LOOP = 'while :; do {probe}; echo "ROUND $(cat /proc/uptime)"; sleep 0.3; done'


class Route:
    """A bed with ``hook nri`` on its NRI socket, and the kubelet's files the daemon reads."""

    def __init__(self, tmp: Path, suite: str, cgroup2: bool) -> None:
        self.bed = Bed(tmp, suite, cgroup2)
        self.tmp = tmp
        self.ckpt = tmp / "kubelet_internal_checkpoint"
        self.ckpt.write_bytes(checkpoint([]))
        self.dra = tmp / "dra_manager_state"
        self.dra.write_bytes(dra_state([]))
        self.log = tmp / "hook.log"
        self.settings = tmp / "settings.yaml"
        self.write_settings()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.err = tmp / "nri.err"

    def write_settings(self, **extra: str) -> None:
        doc = {"log_file": str(self.log), "cache_dir": str(self.tmp / "cache"),
               "driver_root": str(self.bed.driver),
               "cdi_spec_dirs": [str(REPO / "examples/node/cdi"), str(self.bed.cdi)],
               "kubelet_checkpoint": str(self.ckpt), "kubelet_dra_state": str(self.dra), **extra}  # fmt: skip
        new = self.settings.with_suffix(".new")
        new.write_text(json.dumps(doc))
        new.rename(self.settings)

    def start_daemon(self) -> float:
        """``hook nri`` in the bed's namespace; the time it said it registered."""
        self.daemon = self.bed.start_nri(self.settings, self.err)
        return time.monotonic()

    def registrations(self) -> int:
        return registrations(self.err)

    def kill_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.daemon = None

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def of(self, cid: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("container", {}).get("id") == cid]


@pytest.fixture(scope="module", params=BEDS, ids=[f"{s}-{'v2' if v2 else 'v1'}" for s, v2 in BEDS])
def route(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Route]:
    suite, v2 = request.param
    r = Route(tmp_path_factory.mktemp(f"nri-{suite}"), suite, v2)
    try:
        r.bed.start()
        r.start_daemon()
        yield r
    finally:
        if r.daemon is not None:
            with contextlib.suppress(OSError):
                os.kill(r.daemon.pid, signal.SIGCONT)
        r.kill_daemon()
        r.bed.stop()


def _allocate(route: Route, pod_uid: str, resource: str, ids: list[str]) -> None:
    route.ckpt.write_bytes(checkpoint([checkpoint_entry(resource, ids, pod_uid=pod_uid, container="cuda")]))


def _stages(route: Route, cid: str) -> list[tuple[str, str]]:
    return [(r.get("stage", ""), r["verdict"]) for r in route.of(cid)]


def test_the_privileged_slice_pod_is_narrowed_to_its_gpu_before_it_runs(route: Route) -> None:
    sid, pod = route.bed.pod(privileged=True)
    _allocate(route, pod.uid, "nvidia.com/gpu", [SLICE_UUID])
    assert route.bed.client is not None
    cid = route.bed.create(sid, pod, probe_args(SLICE_PROBES), privileged=True,
                           envs=[("NVIDIA_VISIBLE_DEVICES", SLICE_UUID)])  # fmt: skip
    route.bed.client.start(cid)
    assert parse_probe(route.bed.wait_exit(cid, pod)) == SLICE_EXPECTED
    assert _stages(route, cid) == [("create", "apply"), ("start", "apply")]
    assert {r["route"] for r in route.of(cid)} == {"nri"}


def test_the_privileged_mig_pod_keeps_its_own_caps_only(route: Route) -> None:
    sid, pod = route.bed.pod(privileged=True)
    _allocate(route, pod.uid, "nvidia.com/mig-3g.40gb", [MIG_UUID])
    seen = route.bed.run(sid, pod, probe_args(MIG_PROBES), privileged=True)
    assert seen == MIG_EXPECTED


def test_the_privileged_dra_pod_opens_its_claims_gpu_only(route: Route) -> None:
    """The claim's CDI device travels in the CRI's CDI field; containerd injects it (1.7.2+ with
    ``enable_cdi``); the kubelet's DRA state names the pod."""
    write_claim_spec(route.bed.cdi, CLAIM, gpus=[2])
    sid, pod = route.bed.pod(privileged=True)
    route.dra.write_bytes(dra_state([claim(CLAIM, "gpu", [pod.uid], [device([gpu_id(CLAIM, 2)], "gpu-2")])]))
    try:
        seen = route.bed.run(
            sid, pod, probe_args(DRA_PROBES), privileged=True, cdi_devices=[gpu_id(CLAIM, 2)]
        )
    finally:
        route.dra.write_bytes(dra_state([]))
    assert {p for p, r in seen.items() if r == "ENXIO"} == {"/dev/nvidia2", "/dev/nvidiactl"}, seen
    assert seen["/tmp/n0"] == "EPERM"


def test_a_plain_pod_starts_untouched_and_unrecorded(route: Route) -> None:
    sid, pod = route.bed.pod()
    assert route.bed.client is not None
    cid = route.bed.create(sid, pod, probe_args(["/dev/nvidia0", "/tmp/n0", "/dev/null"]))
    route.bed.client.start(cid)
    seen = parse_probe(route.bed.wait_exit(cid, pod))
    assert seen == {"/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM", "/dev/null": "OK"}
    assert route.of(cid) == []


def test_a_refused_pod_is_refused_at_create_with_the_routes_one_line(route: Route) -> None:
    """``privileged_allocation: reject``: a privileged pod widened beyond its allocation is not
    created; CRI's error carries the hook's reason."""
    route.write_settings(privileged_allocation="reject")
    try:
        sid, pod = route.bed.pod(privileged=True)
        _allocate(route, pod.uid, "nvidia.com/gpu", [SLICE_UUID])
        with pytest.raises(grpc.RpcError) as refused:
            route.bed.create(sid, pod, ["/bin/true"], privileged=True)
    finally:
        route.write_settings()
    assert "oci-device-hook: deny:" in str(refused.value.details()), refused.value.details()
    assert "policy: reject" in str(refused.value.details())


def _rounds(route: Route, pod: Any) -> list[dict[str, str]]:
    """The probe answers of a looping container, one dict per finished round."""
    out, rounds, cur = route.bed.output(pod), [], {}
    for line in out.splitlines():
        if line.startswith("ROUND"):
            rounds.append(cur)
            cur = {}
        else:
            cur.update(parse_probe(line))
    return rounds


NARROWED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/tmp/n0": "EPERM"}
UNADJUSTED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENXIO", "/tmp/n0": "ENXIO"}


def _late(route: Route, sid: str, pod: Any, registered_again: Any) -> None:
    """Start a looping slice container while the daemon cannot answer; it runs unadjusted; once
    ``registered_again()`` (returning the registration time) the container is narrowed within 10 s
    and its record says ``late: true``."""
    assert route.bed.client is not None
    probe = probe_args(list(NARROWED))[2]
    cid = route.bed.create(sid, pod, ["/bin/sh", "-c", LOOP.format(probe=probe)], privileged=True)
    route.bed.client.start(cid)
    for _ in range(100):
        if _rounds(route, pod):
            break
        time.sleep(0.1)
    assert _rounds(route, pod)[0] == UNADJUSTED, _rounds(route, pod)
    assert route.of(cid) == []
    registered = registered_again()
    while time.monotonic() - registered < 12:
        if _rounds(route, pod)[-1] == NARROWED:
            break
        time.sleep(0.1)
    took = time.monotonic() - registered
    assert _rounds(route, pod)[-1] == NARROWED, _rounds(route, pod)[-3:]
    assert took <= 10.5, took
    late = [r for r in route.of(cid) if r.get("late")]
    assert [(r["stage"], r["verdict"], r["route"]) for r in late] == [("synchronize", "apply", "nri")], late


def test_a_container_started_while_the_daemon_was_killed_is_narrowed_late_on_reconnect(route: Route) -> None:
    sid, pod = route.bed.pod(privileged=True)
    _allocate(route, pod.uid, "nvidia.com/gpu", [SLICE_UUID])
    route.kill_daemon()
    time.sleep(0.3)  # containerd sees the closed connection and drops the plugin
    _late(route, sid, pod, route.start_daemon)


def test_a_daemon_slower_than_the_request_timeout_lets_one_container_through_then_narrows_it(
    route: Route,
) -> None:
    sid, pod = route.bed.pod(privileged=True)
    _allocate(route, pod.uid, "nvidia.com/gpu", [SLICE_UUID])
    assert route.daemon is not None
    pid, before = route.daemon.pid, route.registrations()
    os.kill(pid, signal.SIGSTOP)  # connected, answering nothing: containerd's 2 s timeout drops it

    def resume() -> float:
        os.kill(pid, signal.SIGCONT)
        for _ in range(400):  # it notices the closed socket and registers again (backoff 0.5 s)
            if route.registrations() > before:
                return time.monotonic()
            time.sleep(0.05)
        raise AssertionError("hook nri did not register again: " + route.err.read_text()[-2000:])

    began = time.monotonic()
    try:
        _late(route, sid, pod, resume)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert time.monotonic() - began > 2  # the create waited out containerd's request timeout
    assert "dropped as 90-oci-device-hook" in route.err.read_text()
