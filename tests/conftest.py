"""Suite-wide host-safety guard (docs/testing.md, "Host safety").

Rule: the suite may only touch what it creates (temp dirs, scratch cgroups, private mount
namespaces). This guard checks the two things a regression could break on the machine itself:
the root device cgroup (v1) must still allow everything, and no ``nvidia*`` entry may appear in
or vanish from the host's ``/dev``. A broken precondition left by an earlier run is reported as
such once, at the start, instead of as a string of unrelated failures.

As root, the whole session runs in its own mount namespace (``private_run_and_log``): the hook's
cache dir ``/run/oci-device-hook``, ``/var/log`` and the node key's ``/var/lib/oci-device-hook``
are private tmpfs there, so nothing the suite
starts can write the host's, and what another process on the machine writes to the host's cannot
fail this run. The per-test guard watches the private copies: a change there is this session's.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT_DEVICES_LIST = Path("/sys/fs/cgroup/devices/devices.list")
HOST_CACHE_DIR = Path("/run/oci-device-hook")  # the hook's default cache dir on this machine
HOST_LOG = Path("/var/log/oci-device-hook.log")  # the hook's default log
HOST_KEY_DIR = Path("/var/lib/oci-device-hook")  # the node key's dir (hook.sources.nodekey.KEY_DIR)
HOST_OPT = Path("/opt")  # containerd's ``opt`` plugin makes /opt/containerd/{bin,lib} unless told a path
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 2


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _libc_call("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def _shadow_run() -> None:
    """A tmpfs over /run holding the host's /run entries (bind-mounted back: sockets, state dirs
    and symlinks keep working) except the hook's cache dir, which the host may or may not have."""
    hostrun = tempfile.mkdtemp(prefix="odh-hostrun-")
    try:
        _mount("/run", hostrun, None, MS_BIND | MS_REC)
        _mount("tmpfs", "/run", "tmpfs", 0, "mode=0755")
        for entry in os.scandir(hostrun):
            if entry.name == HOST_CACHE_DIR.name:
                continue
            dest = f"/run/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(entry.path), dest)
                continue
            if stat.S_ISDIR(mode):
                os.mkdir(dest, stat.S_IMODE(mode))
            else:
                Path(dest).touch(stat.S_IMODE(mode))
            _mount(entry.path, dest, None, MS_BIND | MS_REC)
    finally:
        _libc_call("umount2", hostrun.encode(), MNT_DETACH)
        os.rmdir(hostrun)


def private_run_and_log() -> bool:
    """Move this process into a private mount namespace whose /run/oci-device-hook and /var/log are
    its own (as root on Linux; False, and nothing changed, otherwise)."""
    if os.geteuid() != 0 or not Path("/proc/self/ns/mnt").exists():
        return False
    _libc_call("unshare", CLONE_NEWNS)
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    if HOST_CACHE_DIR.is_dir():
        _mount("tmpfs", str(HOST_CACHE_DIR), "tmpfs", 0, "mode=0700")  # empty, as a fresh node has it
    else:
        _shadow_run()
    if HOST_LOG.parent.is_dir():
        _mount("tmpfs", str(HOST_LOG.parent), "tmpfs", 0, "mode=0755")
    # the node key's dir (hook.sources.nodekey.KEY_DIR): a hook that writes a cache makes the key
    # there, so the session's is private; only the empty mount point is ever the host's
    HOST_KEY_DIR.mkdir(parents=True, exist_ok=True)
    _mount("tmpfs", str(HOST_KEY_DIR), "tmpfs", 0, "mode=0700")
    return True


def pytest_configure(config: pytest.Config) -> None:
    config.stash[PRIVATE_KEY] = private_run_and_log()


PRIVATE_KEY = pytest.StashKey[bool]()


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
    """The cache dir as names -> (mtime, size), None when absent."""
    try:
        return {p.name: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in HOST_CACHE_DIR.iterdir()}
    except FileNotFoundError:
        return None
    except OSError:
        return {}


@pytest.fixture(autouse=True)
def node_key_read_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node key is read once per process (``hook.sources.nodekey``); each test reads it again,
    so no test's key (or a fake file system's lack of one) leaks into the next."""
    from hook.sources import nodekey

    monkeypatch.setattr(nodekey, "_known", {})


@pytest.fixture(autouse=True)
def host_cache_untouched(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Every hook run of a test has a private /run (or its own cache dir) and a private /var/log (or
    its own log): the cache dir and default log are never written.

    Checked per test, so the one that wrote the session's cache dir or default log is named. As
    root these are the session's private copies (``private_run_and_log``): only this run's
    processes can change them, so another process writing the host's never fails a test here.
    """
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


def _host_opt() -> dict[str, tuple[int, int]]:
    """The host's /opt, two levels deep, as relative names -> (type bits, inode): a test that
    makes, removes or replaces an entry there is named (a regular containerd makes
    ``/opt/containerd/bin`` and ``lib``)."""
    found: dict[str, tuple[int, int]] = {}
    try:
        top = list(os.scandir(HOST_OPT))
    except OSError:
        return found
    for entry in top:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        found[entry.name] = (stat.S_IFMT(st.st_mode), st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            try:
                below = list(os.scandir(entry.path))
            except OSError:
                continue
            for sub in below:
                try:
                    sst = sub.stat(follow_symlinks=False)
                except OSError:
                    continue
                found[f"{entry.name}/{sub.name}"] = (stat.S_IFMT(sst.st_mode), sst.st_ino)
    return found


@pytest.fixture(autouse=True)
def host_opt_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    """No test makes, removes or replaces anything in the host's /opt (two levels deep), which the
    session's mount namespace shares with the host: a containerd a test starts gets a scratch
    ``opt`` path (``io.containerd.internal.v1.opt``), an installer a scratch ``--root``/``--libexec``."""
    before = _host_opt()
    yield
    after = _host_opt()
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(k for k in after.keys() & before.keys() if after[k] != before[k])
    assert not (added or removed or changed), (
        f"{request.node.nodeid} wrote the host's {HOST_OPT}: added {added}, removed {removed}, "
        f"replaced {changed} (give a containerd a scratch io.containerd.internal.v1.opt path)"
    )


@pytest.fixture(scope="session")
def built_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``packaging/build-deb`` run once per run (gzip: a quicker build of the same files), for
    every test that needs the real package (its contents, its install in a scratch root, the image).

    Under pytest-xdist each worker is a session of its own: the first worker to need the package
    builds it in the run's shared temp root under a lock, the others wait and read the same file
    (nothing writes to it), so a parallel run builds it once, as a serial one does."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _build_deb(tmp_path_factory.mktemp("deb"))
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the run's root, above every worker's basetemp
    with open(shared / "deb.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = shared / "deb" / "built"
        if made.is_file():
            return Path(made.read_text())
        (shared / "deb").mkdir(exist_ok=True)
        path = _build_deb(shared / "deb")
        made.write_text(str(path))
        return path


def _build_deb(out: Path) -> Path:
    env = {**os.environ, "DEB_COMPRESS": "gzip"}
    proc = subprocess.run([str(REPO / "packaging/build-deb"), str(out)], env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out
    return path
