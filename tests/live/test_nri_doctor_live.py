"""``hook doctor``'s NRI lines on a node running the route: real containerd 1.7 and 2.1 (the NRI
bed, tests/live/nribed.py) with ``hook nri`` registered. The doctor judges with the binary of the
containerd that serves the config (``/proc/<pid>/exe``), not the first ``containerd`` on the
path (Debian 12's 1.6 here, which has no NRI), finds the daemon by its command line, and says
that on these versions a missing daemon lets containers start unadjusted."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="grpcio (the test extra)")
from hook.tools.doctornri import nri_checks
from tests.live.test_nri_containerd import Route

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get to fetch containerd")


@pytest.fixture(scope="module", params=["trixie", "sid"])
def route(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Route]:
    r = Route(tmp_path_factory.mktemp(f"doctor-{request.param}"), request.param, False)
    doc = json.loads(r.settings.read_text())
    r.settings.write_text(json.dumps({**doc, "nri_socket": str(r.bed.nri_socket)}))
    try:
        r.bed.start()
        r.start_daemon()
        yield r
    finally:
        r.kill_daemon()
        r.bed.stop()


def test_the_doctor_names_the_nri_route_and_its_fail_open_semantics(route: Route) -> None:
    assert route.daemon is not None
    lines, on_nri = nri_checks(Path("/"), Path("/proc"), route.bed.config, route.settings, False, False)
    ctd = [c for c in lines if c.name.endswith("(containerd)")]
    assert on_nri and [c.name for c in ctd] == ["route (containerd)", "missing daemon (containerd)"]
    route_line, missing = ctd
    version = ".".join(route.bed.version.split("~")[0].split("+")[0].split(".")[:3])
    assert route_line.ok and f"containerd {version}: NRI" in route_line.detail, route_line
    assert f"pid {route.daemon.pid}" in route_line.detail and str(route.bed.nri_socket) in route_line.detail
    assert missing.ok and missing.warn and "start unadjusted" in missing.detail, missing
    assert "upgrade to containerd >= 2.2" in missing.fix


def test_with_the_daemon_gone_the_route_line_says_nothing_is_nri(route: Route) -> None:
    route.kill_daemon()
    try:
        lines, on_nri = nri_checks(Path("/"), Path("/proc"), route.bed.config, route.settings, False, False)
        assert not on_nri and "not the NRI route" in lines[0].detail, lines
    finally:
        route.start_daemon()
