"""``hook doctor``'s NRI lines (hook.tools.doctornri): which route each engine uses, and whether a
missing daemon refuses containers or lets them start unadjusted.

containerd's NRI table is read from containerd's own ``config dump`` of Debian 13's 1.7 and Debian
unstable's 2.1 (tests/live/debcache.py fetches them once): 1.7 has NRI off unless ``disable =
false``, 2.x on; neither knows the default validator, so a ``required_plugins`` written for 2.2
refuses nothing there, and the doctor must not say it does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hook.tools.checks import Check
from hook.tools.doctornri import (
    TOLERATE,
    View,
    containerd_doc,
    containerd_view,
    crio_view,
    daemon_pids,
    judge,
    version_of,
)

NAME, SOCKET = "oci-device-hook", "/var/run/nri/nri.sock"
VALIDATOR = (
    '[plugins."io.containerd.nri.v1.nri".default_validator]\n  enable = true\n'
    f'  required_plugins = ["{NAME}"]\n  tolerate_missing_plugins_annotation = "{TOLERATE}"\n'
)


def _containerd(suite: str) -> tuple[str, tuple[int, ...]]:
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt-get to fetch Debian's containerd")
    from tests.live.debcache import containerd_tree

    tree, version = containerd_tree(suite)
    return str(tree / "usr/bin/containerd"), version_of(version)


@pytest.mark.parametrize(
    ("suite", "nri", "enabled"),
    [("trixie", "", False), ("trixie", "disable = false\n", True), ("sid", "", True),
     ("sid", "disable = true\n", False)],
)  # fmt: skip
def test_containerd_nri_is_read_from_containerds_own_dump(
    tmp_path: Path, suite: str, nri: str, enabled: bool
) -> None:
    binary, version = _containerd(suite)
    config = tmp_path / "config.toml"
    table = f'[plugins."io.containerd.nri.v1.nri"]\n{nri}  socket_path = "/run/x/nri.sock"\n' if nri else ""
    config.write_text(f'version = 2\nroot = "{tmp_path}/root"\n{table}')
    view = containerd_view(containerd_doc(binary, config), version)
    assert (view.enabled, view.required) == (enabled, ())
    assert view.socket == ("/run/x/nri.sock" if nri else SOCKET)


@pytest.mark.parametrize("suite", ["trixie", "sid"])
def test_required_plugins_refuse_nothing_before_containerd_2_2(tmp_path: Path, suite: str) -> None:
    """Written for 2.2, read by 1.7 and 2.1: no validator there, so a missing daemon lets containers
    start unadjusted, and the doctor says so (a warning, with the upgrade as the fix)."""
    binary, version = _containerd(suite)
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nroot = "{tmp_path}/root"\n'
                      '[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n' + VALIDATOR)  # fmt: skip
    view = containerd_view(containerd_doc(binary, config), version)
    assert view.required == ()
    lines = judge(view, NAME, SOCKET, [4242], other_route=False)
    assert [c.name for c in lines] == ["route (containerd)", "missing daemon (containerd)"]
    assert lines[1].warn and "start unadjusted" in lines[1].detail
    assert "upgrade to containerd >= 2.2" in lines[1].fix


def test_containerd_2_2s_validator_refuses_and_tolerates_the_daemons_own_pod() -> None:
    validator = {"enable": True, "required_plugins": [NAME], "tolerate_missing_plugins_annotation": TOLERATE}
    nri = {"disable": False, "socket_path": SOCKET, "default_validator": validator}
    doc = {"plugins": {"io.containerd.nri.v1.nri": nri}}
    view = containerd_view(doc, (2, 2, 7))
    assert view.required == (NAME,)
    assert containerd_view(doc, (2, 1, 9)).required == ()  # the same file before the validator existed
    route, missing = judge(view, NAME, SOCKET, [], other_route=False)
    assert not route.ok and "not running" in route.detail  # required but absent: containers are refused now
    assert missing.ok and not missing.warn and "refuses containers" in missing.detail
    assert TOLERATE in missing.detail


def test_a_required_plugin_without_a_toleration_key_warns_that_the_daemon_cannot_come_back() -> None:
    view = View("containerd", (2, 2, 0), True, SOCKET, (NAME,), "")
    _, missing = judge(view, NAME, SOCKET, [7], other_route=False)
    assert missing.warn and "cannot start while it is missing" in missing.detail


def test_a_validator_that_is_not_enabled_requires_nothing() -> None:
    doc = {"plugins": {"io.containerd.nri.v1.nri": {"default_validator": {"required_plugins": [NAME]}}}}
    assert containerd_view(doc, (2, 2, 0)).required == ()


def test_a_daemon_the_engine_never_asks_fails() -> None:
    view = containerd_view({}, (1, 7, 24))  # 1.7's default: NRI off
    (route,) = judge(view, NAME, SOCKET, [99], other_route=True)
    assert not route.ok and "NRI is off" in route.detail and "disable = false" in route.fix


def test_a_daemon_on_another_socket_fails() -> None:
    view = View("containerd", (2, 1, 9), True, "/run/containerd/nri.sock")
    (route,) = judge(view, NAME, SOCKET, [99], other_route=False)
    assert not route.ok and "/run/containerd/nri.sock" in route.detail
    assert judge(View("containerd", (2, 1, 9), True, "/run/nri/nri.sock"), NAME, SOCKET, [9], False)[0].ok


def test_the_wrapper_beside_nri_is_the_fail_closed_backstop() -> None:
    view = View("containerd", (2, 1, 9), True, SOCKET)
    route, missing = judge(view, NAME, SOCKET, [5], other_route=True)
    assert route.ok and "decided twice" in route.detail
    assert missing.ok and not missing.warn and "fail-closed" in missing.detail


def test_no_daemon_and_nothing_required_is_not_the_nri_route() -> None:
    lines = judge(View("containerd", (2, 1, 9), True, SOCKET), NAME, SOCKET, [], other_route=True)
    assert lines == [Check("route (containerd)", True, "containerd 2.1.9: the runtime wrapper (no `hook nri` "
                           "daemon runs and none is required)")]  # fmt: skip


def test_crio_1_34_refuses_and_1_33_does_not() -> None:
    doc = {"crio": {"nri": {"enable_nri": True, "default_validator": {
        "nri_enable_default_validator": True, "nri_validator_required_plugins": [NAME],
        "nri_validator_tolerate_missing_plugins_annotation": TOLERATE}}}}  # fmt: skip
    assert crio_view(doc, (1, 34, 0)).required == (NAME,)
    assert crio_view(doc, (1, 33, 2)).required == ()
    assert crio_view({}, (1, 30, 0)).enabled and not crio_view({}, (1, 29, 0)).enabled
    _, missing = judge(crio_view(doc, (1, 34, 0)), NAME, SOCKET, [1], other_route=False)
    assert "refuses containers" in missing.detail


def test_daemon_pids_finds_hook_nri_by_its_command_line(tmp_path: Path) -> None:
    for pid, argv in ((10, ["/usr/libexec/oci-device-hook/hook", "nri", "--config", "c"]),
                      (11, ["python3", "-m", "hook", "nri"]), (12, ["hook", "serve"]),
                      (13, ["/usr/bin/nri-hook", "x"]), (14, ["sh", "-c", "hook nri"])):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    assert daemon_pids(tmp_path) == [10, 11]
    assert os.getpid() not in daemon_pids(Path("/proc"))
