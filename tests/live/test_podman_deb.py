"""Live: build the .deb, dpkg -i it, narrow a privileged podman container (seed 000), dpkg -r/-P it.

Rule: everything happens on this host for real (dpkg, podman, runc, cgroups, mount namespaces),
but nothing outside the test's temporary directory is left behind: podman uses a private
storage root, the fake GPUs live on a tmpfs /dev inside ``unshare -m``, and the package is
purged at the end even when a test fails. Concurrent runs on one machine take turns (a lock
file in /tmp); a package found installed before the run fails the tests with that message: this
test never removes an install it did not make. Needs root, podman, runc, dpkg and busybox.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosttree import make_host_tree
from tests.live.livekit import BASIC_DEV

REPO = Path(__file__).resolve().parents[2]
PKG = "oci-device-hook"
LOCK = Path("/tmp/oci-device-hook-deb-test.lock")
RUN_EXISTED_BEFORE = False
HOOK = Path("/usr/libexec/oci-device-hook/hook")
HOOKS_JSON = Path("/usr/share/containers/oci/hooks.d/oci-device-hook.json")
CONFFILES = (Path("/etc/oci-device-hook/config.yaml"), Path("/etc/logrotate.d/oci-device-hook"))
SLICE_UUID = "GPU-a158631e-3c5d-6f1e-9b2a-7d4c8e0f1a23"  # seed 000: the sliced pod's card
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), "")
GPU_NODES = [f"/dev/nvidia{i}" for i in range(8)]
ERRNO = {"No such device or address": "ENXIO", "Operation not permitted": "EPERM", "No such file": "ENOENT"}


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("podman", "runc", "dpkg", "dpkg-deb", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not BUSYBOX:
        return "busybox-static not installed"
    if not (REPO / "hook/entry.py").exists():
        return "hook/entry.py not written yet"
    return ""


def _installed_on_host() -> bool:
    return subprocess.run(["dpkg", "-s", PKG], capture_output=True).returncode == 0


pytestmark = [pytest.mark.skipif(bool(_missing()), reason=_missing() or "ok"), pytest.mark.installs_package]


def _sh(*cmd: str, timeout: int = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory):
    """Build and install the package; purge it afterwards whatever happened. Yields dpkg -L."""
    with _one_at_a_time():
        yield from _install_and_purge(tmp_path_factory)


@contextlib.contextmanager
def _one_at_a_time(timeout: float = 900) -> Iterator[None]:
    """Other sessions on this machine may run this module too: one package install at a time."""
    with open(LOCK, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another run held {LOCK} for {timeout:.0f} s; not installing over it")
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _install_and_purge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    deadline = time.monotonic() + 600  # a run of an older copy of this test (no lock) purges soon
    while _installed_on_host() and time.monotonic() < deadline:
        time.sleep(5)
    if _installed_on_host():
        pytest.fail(
            f"precondition broken: {PKG} is already installed on this host (an earlier run killed "
            f"before its cleanup, or an operator's install); not touching it. `dpkg -P {PKG}` and rerun."
        )
    global RUN_EXISTED_BEFORE
    RUN_EXISTED_BEFORE = Path("/run/oci-device-hook").exists()
    out = tmp_path_factory.mktemp("deb")
    deb = _sh(str(REPO / "packaging/build-deb"), str(out), timeout=600).stdout.strip().splitlines()[-1]
    env = {**os.environ, "OCI_DEVICE_HOOK_SKIP_DOCTOR": "1", "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["dpkg", "-i", deb], capture_output=True, text=True, env=env, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        files = [Path(p) for p in _sh("dpkg", "-L", PKG).stdout.split()]
        yield files
    finally:
        purge = subprocess.run(["dpkg", "-P", PKG], capture_output=True, text=True, timeout=300)
        assert not _installed_on_host(), f"dpkg -P {PKG} left it installed: {purge.stderr}"


@pytest.fixture(scope="module")
def world(installed: list[Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fake driver root (seed 000 topology), busybox rootfs, podman storage, hook settings."""
    base = tmp_path_factory.mktemp("world")
    driver = base / "driver"
    make_host_tree(driver, "8x-mig", mknod=True)
    rootfs = base / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(BUSYBOX, rootfs / "bin/busybox")
    (rootfs / "bin/sh").symlink_to("busybox")
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (rootfs / "etc/group").write_text("root:x:0:\n")
    (base / "cdi").mkdir()
    config = base / "config.yaml"
    config.write_text(f"log_file: {base / 'hook.log'}\ncache_dir: {base / 'cache'}\n")
    return {"base": base, "driver": driver, "rootfs": rootfs, "config": config, "log": base / "hook.log"}


def _hooks_dir(world: dict[str, Path], name: str, extra_args: list[str]) -> Path:
    """A hooks dir holding the installed hooks.d file, its args extended for the fake host."""
    doc = json.loads(HOOKS_JSON.read_text())
    doc["hook"]["args"] += extra_args
    hooks = world["base"] / name
    hooks.mkdir(exist_ok=True)
    (hooks / HOOKS_JSON.name).write_text(json.dumps(doc))
    return hooks


PROBE = " ".join([*GPU_NODES, "/dev/nvidiactl"])
CONTAINER_SCRIPT = (
    f'for n in {PROBE}; do if [ -e $n ]; then echo "$n $(cat $n 2>&1 >/dev/null)"; '
    'else echo "$n ENOENT"; fi; done'
)


def _podman_in_fake_dev(world: dict[str, Path], hooks: Path, podman_args: list[str]) -> str:
    """Run podman inside a private mount namespace whose /dev holds the fake GPUs."""
    base = world["base"]
    podman = [
        "podman", "--runtime", "runc", "--root", str(base / "storage"), "--runroot", str(base / "run"),
        "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
        "--hooks-dir", str(hooks), "run", "--rm", "--network", "none",
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", *podman_args,
        "--rootfs", str(world["rootfs"]), "/bin/sh", "-c", CONTAINER_SCRIPT,  # --rootfs is a flag; last
    ]  # fmt: skip
    script = base / "in-namespace.sh"
    script.write_text(
        f"set -eu\nmount -t tmpfs -o mode=0755,nosuid tmpfs /dev\ncp -a {world['driver']}/dev/. /dev/\n"
        + BASIC_DEV
        + 'exec "$@"\n'
    )
    proc = _sh(
        "unshare", "-m", "--propagation", "private", "sh", str(script), *podman, timeout=180, check=False
    )
    assert proc.returncode == 0, f"podman exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _access(stdout: str) -> dict[str, str]:
    """Container path → ENXIO / EPERM / ENOENT / OK from the probe script's lines."""
    result = {}
    for line in stdout.splitlines():
        path, _, message = line.partition(" ")
        if path.startswith("/dev/"):
            result[path] = next((e for text, e in ERRNO.items() if text in message), message or "OK")
    return result


SLICE_ARGS = [
    "--privileged",
    "--env", f"NVIDIA_VISIBLE_DEVICES={SLICE_UUID}",
    "--env", "CUDA_DEVICE_MEMORY_LIMIT_0=40779m",
]  # fmt: skip


def test_install_places_every_file(installed: list[Path]) -> None:
    for path in (HOOK, HOOKS_JSON, *CONFFILES, Path("/usr/libexec/oci-device-hook/lib/hook/entry.py")):
        assert path in installed and path.exists(), path
    assert os.access(HOOK, os.X_OK)
    assert HOOKS_JSON.read_text() == (REPO / "nvidia-hook.json").read_text()


def test_installed_launcher_runs_doctor(installed: list[Path]) -> None:
    proc = subprocess.run([str(HOOK), "doctor", "--format", "json"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    names = {c["name"] for c in json.loads(proc.stdout)}
    assert {"driver", "hooks.d", "settings"} <= names


def test_without_the_hook_a_privileged_container_sees_every_gpu(world: dict[str, Path]) -> None:
    """The control run: proves the probe can tell allowed (ENXIO) from narrowed."""
    empty = world["base"] / "no-hooks"
    empty.mkdir(exist_ok=True)
    access = _access(_podman_in_fake_dev(world, empty, SLICE_ARGS))
    assert [access[n] for n in GPU_NODES] == ["ENXIO"] * 8, access


def test_privileged_slice_is_narrowed_to_its_card(world: dict[str, Path]) -> None:
    args = ["--driver-root", str(world["driver"]), "--cdi-spec-dir", str(world["base"] / "cdi"),
            "--config", str(world["config"])]  # fmt: skip
    hooks = _hooks_dir(world, "hooks-slice", args)
    access = _access(_podman_in_fake_dev(world, hooks, SLICE_ARGS))
    assert access["/dev/nvidia1"] == "ENXIO", access  # its card: reaches the (absent) driver
    for node in GPU_NODES:
        if node != "/dev/nvidia1":
            assert access[node] in ("EPERM", "ENOENT"), (node, access)
    assert access["/dev/nvidiactl"] == "ENXIO", access  # control node stays usable
    record = json.loads(world["log"].read_text().splitlines()[-1])
    assert record["verdict"] == "apply"
    assert record["container"]["privileged"] is True


def test_unprivileged_plain_container_starts_with_the_installed_registration(
    world: dict[str, Path],
) -> None:
    access = _access(_podman_in_fake_dev(world, HOOKS_JSON.parent, []))
    assert all(access[n] == "ENOENT" for n in GPU_NODES), access


def test_remove_then_purge_deletes_every_file(installed: list[Path]) -> None:
    _sh("dpkg", "-r", PKG, timeout=300)
    files = [p for p in installed if not p.is_dir() or str(p).startswith("/usr/libexec/oci-device-hook")]
    left = [p for p in files if p.exists() and p not in CONFFILES]
    assert left == []
    assert not Path("/usr/libexec/oci-device-hook").exists()
    assert all(p.exists() for p in CONFFILES)  # dpkg -r keeps conffiles
    _sh("dpkg", "-P", PKG, timeout=300)
    assert not any(p.exists() for p in CONFFILES)
    assert not Path("/etc/oci-device-hook").exists()
    # /run/oci-device-hook is the package's only if it was not there before (a hook run elsewhere)
    assert RUN_EXISTED_BEFORE or not Path("/run/oci-device-hook").exists()
