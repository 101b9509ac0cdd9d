"""``hook nri`` narrowing real runc containers at StartContainer and at Synchronize, and refusing every
pid a peer posing as the runtime names that is not the container's (issue 34 items 3, 4, 5).

Each case runs ``tests/live/nristart.py`` inside ``livekit.private_host`` (private /dev with fake
GPUs, /run, /var/log; the device cgroup root is a scratch cgroup): containers are created with runc
(init waits at the exec fifo, as at NRI's StartContainer), the daemon runs in a thread there, and the
containers are started afterwards to probe their nodes: ENXIO = allowed, EPERM = the cgroup denies,
ENOENT = removed from the container's /dev."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.live.livekit import REPO, private_host

NARROWED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENOENT", "/dev/nvidia7": "ENOENT", "/tmp/n0": "EPERM"}
UNTOUCHED = {"/dev/nvidia1": "ENXIO", "/dev/nvidia0": "ENXIO", "/dev/nvidia7": "ENXIO", "/tmp/n0": "ENXIO"}
CGROUPS = pytest.mark.parametrize("cgroup2", [False, True], ids=["cgroup-v1", "cgroup-v2-ebpf"])


def drive(tmp_path: Path, case: str, cgroup2: bool) -> dict[str, Any]:
    cmd = private_host(
        [str(REPO / ".venv/bin/python"), "-m", "tests.live.nristart", str(tmp_path), case], cgroup2=cgroup2
    )
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


@CGROUPS
def test_start_narrows_the_privileged_container_to_its_allocation_before_it_runs(
    tmp_path: Path, cgroup2: bool
) -> None:
    out = drive(tmp_path, "narrow", cgroup2)
    assert out["create"] == [0, ""] and out["start"] == [0, ""]
    assert out["a"] == NARROWED
    assert out["forks"] == 0  # the nodes were removed from a thread in the container's namespace
    assert out["decisions"] == 1  # start's config (bounding read from the process) is create's: reused
    create, start = out["records"]
    assert (create["stage"], start["stage"]) == ("create", "start")
    assert start["route"] == "nri" and start["cgroup_version"] == (2 if cgroup2 else 1)
    assert start["namespaces"].startswith("the daemon's")


@CGROUPS
def test_a_peer_posing_as_the_runtime_gets_no_pid_that_is_not_the_containers(
    tmp_path: Path, cgroup2: bool
) -> None:
    out = drive(tmp_path, "attack", cgroup2)
    for name, (code, message) in out["attack"].items():
        assert code == 9 and message.startswith("oci-device-hook: NRI StartContainer: "), name
    why = {name: message for name, (_, message) in out["attack"].items()}
    assert "the daemon itself" in why["daemon-pid"] and "init" in why["init"]
    assert "is not linux.cgroupsPath" in why["other-container-pid"]
    assert "does not name container" in why["other-container-pid-and-cgroup"]
    assert "root cgroup" in why["wrong-cgroup"] and "No such process" in why["no-such-pid"]
    assert "shares the mount namespace of the daemon" in why["daemon-namespace-in-the-cgroup"]
    assert out["a"] == UNTOUCHED and out["b"] == UNTOUCHED  # nothing was written anywhere
    assert {r["verdict"] for r in out["records"]} == {"error"}


@CGROUPS
def test_synchronize_narrows_a_container_started_while_the_daemon_was_away(
    tmp_path: Path, cgroup2: bool
) -> None:
    out = drive(tmp_path, "late", cgroup2)
    assert out["sync"] == 0 and out["late_seconds"] < 10
    assert out["a"] == NARROWED and out["forks"] == 0
    (rec,) = out["records"]
    assert rec["late"] is True and rec["stage"] == "synchronize" and rec["verdict"] == "apply"
    assert "late: narrowed container" in out["stderr"]


def test_management_caps_need_cap_sys_admin_read_from_the_started_process(tmp_path: Path) -> None:
    """NRI carries no capabilities: create answers as if CAP_SYS_ADMIN were there, start reads the
    process's bounding set and refuses the container whose set lacks it, with the routes' line."""
    out = drive(tmp_path, "caps", cgroup2=False)
    assert out["without"]["create"][0] == 0 and out["with"]["create"][0] == 0
    code, message = out["without"]["start"]
    assert code == 7 and message.startswith(
        "oci-device-hook: deny: NVIDIA_MIG_CONFIG_DEVICES=all needs CAP_SYS_ADMIN"
    )
    assert out["with"]["start"] == [0, ""]
    assert out["decisions"] == 3  # "without" decided again at start (its bounding differs), "with" not


@CGROUPS
def test_a_restarted_daemon_applies_again_but_counts_no_late_narrowing(tmp_path: Path, cgroup2: bool) -> None:
    """A new daemon has no memory: Synchronize lists a container its previous run narrowed. It is
    narrowed again (idempotent: v2 finds its own program, v1's nodes are gone) and its record says
    ``already_narrowed``, not ``late``, so the late counter counts only what started unnarrowed."""
    out = drive(tmp_path, "restart", cgroup2)
    assert out["a"] == NARROWED
    first, second = out["records"]
    assert first["late"] is True and "already_narrowed" not in first
    assert "late" not in second and second["already_narrowed"] is True and second["verdict"] == "apply"
    assert out["stderr"].count("late: narrowed container") == 1
