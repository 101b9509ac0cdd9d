"""The NRI test bed itself, on Debian's containerd 1.7 and 2.x, cgroup v1 and v2, with a stub plugin.

What the route's live tests rest on (tests/live/nribed.py): the private containerd takes a plugin's
registration on the scratch NRI socket, calls it at CreateContainer with the pod's uid, applies its
adjustment, refuses the container it refuses with its message, and drops a plugin slower than the
request timeout, creating that container unadjusted. A privileged container sees the private
``/dev``'s fake GPUs, and the image's planted node is there to re-open.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

grpc = pytest.importorskip("grpc", reason="grpcio (the test extra)")
from tests.live.livekit import parse_probe, probe_args  # noqa: E402
from tests.live.nribed import Bed  # noqa: E402
from tests.live.nristub import Seen, Stub, env_adjustment  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get to fetch containerd")
BEDS = [("trixie", False), ("trixie", True), ("sid", False), ("sid", True)]


@pytest.fixture(scope="module", params=BEDS, ids=[f"{s}-{'v2' if v2 else 'v1'}" for s, v2 in BEDS])
def bed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    suite, v2 = request.param
    b = Bed(tmp_path_factory.mktemp(f"nri-{suite}"), suite, v2)
    try:
        b.start()
        yield b
    finally:
        b.stop()


def _answer(seen: Seen) -> bytes | str:
    if seen.container_name == "cuda" and any(e == "REFUSE=1" for e in seen.env):
        return "odh-stub: refused"
    return env_adjustment("ODH_STUB", seen.pod_uid)


@pytest.fixture
def stub(bed: Bed) -> Iterator[Stub]:
    s = Stub(str(bed.nri_socket), answer=_answer).start()
    assert s.configured.wait(10), bed.log()[-2000:]
    try:
        yield s
    finally:
        s.close()
        time.sleep(0.2)  # the runtime notices the closed connection before the next test registers


def test_a_registered_plugin_adjusts_a_privileged_container_that_sees_the_fake_gpus(
    bed: Bed, stub: Stub
) -> None:
    sid, pod = bed.pod(privileged=True)
    script = probe_args(["/dev/nvidia0", "/dev/nvidia7", "/tmp/n0"])[2] + '; echo "STUB $ODH_STUB"'
    cid = bed.create(sid, pod, ["/bin/sh", "-c", script], privileged=True)
    assert bed.client is not None
    bed.client.start(cid)
    out = bed.wait_exit(cid, pod)
    assert f"STUB {pod.uid}" in out, out
    # privileged: every node of the private /dev, and a re-made one, allowed (no driver behind them)
    assert parse_probe(out) == dict.fromkeys(("/dev/nvidia0", "/dev/nvidia7", "/tmp/n0"), "ENXIO"), out
    assert [(s.pod_uid, s.container_id) for s in stub.seen if s.container_name == "cuda"] == [(pod.uid, cid)]


def test_a_plugins_error_refuses_the_container_with_its_message(bed: Bed, stub: Stub) -> None:
    sid, pod = bed.pod()
    with pytest.raises(grpc.RpcError) as refused:
        bed.create(sid, pod, ["/bin/true"], envs=[("REFUSE", "1")])
    assert "odh-stub: refused" in str(refused.value.details())


def test_a_plugin_slower_than_the_request_timeout_is_dropped_and_the_container_created_unadjusted(
    bed: Bed, stub: Stub
) -> None:
    stub.delay = 3.0  # the bed's plugin_request_timeout is 2 s
    sid, pod = bed.pod()
    began = time.monotonic()
    cid = bed.create(sid, pod, ["/bin/sh", "-c", 'echo "STUB ${ODH_STUB:-none}"'])
    took = time.monotonic() - began
    assert 1.9 < took < 3.0, took
    assert bed.client is not None
    bed.client.start(cid)
    assert "STUB none" in bed.wait_exit(cid, pod)
    assert stub.closed.wait(5), "the runtime kept a plugin that timed out"
