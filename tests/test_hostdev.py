"""Issue 11 item 1, the decision's half: a container whose /dev (or /dev/nvidia-caps, or one node) is a
bind of the host's is narrowed by the cgroup alone, says so in ``warnings``, and ``reject`` refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hook.core.hostdev import host_dev_roots, shared_mount
from hook.core.oci import Mount
from tests.bundles import SLICE_UUID, config, deny_keys, host_devices
from tests.test_decide import GPU, HAMI, decide_for


def bind(dest: str, source: str, *, kind: str = "bind", options: tuple[str, ...] = ("rbind",)) -> Mount:
    return Mount(destination=dest, source=source, type=kind, options=options)


TMPFS_DEV = Mount(destination="/dev", source="tmpfs", type="tmpfs", options=("nosuid",))


@pytest.mark.parametrize(
    ("mounts", "path", "index"),
    [
        ((TMPFS_DEV,), "/dev/nvidia0", None),  # runc's own tmpfs: the container's alone
        ((TMPFS_DEV, bind("/dev", "/dev")), "/dev/nvidia0", 1),  # hostPath: /dev
        ((TMPFS_DEV, bind("/dev/", "/dev/", kind="none")), "/dev/nvidia0", 1),  # options say bind
        ((TMPFS_DEV, bind("/dev/nvidia-caps", "/dev/nvidia-caps")), "/dev/nvidia-caps/nvidia-cap2", 1),
        ((TMPFS_DEV, bind("/dev/nvidia-caps", "/dev/nvidia-caps")), "/dev/nvidia0", None),
        ((TMPFS_DEV, bind("/dev/nvidia3", "/dev/nvidia3")), "/dev/nvidia3", 1),  # one node
        ((TMPFS_DEV, bind("/dev/nvidia3", "/dev/nvidia3")), "/dev/nvidia30", None),  # not a prefix match
        ((bind("/dev", "/dev"), TMPFS_DEV), "/dev/nvidia0", None),  # a later tmpfs covers the bind
        ((TMPFS_DEV, bind("/dev", "/run/drv/dev")), "/dev/nvidia0", 1),  # <driver-root>/dev
        ((TMPFS_DEV, bind("/dev", "/devices")), "/dev/nvidia0", None),  # /devices is not /dev
        ((TMPFS_DEV, bind("/dev", "/var/lib/x/dev")), "/dev/nvidia0", None),
        ((TMPFS_DEV, Mount(destination="/dev", source="udev", type="devtmpfs", options=())), "/dev/x", 1),
        ((TMPFS_DEV, bind("/dev", "/dev", kind="tmpfs", options=())), "/dev/nvidia0", None),  # not a bind
    ],
)
def test_shared_mount(mounts: tuple[Mount, ...], path: str, index: int | None) -> None:
    found = shared_mount(mounts, path, host_dev_roots("/run/drv"))
    assert (found[0] if found else None) == index


def test_host_dev_roots() -> None:
    assert host_dev_roots("/") == ("/dev",)
    assert host_dev_roots("/run/nvidia/driver") == ("/dev", "/run/nvidia/driver/dev")


def slice_pod(mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return config(
        [f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}", *HAMI],
        privileged=True,
        devices=host_devices(),
        mounts=mounts,
    )


HOST_DEV = {"destination": "/dev", "type": "bind", "source": "/dev", "options": ["rbind", "rw"]}
HOST_CAPS = {
    "destination": "/dev/nvidia-caps",
    "type": "bind",
    "source": "/dev/nvidia-caps",
    "options": ["rbind"],
}


def test_host_dev_pod_is_narrowed_by_cgroup_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, rep, _ = decide_for(tmp_path, slice_pod([HOST_DEV]), capsys)
    assert rep["verdict"] == "apply"
    assert GPU[0] in deny_keys(rep) and GPU[1] not in deny_keys(rep)  # the cgroup still narrows
    assert rep["nodes"] == {"create": [], "remove": []}  # but no node of the host's /dev is touched
    assert any("mounts[" in w and "is the host's /dev" in w and "cgroup-only" in w for w in rep["warnings"])


def test_host_caps_bind_keeps_caps_removes_cards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, rep, _ = decide_for(tmp_path, slice_pod([HOST_CAPS]), capsys)
    removed = rep["nodes"]["remove"]
    assert "/dev/nvidia0" in removed  # the container's own tmpfs /dev: removed as before
    assert not [p for p in removed if p.startswith("/dev/nvidia-caps/")]
    assert any("/dev/nvidia-caps is the host's /dev" in w for w in rep["warnings"])


def test_without_host_mount_nothing_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, rep, _ = decide_for(tmp_path, slice_pod([]), capsys)
    assert "/dev/nvidia0" in rep["nodes"]["remove"]
    assert not any("host's /dev" in w for w in rep["warnings"])


def test_reject_refuses_a_host_dev_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, rep, _ = decide_for(tmp_path, slice_pod([HOST_DEV]), capsys, privileged_allocation="reject")
    assert rc == 3 and rep["verdict"] == "deny"


def test_host_dev_warning_counts_the_node_changes_it_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24 (fresh mutant s530669-083, the count started at 1): the warning's number is the
    node changes the plan would have made in the container's own /dev."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "host").mkdir()
    _rc, plain, _ = decide_for(tmp_path / "plain", slice_pod([]), capsys)
    changes = len(plain["nodes"]["create"]) + len(plain["nodes"]["remove"])
    assert changes > 0
    _rc, rep, _ = decide_for(tmp_path / "host", slice_pod([HOST_DEV]), capsys)
    want = f"cgroup-only, {changes} node(s) left as they are"
    assert any(want in w for w in rep["warnings"]), rep["warnings"]


def test_no_mount_of_the_host_dev_no_path_is_looked_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 item 8: a privileged pod on a big node removes ~500 nodes; where no mount shows the
    host's /dev, none of their paths can be on one, and none is looked up (seen failing with the
    check removed). With such a mount each path is, as before."""
    from hook.core import decide

    calls: list[str] = []
    real = decide.shared_mount

    def counting(mounts: Any, path: str, *rest: Any) -> Any:
        calls.append(path)
        return real(mounts, path, *rest)

    monkeypatch.setattr(decide, "shared_mount", counting)
    tmpfs = {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}
    _rc, rep, _ = decide_for(tmp_path, slice_pod([tmpfs]), capsys)
    assert "/dev/nvidia0" in rep["nodes"]["remove"] and calls == []
    _rc, rep, _ = decide_for(tmp_path, slice_pod([tmpfs, HOST_CAPS]), capsys)
    assert "/dev/nvidia0" in calls and "/dev/nvidia0" in rep["nodes"]["remove"]
