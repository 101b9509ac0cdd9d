"""Issue 11, items 1 and 2, on real runc containers: the hook never edits the host's /dev and never
writes for a pid that is not a container's.

Item 1 stands the host's /dev in with a tmpfs of fake nodes mounted over ``<driver-root>/dev``
inside a private mount namespace (never the machine's /dev): the container binds it at /dev, once
by that path (config.json says so: ``hook.core.hostdev``) and once through a second bind of the same
tmpfs that no config text reveals (``devnodes`` sees the same ``st_dev``). Item 2 hands the
hook a state whose pid is a host process, or a process in a root cgroup, and checks that no cgroup
file and no node under ``<bundle>/rootfs/dev`` changed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live.isolation import isolated_script, listing, run_isolated
from tests.live.livekit import Bundle, parse_probe
from tests.live.test_hook_scenarios import slice_pod, the_hook

V1_DEVICES = Path("/sys/fs/cgroup/devices")


PROBES = ["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia7", "/dev/nvidia-caps/nvidia-cap2", "/tmp/n0"]


def host_dev_bundle(bundle_dir: Path, host: dict[str, Path], source: Path) -> Bundle:
    """The slice pod with ``source`` bind-mounted at /dev (a hostPath: /dev volume)."""
    b = slice_pod(bundle_dir, host, PROBES)
    mounts = [m for m in b.config["mounts"] if not m["destination"].startswith("/dev")]
    mounts.insert(
        1, {"destination": "/dev", "type": "bind", "source": str(source), "options": ["rbind", "rw"]}
    )
    b.config["mounts"] = mounts
    return b.write()


def fake_host_dev(host: dict[str, Path], tmp: Path) -> list[str]:
    """Setup lines: a tmpfs with the fake host's nodes over ``<driver-root>/dev`` (in the namespace)."""
    dev, copy = host["root"] / "dev", tmp / "dev-copy"
    return [
        f"cp -a {dev} {copy}",
        f"mount -t tmpfs -o mode=755 tmpfs {dev}",
        f"cp -a {copy}/. {dev}/",
        f"mknod -m 666 {dev}/null c 1 3",
        f"mknod -m 666 {dev}/zero c 1 5",
    ]


@pytest.mark.parametrize(
    ("via", "cgroup2"),
    [("config", False), ("config", True), ("alias", False)],
    ids=["named-in-config-v1", "named-in-config-v2", "second-bind-st_dev-v1"],
)
def test_host_dev_bind_is_narrowed_by_cgroup_only(
    tmp_path: Path,
    bundle_dir: Path,
    host: dict[str, Path],
    via: str,
    cgroup2: bool,
) -> None:
    dev = host["root"] / "dev"
    alias = tmp_path / "alias"
    alias.mkdir()
    setup = fake_host_dev(host, tmp_path)
    if via == "alias":
        setup.append(f"mount --bind {dev} {alias}")
    b = host_dev_bundle(bundle_dir, host, dev if via == "config" else alias)
    before, after = tmp_path / "before", tmp_path / "after"
    res = run_isolated(b, setup=[*setup, listing(dev, before)], after=[listing(dev, after)], cgroup2=cgroup2)
    assert res.rc == 0, res.stderr
    assert "nvidia0 character special file" in before.read_text()
    assert after.read_text() == before.read_text()  # every fake host node survived, nothing added
    assert parse_probe(res.stdout) == {
        "/dev/nvidia1": "ENXIO",  # the allocated card
        "/dev/nvidia0": "EPERM",  # still there (the host's), but denied by the cgroup
        "/dev/nvidia7": "EPERM",
        "/dev/nvidia-caps/nvidia-cap2": "EPERM",
        "/tmp/n0": "EPERM",
    }
    record = json.loads(host["log"].read_text().splitlines()[-1])
    assert record["verdict"] == "apply"
    if via == "config":  # the decision knew: nothing planned to remove, and the warning says why
        assert record["nodes"]["remove"] == []
        assert any("is the host's /dev" in w and "cgroup-only" in w for w in record["warnings"])
    else:  # only the adapter could tell: it skipped every removal
        assert record["nodes"]["remove"]
        assert all(p in " ".join(record["warnings"]) for p in record["nodes"]["remove"])
        assert "host filesystem" in " ".join(record["warnings"])


def test_reject_refuses_a_host_dev_pod(tmp_path: Path, bundle_dir: Path, host: dict[str, Path]) -> None:
    dev = host["root"] / "dev"
    host["settings"].write_text(host["settings"].read_text() + "privileged_allocation: reject\n")
    b = host_dev_bundle(bundle_dir, host, dev)
    before, after = tmp_path / "before", tmp_path / "after"
    res = run_isolated(
        b, setup=[*fake_host_dev(host, tmp_path), listing(dev, before)], after=[listing(dev, after)]
    )
    assert res.rc != 0 and "policy: reject" in res.stderr
    assert "PROBE" not in res.stdout
    assert after.read_text() == before.read_text()


# ---- item 2: the pid in the state must be a container's ----------------------------------------

DRIVER = """
import json, os, subprocess, sys, time
cfg = json.loads(sys.argv[1])
sleeper = subprocess.Popen(cfg["sleeper"])
for _ in range(200):  # until unshare(1) has exec'd sleep in its new namespace
    if os.readlink(f"/proc/{sleeper.pid}/exe").endswith("sleep"):
        break
    time.sleep(0.01)
if cfg["cgroup"]:
    with open(cfg["cgroup"] + "/cgroup.procs", "w") as f:
        f.write(str(sleeper.pid))
for path in cfg["mask"]:
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", path], check=True)
state = {"ociVersion": "1.0.2", "id": "odh-pid-test", "status": "created", "pid": sleeper.pid,
         "bundle": cfg["bundle"]}
try:
    res = subprocess.run(cfg["hook"], input=json.dumps(state).encode(), capture_output=True, timeout=60)
finally:
    sleeper.kill()
    sleeper.wait()
print(json.dumps({"rc": res.returncode, "stderr": res.stderr.decode(errors="replace")}))
"""


@pytest.fixture
def scratch_v1() -> Iterator[Path]:
    """A default-deny v1 devices cgroup listing each fake node: any deny written shows in devices.list."""
    if not (V1_DEVICES / "devices.list").exists():
        pytest.skip("needs a cgroup v1 devices hierarchy")
    cg = V1_DEVICES / f"odh-pid-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    (cg / "devices.deny").write_text("a")
    for major, minors in ((195, [*range(8), 255]), (237, range(64)), (511, range(2))):
        for minor in minors:  # exact entries: a deny of any of them shows as a missing line
            (cg / "devices.allow").write_text(f"c {major}:{minor} rwm")
    yield cg
    for _ in range(50):
        try:
            cg.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def rootfs_dev_bundle(bundle_dir: Path, host: dict[str, Path], cgroups_path: str) -> Bundle:
    """The slice pod, never started: its rootfs/dev holds the nodes a wrong pid would have edited."""
    b = slice_pod(bundle_dir, host)
    b.config["linux"]["cgroupsPath"] = cgroups_path
    for d in b.config["linux"]["devices"]:
        path = b.rootfs / d["path"].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(d["major"], d["minor"]))
    return b.write()


def tree(path: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(path)), p.lstat().st_rdev) for p in path.rglob("*"))


def run_hook_with_pid(
    b: Bundle,
    host: dict[str, Path],
    *,
    sleeper: list[str],
    cgroup: Path | None,
    mask: tuple[Path, ...] = (),
) -> dict[str, object]:
    """Run the hook (in its own namespace with private /run) for a state naming a sleeper's pid."""
    cfg = {
        "sleeper": sleeper,
        "cgroup": str(cgroup) if cgroup else "",
        "mask": [str(m) for m in mask],
        "bundle": str(b.path),
        "hook": the_hook(host)["prestart"][0]["args"],
    }
    inner = " ".join(["exec", sys.executable, "-I", "-c", _q(DRIVER), _q(json.dumps(cfg))])
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", isolated_script([], inner)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def assert_refused_untouched(
    result: dict[str, object], b: Bundle, dev_before: list[tuple[str, int]], why: str
) -> None:
    stderr = str(result["stderr"])
    assert result["rc"] == 1, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "pid" in stderr and why in stderr, stderr
    assert tree(b.rootfs / "dev") == dev_before  # no node removed or created under <bundle>/rootfs/dev


def test_host_process_pid_is_refused_nothing_written(
    bundle_dir: Path,
    host: dict[str, Path],
    scratch_v1: Path,
) -> None:
    """A sleep in a scratch cgroup that even matches cgroupsPath, but in the hook's mount namespace."""
    b = rootfs_dev_bundle(bundle_dir, host, f"/{scratch_v1.name}")
    dev_before, list_before = tree(b.rootfs / "dev"), (scratch_v1 / "devices.list").read_text()
    result = run_hook_with_pid(b, host, sleeper=["sleep", "60"], cgroup=scratch_v1)
    assert_refused_untouched(result, b, dev_before, "mount namespace")
    assert (scratch_v1 / "devices.list").read_text() == list_before


def test_pid_outside_cgroups_path_is_refused(
    bundle_dir: Path,
    host: dict[str, Path],
    scratch_v1: Path,
) -> None:
    """Another mount namespace, but a cgroup that is not the config's linux.cgroupsPath."""
    b = rootfs_dev_bundle(bundle_dir, host, f"/odh-live/not-{scratch_v1.name}")
    dev_before, list_before = tree(b.rootfs / "dev"), (scratch_v1 / "devices.list").read_text()
    sleeper = ["unshare", "-m", "sleep", "60"]
    result = run_hook_with_pid(b, host, sleeper=sleeper, cgroup=scratch_v1)
    assert_refused_untouched(result, b, dev_before, "linux.cgroupsPath")
    assert (scratch_v1 / "devices.list").read_text() == list_before


def test_pid_in_root_cgroup_is_refused(bundle_dir: Path, host: dict[str, Path]) -> None:
    """A process of another mount namespace in the root devices cgroup. Once it is there, the
    hook's namespace gets a tmpfs over /sys/fs/cgroup/devices, so even a regression could not
    write to the machine's real root cgroup (it would fail on a missing mount instead)."""
    if not (V1_DEVICES / "devices.list").exists():
        pytest.skip("needs a cgroup v1 devices hierarchy")
    b = rootfs_dev_bundle(bundle_dir, host, "")
    dev_before = tree(b.rootfs / "dev")
    result = run_hook_with_pid(
        b, host, sleeper=["unshare", "-m", "sleep", "60"], cgroup=V1_DEVICES, mask=(V1_DEVICES,)
    )
    assert_refused_untouched(result, b, dev_before, "root cgroup")
    assert (V1_DEVICES / "devices.list").read_text() == "a *:* rwm\n"
