"""Suite-wide host-safety guard (docs/testing.md, "Host safety").

Rule: the suite may only touch what it creates (temp dirs, scratch cgroups, private mount
namespaces). This guard checks the two things a regression could break on the machine itself:
the root device cgroup (v1) must still allow everything, and no ``nvidia*`` entry may appear in
or vanish from the host's ``/dev``. A broken precondition left by an earlier run is reported as
such once, at the start, instead of as a string of unrelated failures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT_DEVICES_LIST = Path("/sys/fs/cgroup/devices/devices.list")
HOST_CACHE_DIR = Path("/run/oci-device-hook")  # the hook's default cache dir on this machine
HOST_LOG = Path("/var/log/oci-device-hook.log")  # the hook's default log on this machine


def _root_devices_list() -> str | None:
    try:
        return ROOT_DEVICES_LIST.read_text().strip()
    except OSError:
        return None  # no v1 devices hierarchy here


def _host_dev_nvidia() -> set[str]:
    dev = Path("/dev")
    found = {p.name for p in dev.glob("nvidia*")}
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        found |= {f"nvidia-caps/{p.name}" for p in caps.iterdir()}
    return found


@pytest.fixture(scope="session", autouse=True)
def host_untouched() -> Iterator[None]:
    before = _root_devices_list()
    if before is not None and before != "a *:* rwm":
        pytest.fail(
            f"precondition broken before this run: {ROOT_DEVICES_LIST} reads {before!r}, not 'a *:* rwm' "
            "(an earlier run or another tool narrowed the root device cgroup; restore it with "
            f"`echo a > {ROOT_DEVICES_LIST.parent}/devices.allow` and rerun)"
        )
    nodes = _host_dev_nvidia()
    yield
    after = _root_devices_list()
    assert after == before, f"the suite changed {ROOT_DEVICES_LIST}: {before!r} -> {after!r}"
    now = _host_dev_nvidia()
    added, removed = sorted(now - nodes), sorted(nodes - now)
    assert now == nodes, f"the suite changed the host's /dev: added {added}, removed {removed}"


def _host_log_size() -> int:
    try:
        return HOST_LOG.lstat().st_size
    except OSError:
        return 0


def _host_log_lines_of(basetemp: Path, since: int) -> list[str]:
    """Lines added to the host's default log since offset ``since`` that name this session's temp
    dir: this run wrote them (other processes on a shared machine may write that log too)."""
    try:
        with open(HOST_LOG, "rb") as f:
            f.seek(since if since <= HOST_LOG.lstat().st_size else 0)
            new = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in new.splitlines() if str(basetemp) in line]


def _host_cache() -> dict[str, tuple[int, int]] | None:
    """The host's cache dir as names -> (mtime, size), None when absent."""
    try:
        return {p.name: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in HOST_CACHE_DIR.iterdir()}
    except FileNotFoundError:
        return None
    except OSError:
        return {}


@pytest.fixture(autouse=True)
def host_cache_untouched(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Every hook run of a test has a private /run (or its own cache dir) and a private /var/log (or
its own log): the host's cache dir and default log are never written.

    Checked per test, so the one that wrote it is named (a run of the hook by hand on this machine
    at the same moment would also show up here).
    """
    if request.node.get_closest_marker("installs_package"):
        yield  # the real package's own dir: that test purges it and checks it is gone
        return
    before, log_size = _host_cache(), _host_log_size()
    yield
    after = _host_cache()
    assert after == before, (
        f"{request.node.nodeid} wrote the host's {HOST_CACHE_DIR}: {before!r} -> {after!r} "
        "(run the hook in a private /run: tests.bundles.PRIVATE_RUN)"
    )
    ours = _host_log_lines_of(tmp_path_factory.getbasetemp(), log_size)
    assert not ours, (
        f"{request.node.nodeid} wrote the host's {HOST_LOG}: {ours[0][:300]!r} "
        "(a settings file that names no log, or one that does not load, logs there: "
        "run the hook with a private tmpfs over /var/log)"
    )
